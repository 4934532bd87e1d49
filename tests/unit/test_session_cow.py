"""sandbox.session.cow: what each mount of a Spec becomes in a Session's
copy-on-write tree, given the host's facts (no I/O: a HostView of data)."""

from __future__ import annotations

import pytest

import sandbox
from sandbox import Bind, Chmod, DevBind, Dir, File, Overlay, Proc, RemountRo, RoBind, Symlink, Tmpfs
from sandbox.session.cow import MAX_SPLIT, cow_mounts, session_root
from sandbox.session.cow_host import MAX_FILE_COPY, HostView, Source, parse_mountinfo

MOUNTINFO = """\
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
22 27 0:21 / /proc rw,relatime - proc proc rw
40 27 0:30 / /srv/data rw - tmpfs tmpfs rw
41 27 0:31 / /with\\040space rw - tmpfs tmpfs rw
42 27 0:32 / /mnt/share rw - fuse.sshfs me@host: rw
43 27 0:33 / /srv/data/deep/m rw shared:1 - ext4 /dev/vdb rw
"""


class FakeHost(HostView):
    """A host of directories, except the files named in `files`."""

    def __init__(self, files: dict[str, bytes] | None = None, others: tuple[str, ...] = (),
                 dirs: dict[str, list[str]] | None = None) -> None:
        super().__init__(MOUNTINFO)
        self.files = files or {}
        self.others = others
        self.dirs = dirs or {}

    def subdirs(self, path: str) -> list[str]:
        return sorted(self.dirs.get(path, []))

    def source(self, path: str) -> Source:
        if path in self.files:
            return Source("file", path, len(self.files[path]), 0o640)
        if path in self.others:
            return Source("other", path)
        return Source("missing" if path.startswith("/missing") else "dir", path)

    def read(self, path: str) -> bytes:
        return self.files[path]


def test_mountinfo_points() -> None:
    assert parse_mountinfo(MOUNTINFO)[2:4] == [("/srv/data", "tmpfs"), ("/with space", "tmpfs")]
    assert FakeHost().beneath("/srv") == ["/srv/data", "/srv/data/deep/m"]
    assert FakeHost().beneath("/srv/data/deep/m") == [] and FakeHost().beneath("/usr") == []
    host = FakeHost()
    assert [host.fstype(p) for p in ("/", "/usr/bin", "/proc/1", "/srv/data/x", "/mnt/share")] == [
        "ext4", "ext4", "proc", "tmpfs", "fuse.sshfs"]


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
            RoBind("/missing", optional=True), RoBind("/proc/self/fd/3", "/fd"), RoBind("/mnt/share", "/s"),
            RoBind("/proc/sys", "/ps")]
    assert cow_mounts(kept, host) == (tuple(kept), [])  # mounts beneath, too big, not a file, missing, an fd,
    # and filesystems overlayfs does not stack


def test_a_bind_with_mounts_beneath_is_overlaid_directory_by_directory() -> None:
    dirs = {"/": ["etc", "mnt", "proc", "srv", "tmp", "usr"], "/srv": ["data", "www"], "/srv/data": ["deep", "a"],
            "/srv/data/deep": ["m", "n"], "/mnt": ["share"]}
    mounts, names = cow_mounts([RoBind("/", "/host"), Tmpfs("/host/tmp")], FakeHost(dirs=dirs), "/k")
    assert mounts[0] == RoBind("/", "/host") and mounts[-1] == Tmpfs("/host/tmp")
    assert [(m.dest, m.lowers) for m in mounts[1:-1]] == [  # type: ignore[attr-defined]
        ("/host/etc", ("/etc",)), ("/host/srv/data/a", ("/srv/data/a",)),
        ("/host/srv/data/deep/m", ("/srv/data/deep/m",)), ("/host/srv/data/deep/n", ("/srv/data/deep/n",)),
        ("/host/srv/www", ("/srv/www",)), ("/host/usr", ("/usr",))]
    assert names[0] == "%2Fhost%2Fetc"  # /proc (procfs), /mnt/share (sshfs), /tmp (covered later): not overlaid
    many = {"/": [f"d{k}" for k in range(MAX_SPLIT + 10)], "/d0": ["x"]}
    host = FakeHost(dirs=many)
    host.mounts.append(("/d0/x", "ext4"))
    assert len(cow_mounts([RoBind("/")], host)[0]) == 1 + MAX_SPLIT


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
    assert session_root(spec, False).spec is spec
    assert session_root(spec, True, host=FakeHost).spec.mounts == (Overlay("/usr", ["/usr"]),)
    for args, field in [((spec, False, "/k"), "upper"), ((spec, 1), "writable_root"), ((spec, True, 3), "upper"),
                        (("spec",), "spec")]:
        with pytest.raises(sandbox.SpecError) as info:
            session_root(*args)  # type: ignore[arg-type]
        assert info.value.field == field
