"""A Session's copy-on-write root (sandbox.session.cow): a package install
into /usr and writes to /etc as a root caller, the nobody-owned host files
an unprivileged caller cannot write, a caller-owned tree, a read-only
Overlay and an image root (sandbox.images, RemountRo("/")) written by
either, persistence across calls, a kept upper
directory, `writable_root=False`, and nothing changed or left on the host.
Each host file a session writes over is compared (bytes, mtime) after."""

from __future__ import annotations

import os
import pwd
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import make_base_spec  # tests/, on sys.path (rootdir)
from images.image_helpers import DIRTYPE, TestImage, member, runnable_layer, write_layout  # tests/images

import sandbox
from sandbox import Bind, Overlay, RemountRo, RoBind, Tmpfs
from sandbox.images import ImageStore

pytestmark = pytest.mark.integration

ROOT = os.geteuid() == 0
as_root = pytest.mark.skipif(not ROOT, reason="host root's files are the inside root's for a root caller only")
as_user = pytest.mark.skipif(ROOT, reason="an unprivileged caller's view of host root's files")


def sh(s: sandbox.Session, script: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    done: subprocess.CompletedProcess[str] = s.exec(["sh", "-c", script], capture_output=True, text=True,
                                                    timeout=60)
    if ok:
        assert done.returncode == 0, done.stderr
    return done


def fingerprint(path: Path) -> dict[str, tuple[bytes, int, int]]:
    """Every file under `path` (or `path` itself): its bytes, mtime and mode."""
    paths = [path] if path.is_file() else sorted(p for p in path.rglob("*"))
    out = {}
    for p in paths:
        st = p.lstat()
        data = p.read_bytes() if p.is_file() and not p.is_symlink() else b""
        out[str(p)] = (data, st.st_mtime_ns, st.st_mode)
    return out


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A tree the caller owns, as an image root extracted by the caller is."""
    root = tmp_path / "tree"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "conf").write_text("a=1\n")
    (root / "bin").mkdir()
    (root / "bin" / "tool").write_text("#!/bin/sh\necho v1\n")
    (root / "bin" / "tool").chmod(0o755)
    (root / "gone").write_text("deleted in the session\n")
    return root


def mountinfo() -> list[str]:
    return Path("/proc/self/mountinfo").read_text().splitlines()


@as_root
def test_root_installs_into_usr_and_writes_etc(require_native: None) -> None:
    passwd = Path("/etc/passwd")
    before = fingerprint(passwd)
    with sandbox.Session(make_base_spec(RoBind("/etc"))) as s:
        sh(s, "mkdir -p /usr/lib/sbx-cowroot-pkg && echo data > /usr/lib/sbx-cowroot-pkg/file && "
              "printf '#!/bin/sh\\necho installed\\n' > /usr/bin/sbx-cowroot-x && chmod 755 /usr/bin/sbx-cowroot-x")
        sh(s, "echo 'cowuser:x:4242:4242::/home/cowuser:/bin/sh' >> /etc/passwd")
        assert sh(s, "sbx-cowroot-x").stdout == "installed\n"  # a later call sees the install
        assert "cowuser:x:4242" in sh(s, "tail -1 /etc/passwd").stdout
        assert s.read_file("/usr/lib/sbx-cowroot-pkg/file") == b"data\n"
        s.write_file("/etc/sbx-cowroot", b"by the file API")
        assert sh(s, "cat /etc/sbx-cowroot").stdout == "by the file API"
    assert not Path("/usr/bin/sbx-cowroot-x").exists() and not Path("/usr/lib/sbx-cowroot-pkg").exists()
    assert not Path("/etc/sbx-cowroot").exists()
    assert fingerprint(passwd) == before


@as_user
def test_unprivileged_cannot_write_nobody_owned_files(require_native: None) -> None:
    with sandbox.Session(make_base_spec(RoBind("/etc"))) as s:
        assert sh(s, "stat -c %U /usr/bin /etc/passwd").stdout.split() == ["nobody", "nobody"]
        # overlayfs shows a mount's top directory as its upper one, which the session made: the caller's
        assert sh(s, "stat -c %U /usr /etc").stdout.split() == [pwd.getpwuid(os.geteuid()).pw_name] * 2
        for path in ("/usr/bin/sbx-cowroot-x", "/etc/passwd"):
            with pytest.raises(PermissionError):
                s.write_file(path, b"x")
            done = sh(s, f"echo x >> {path}", ok=False)
            assert done.returncode != 0 and "Permission denied" in done.stderr
        sh(s, "mkdir /top && echo x > /top/f")  # the root's own tmpfs is the session's


def test_caller_owned_tree_and_readonly_overlay(require_native: None, tree: Path) -> None:
    before = fingerprint(tree)
    spec = make_base_spec(RoBind(tree, "/work"), Overlay("/image", [tree], writable=False))
    with sandbox.Session(spec) as s:
        for top in ("/work", "/image"):
            sh(s, f"echo a=2 > {top}/etc/conf && printf '#!/bin/sh\\necho v2\\n' > {top}/bin/tool && "
                  f"rm {top}/gone && mkdir {top}/new && echo n > {top}/new/f")
            assert sh(s, f"{top}/bin/tool; cat {top}/etc/conf; ls {top}").stdout == "v2\na=2\nbin\netc\nnew\n"
        s.write_file("/work/etc/conf", b"a=3\n")
        assert sh(s, "cat /work/etc/conf").stdout == "a=3\n"
    assert fingerprint(tree) == before


@pytest.mark.skipif(not sandbox.presets.overlay_works(), reason="no overlayfs in a user namespace here")
def test_image_root_is_written_in_the_session(require_native: None, tmp_path: Path) -> None:
    conf = member("etc/", DIRTYPE, mode=0o755), member("etc/conf", data=b"image\n")
    write_layout(str(tmp_path / "layout"), [(TestImage([runnable_layer(conf)], env=["PATH=/usr/bin"]), "run")])
    store = ImageStore(tmp_path / "store")
    img = store.overlay_ready(store.load(tmp_path / "layout"))  # extracted as the caller: the caller's files
    layers = [fingerprint(Path(layer.path)) for layer in img.layers]
    spec = sandbox.presets.image(img, writable=False, store=store)  # a read-only root (RemountRo("/"))
    with sandbox.Session(spec, writable_root=False) as s:
        assert "Read-only file system" in sh(s, "echo x > /etc/conf", ok=False).stderr
    with sandbox.Session(spec) as s:
        sh(s, "echo session > /etc/conf && mkdir /opt && touch /opt/f")
        s.write_file("/usr/bin/installed", Path("/usr/bin/true").read_bytes(), mode=0o755)
        assert sh(s, "cat /etc/conf; installed && echo ran").stdout == "session\nran\n"
    assert [fingerprint(Path(layer.path)) for layer in img.layers] == layers


def test_kept_upper_holds_the_writes(require_native: None, tree: Path, tmp_path: Path) -> None:
    before = fingerprint(tree)
    kept = tmp_path / "kept"
    spec = make_base_spec(RoBind(tree, "/work"))
    with sandbox.Session(spec, upper=kept) as s:
        assert s.spec is spec and s.effective_spec.mounts[0].upper == str(kept / "%2Fusr")  # type: ignore[attr-defined]
        sh(s, "echo a=2 > /work/etc/conf && echo n > /work/new")
    assert (kept / "%2Fwork" / "upper" / "new").read_text() == "n\n"
    assert (kept / "%2Fwork" / "upper" / "etc" / "conf").read_text() == "a=2\n"
    with sandbox.Session(spec, upper=kept) as s:  # the next session over the same directory goes on from there
        assert sh(s, "cat /work/etc/conf /work/new").stdout == "a=2\nn\n"
    assert fingerprint(tree) == before
    assert sorted(p.name for p in kept.iterdir()) == ["%2Fusr", "%2Fwork"]


def test_writable_root_false_keeps_readonly_mounts(require_native: None, tree: Path) -> None:
    spec = make_base_spec(RoBind(tree, "/work"))
    with sandbox.Session(spec, writable_root=False) as s:
        assert s.effective_spec is spec
        with pytest.raises(PermissionError):
            s.write_file("/work/etc/conf", b"x")
        assert "Read-only file system" in sh(s, "echo x > /usr/sbx-cowroot", ok=False).stderr
    with pytest.raises(sandbox.SpecError) as info:
        sandbox.Session(spec, writable_root=False, upper=tree)
    assert info.value.field == "upper"
    with pytest.raises(sandbox.SpecError) as info:
        sandbox.Session(spec, writable_root="yes")  # type: ignore[arg-type]
    assert info.value.field == "writable_root"


def test_remount_ro_and_file_binds(require_native: None, tmp_path: Path) -> None:
    host_rw = tmp_path / "rw"
    host_rw.mkdir()
    conf = tmp_path / "resolv.conf"
    conf.write_text("nameserver 127.0.0.1\n")
    big = tmp_path / "big"
    big.write_bytes(b"\0" * ((1 << 20) + 1))
    before = fingerprint(tmp_path)
    spec = make_base_spec(Tmpfs("/cfg"), RemountRo("/cfg"), Bind(host_rw, "/rw"), RemountRo("/rw"),
                          RoBind(conf, "/etc/resolv.conf"), RoBind(big, "/big"), RemountRo("/"))
    with sandbox.Session(spec) as s:
        sh(s, "echo x > /cfg/f && mkdir /top && echo y >> /etc/resolv.conf")  # the session's own: writable
        assert sh(s, "cat /etc/resolv.conf").stdout == "nameserver 127.0.0.1\ny\n"
        assert "Read-only file system" in sh(s, "echo x > /rw/f", ok=False).stderr  # the host's, as the Spec says
        assert "Read-only file system" in sh(s, "echo x >> /big", ok=False).stderr  # too big to copy
    assert fingerprint(tmp_path) == before


def test_a_directory_shut_to_the_caller_stays_a_bind(require_native: None, tmp_path: Path) -> None:
    shut = tmp_path / "shut"
    shut.mkdir(mode=0o700)
    if ROOT:
        os.chown(shut, 65534, 65534)  # unmapped in the session: no capability there opens it
    elif os.access("/root", os.X_OK):
        pytest.skip("needs a directory of another user shut to this one")
    else:
        shut = Path("/root")
    with sandbox.Session(make_base_spec(RoBind(shut, "/shut"))) as s:
        assert RoBind(shut, "/shut") in s.effective_spec.mounts  # an overlay of it would not mount
        assert "Permission denied" in sh(s, "ls /shut", ok=False).stderr


@as_root
def test_a_bind_with_mounts_beneath_is_overlaid_below(require_native: None, tmp_path: Path) -> None:
    top = tmp_path / "top"
    for d in ("sub", "d/e"):
        (top / d).mkdir(parents=True)
    (top / "t").write_text("top\n")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "sbx-cowroot", str(top / "sub")], check=True)
    try:
        (top / "sub" / "s").write_text("sub\n")
        before = fingerprint(top)
        with sandbox.Session(make_base_spec(RoBind(top, "/top"))) as s:
            assert RoBind(top, "/top") in s.effective_spec.mounts  # overlayfs cannot take it as a lower
            assert sh(s, "cat /top/t /top/sub/s").stdout == "top\nsub\n"
            assert "Read-only file system" in sh(s, "echo 2 > /top/t", ok=False).stderr  # its own files
            sh(s, "echo 2 > /top/sub/s && echo n > /top/d/e/n")  # each directory in it is overlaid
            assert sh(s, "cat /top/sub/s /top/d/e/n").stdout == "2\nn\n"
        assert fingerprint(top) == before
    finally:
        subprocess.run(["umount", str(top / "sub")], check=True)


def test_host_view(require_native: None) -> None:
    etc = fingerprint(Path("/etc/passwd"))
    with sandbox.Session(sandbox.presets.host_view()) as s:
        assert s.effective_spec.mounts[0] == RoBind("/")  # mounts beneath it: each directory is overlaid
        assert "Read-only file system" in sh(s, "echo x > /sbx-cowroot", ok=False).stderr
        if ROOT:
            sh(s, "echo x >> /etc/passwd && echo y > /usr/bin/sbx-cowroot-x")
        else:
            assert "Permission denied" in sh(s, "echo x >> /etc/passwd", ok=False).stderr
    assert fingerprint(Path("/etc/passwd")) == etc and not Path("/usr/bin/sbx-cowroot-x").exists()


def test_close_leaves_no_mount_or_file(require_native: None, tree: Path, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    scratch = tmp_path / "tmpdir"  # the temporary directory of this process, alone (others share /tmp)
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    kept = tmp_path / "kept"
    ours = ("overlay", str(tree), str(kept), "/etc", "/usr")  # other jobs' mounts come and go in the host's table
    mounts = [line for line in mountinfo() if any(word in line for word in ours)]
    with sandbox.Session(make_base_spec(RoBind(tree, "/work"), RoBind("/etc")), upper=kept) as s:
        sh(s, "echo x > /work/new && echo y > /usr/sbx-cowroot 2>/dev/null; true")
        assert s.exec(["grep", "-c", " overlay ", "/proc/self/mountinfo"], capture_output=True).stdout.strip() != b"0"
    assert [line for line in mountinfo() if any(word in line for word in ours)] == mounts
    assert list(scratch.iterdir()) == []
    assert sorted(p.name for p in kept.iterdir()) == ["%2Fetc", "%2Fusr", "%2Fwork"]


@pytest.fixture
def sessions() -> Iterator[list[sandbox.Session]]:
    opened: list[sandbox.Session] = []
    yield opened
    for s in opened:
        s.close()


def test_sessions_do_not_share_a_layer(require_native: None, tree: Path, sessions: list[sandbox.Session]) -> None:
    spec = make_base_spec(RoBind(tree, "/work"))
    sessions += [sandbox.Session(spec), sandbox.Session(spec)]
    sh(sessions[0], "echo first > /work/etc/conf")
    assert sh(sessions[1], "cat /work/etc/conf").stdout == "a=1\n"
