"""sandbox.session.cow: what each mount of a Spec becomes in a Session's
copy-on-write tree, given the host's facts (no I/O: a HostView of data)."""

from __future__ import annotations

import pytest

import sandbox
from sandbox import Bind, Chmod, DevBind, Dir, File, Overlay, Proc, RemountRo, RoBind, Symlink, Tmpfs
from sandbox.session.cow import MAX_FILE_COPY, HostView, Source, cow_mounts, parse_mountinfo, session_spec

MOUNTINFO = """\
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
22 27 0:21 / /proc rw,relatime - proc proc rw
40 27 0:30 / /srv/data rw - tmpfs tmpfs rw
41 27 0:31 / /with\\040space rw - tmpfs tmpfs rw
"""


class FakeHost(HostView):
    """A host of directories, except the files named in `files`."""

    def __init__(self, files: dict[str, bytes] | None = None, others: tuple[str, ...] = ()) -> None:
        super().__init__(MOUNTINFO)
        self.files = files or {}
        self.others = others

    def source(self, path: str) -> Source:
        if path in self.files:
            return Source("file", path, len(self.files[path]), 0o640)
        if path in self.others:
            return Source("other", path)
        return Source("missing" if path.startswith("/missing") else "dir", path)

    def read(self, path: str) -> bytes:
        return self.files[path]


def test_mountinfo_points() -> None:
    assert parse_mountinfo(MOUNTINFO) == ["/", "/proc", "/srv/data", "/with space"]
    assert FakeHost().beneath("/srv") == ["/srv/data"]
    assert FakeHost().beneath("/srv/data") == [] and FakeHost().beneath("/usr") == []


def test_readonly_binds_become_overlays() -> None:
    mounts, names = cow_mounts([RoBind("/usr"), RoBind("/opt/x", "/x"), Bind("/home/me", "/work"),
                                DevBind("/dev/fuse"), Tmpfs("/tmp"), Dir("/d"), Symlink("usr/bin", "/bin"),
                                Proc(), Chmod("/d", 0o700)], FakeHost())
    assert mounts == (Overlay("/usr", ["/usr"]), Overlay("/x", ["/opt/x"]), Bind("/home/me", "/work"),
                      DevBind("/dev/fuse"), Tmpfs("/tmp"), Dir("/d"), Symlink("usr/bin", "/bin"), Proc(),
                      Chmod("/d", 0o700))
    assert names == []


def test_what_stays_readonly() -> None:
    host = FakeHost(files={"/big": b"\0" * (MAX_FILE_COPY + 1)}, others=("/dev/null",))
    kept = [RoBind("/srv"), RoBind("/"), RoBind("/big"), RoBind("/dev/null", "/null"),
            RoBind("/missing", optional=True), RoBind("/proc/self/fd/3", "/fd")]
    assert cow_mounts(kept, host) == (tuple(kept), [])  # mounts beneath, too big, not a file, missing, an fd


def test_small_files_are_copied() -> None:
    mounts, _ = cow_mounts([RoBind("/etc/resolv.conf"), File("/etc/x", b"1", readonly=True)],
                           FakeHost(files={"/etc/resolv.conf": b"nameserver ::1\n"}))
    assert mounts == (File("/etc/resolv.conf", b"nameserver ::1\n", perms=0o640), File("/etc/x", b"1"))
    beneath_host = [Bind("/home/me", "/w"), Dir("/w/d"), RoBind("/etc/resolv.conf", "/w/d/r")]
    assert cow_mounts(beneath_host, FakeHost(files={"/etc/resolv.conf": b""}))[0] == tuple(beneath_host)


def test_overlays_and_kept_directory() -> None:
    spec = [RoBind("/usr"), Overlay("/", ["/l1", "/l2"], writable=False), Overlay("/img", ["/l"], size=4096),
            Overlay("/own", ["/l"], upper="/mine"), RoBind("/usr", "/usr")]
    assert cow_mounts(spec, FakeHost())[0][:3] == (Overlay("/usr", ["/usr"]), Overlay("/", ["/l1", "/l2"]),
                                                   Overlay("/img", ["/l"], size=4096))
    mounts, names = cow_mounts(spec, FakeHost(), "/keep")
    assert names == ["%2Fusr", "%2F", "%2Fimg", "%2Fusr.2"]
    assert mounts == (Overlay("/usr", ["/usr"], upper="/keep/%2Fusr"), Overlay("/", ["/l1", "/l2"], upper="/keep/%2F"),
                      Overlay("/img", ["/l"], upper="/keep/%2Fimg"), Overlay("/own", ["/l"], upper="/mine"),
                      Overlay("/usr", ["/usr"], upper="/keep/%2Fusr.2"))


def test_remount_ro() -> None:
    spec = [Tmpfs("/t"), RemountRo("/t"), Bind("/h", "/rw"), RemountRo("/rw/sub"), RoBind("/r"), RemountRo("/r"),
            RemountRo("/"), Bind("/h2", "/rw2"), Tmpfs("/rw2/t"), RemountRo("/rw2/t"), Dir("/rw2/d"),
            RemountRo("/rw2/d")]
    mounts, _ = cow_mounts(spec, FakeHost())
    assert mounts == (Tmpfs("/t"), Bind("/h", "/rw"), RemountRo("/rw/sub"), Overlay("/r", ["/r"]),
                      Bind("/h2", "/rw2"), Tmpfs("/rw2/t"), Dir("/rw2/d"), RemountRo("/rw2/d"))


def test_session_spec_arguments() -> None:
    spec = sandbox.Spec(mounts=(RoBind("/usr"),))
    assert session_spec(spec, False) is spec
    assert session_spec(spec, True, host=FakeHost).mounts == (Overlay("/usr", ["/usr"]),)
    for args, field in [((spec, False, "/k"), "upper"), ((spec, 1), "writable_root"), ((spec, True, 3), "upper"),
                        (("spec",), "spec")]:
        with pytest.raises(sandbox.SpecError) as info:
            session_spec(*args)  # type: ignore[arg-type]
        assert info.value.field == field
