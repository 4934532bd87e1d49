"""What an unpacked layer keeps: files, directories, symlinks, hardlinks,
modes, times, owners (as root), user xattrs; and how later members replace
earlier ones. Through ImageStore.load, as root and unprivileged."""

from __future__ import annotations

import os
import stat
import tarfile
from pathlib import Path

import pytest

from sandbox.images import ImageStore, Layer

from .image_helpers import DIRTYPE, LNKTYPE, SYMTYPE, TestImage, layer, member, write_layout


def unpacked(tmp_path: Path, *members: tuple[tarfile.TarInfo, bytes]) -> tuple[Path, Layer]:
    write_layout(str(tmp_path / "layout"), [(TestImage([layer(*members)]), None)])
    img = ImageStore(tmp_path / "store").load(tmp_path / "layout")
    return Path(img.layers[0].path), img.layers[0]


def test_kinds_modes_and_times(tmp_path: Path) -> None:
    root, _ = unpacked(
        tmp_path,
        member("ro/", DIRTYPE, mode=0o555),
        member("ro/file", data=b"inside a read-only dir\n", mode=0o600),
        member("deep/er/file", data=b"parents made\n", mode=0o640),
        member("link", SYMTYPE, linkname="/ro/file"),
        member("hard", LNKTYPE, linkname="ro/file"),
        member("fifo", tarfile.FIFOTYPE, mode=0o620),
        member("exe", data=b"#!/bin/sh\n", mode=0o755, mtime=1_600_000_000),
        member("sticky/", DIRTYPE, mode=0o1777),
    )
    assert (root / "ro").stat().st_mode & 0o7777 == 0o555
    assert (root / "ro/file").stat().st_mode & 0o7777 == 0o600
    assert (root / "ro/file").read_text() == "inside a read-only dir\n"
    assert (root / "deep/er/file").read_text() == "parents made\n"
    assert (root / "deep/er/file").stat().st_mode & 0o7777 == 0o640
    assert (root / "deep").stat().st_mode & 0o7777 == 0o755  # parents the layer does not list
    assert (root / "deep/er").stat().st_mode & 0o7777 == 0o755
    assert os.readlink(root / "link") == "/ro/file"  # kept as written, never resolved by the store
    assert (root / "hard").stat().st_ino == (root / "ro/file").stat().st_ino
    assert stat.S_ISFIFO((root / "fifo").lstat().st_mode)
    assert (root / "exe").stat().st_mtime == 1_600_000_000
    assert (root / "sticky").stat().st_mode & 0o7777 == 0o1777
    assert (root / "ro").stat().st_mtime == 1_700_000_000  # set after its file was written


def test_owners_kept_as_root_only(tmp_path: Path) -> None:
    root, _ = unpacked(tmp_path, member("owned", data=b"x", uid=1234, gid=4321),
                       member("d/", DIRTYPE, mode=0o755, uid=7, gid=8))
    want = (1234, 4321) if os.geteuid() == 0 else (os.geteuid(), os.getegid())
    st = (root / "owned").stat()
    assert (st.st_uid, st.st_gid) == want
    st = (root / "d").stat()
    assert (st.st_uid, st.st_gid) == ((7, 8) if os.geteuid() == 0 else (os.geteuid(), os.getegid()))


def test_later_members_replace_earlier(tmp_path: Path) -> None:
    root, _ = unpacked(
        tmp_path,
        member("a", data=b"first"),
        member("a", data=b"second"),
        member("f-then-d", data=b"file"),
        member("f-then-d/", DIRTYPE, mode=0o755),
        member("f-then-d/in", data=b"in"),
        member("d-then-f/", DIRTYPE, mode=0o555),
        member("d-then-f/x", data=b"x"),
        member("d-then-f", data=b"now a file"),
    )
    assert (root / "a").read_bytes() == b"second"
    assert (root / "f-then-d/in").read_bytes() == b"in"
    assert (root / "d-then-f").read_bytes() == b"now a file"


def test_user_xattrs_kept_others_dropped(tmp_path: Path) -> None:
    probe = tmp_path / "probe"
    probe.write_text("")
    try:
        os.setxattr(probe, "user.test", b"1")
    except OSError:
        pytest.skip(f"{tmp_path} does not take user xattrs")
    info, data = member("x", data=b"data")
    info.pax_headers = {"SCHILY.xattr.user.mime_type": "text/plain", "SCHILY.xattr.security.capability": "\x01",
                        "SCHILY.xattr.trusted.overlay.opaque": "y"}
    root, _ = unpacked(tmp_path, (info, data))
    assert os.getxattr(root / "x", "user.mime_type") == b"text/plain"
    names = os.listxattr(root / "x")
    assert "security.capability" not in names and "trusted.overlay.opaque" not in names


def test_whiteouts_recorded(tmp_path: Path) -> None:
    root, lay = unpacked(tmp_path, member("etc/.wh.passwd"), member("var/cache/.wh..wh..opq"),
                         member("var/cache/new", data=b"n"), member("x/.wh..wh.plnk"), member(".wh.top"))
    assert sorted(lay.whiteouts) == ["etc/passwd", "top"]
    assert lay.opaque == ("var/cache",)
    assert (root / "var/cache").is_dir() and (root / "var/cache/new").read_bytes() == b"n"
    assert (root / "etc").is_dir() and not list(root.rglob(".wh.*"))


def test_docker_style_names(tmp_path: Path) -> None:
    """`./`-prefixed names and an entry for the root itself, as `tar -C dir .` writes them."""
    root, _ = unpacked(tmp_path, member("./", DIRTYPE, mode=0o700), member("./etc/", DIRTYPE, mode=0o755),
                       member("./etc/hostname", data=b"box\n"))
    assert (root / "etc/hostname").read_text() == "box\n"


def test_a_name_the_file_system_refuses(tmp_path: Path) -> None:
    """A component longer than NAME_MAX: a typed error naming the member, nothing kept."""
    from sandbox.images import ImageFormatError

    with pytest.raises(ImageFormatError, match="File name too long") as info:
        unpacked(tmp_path, member("d/" + "n" * 300, data=b"x"))
    assert "n" * 300 in str(info.value)
    assert os.listdir(tmp_path / "store" / "tmp") == [] and os.listdir(tmp_path / "store" / "refs") == []


def test_a_store_where_none_can_be_made(tmp_path: Path) -> None:
    from sandbox.images import ImageError

    (tmp_path / "file").write_text("")
    with pytest.raises(ImageError, match="cannot make its directories"):
        ImageStore(tmp_path / "file" / "store")
