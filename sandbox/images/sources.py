"""Local image sources for `ImageStore.load`: an OCI image layout directory,
the same as a tarball (an OCI archive), or a `docker save` tarball.

A source answers `top()` (the manifest or index to start from, and the names
the archive gives the image) and `open_blob(digest)`. A `docker save` archive
of the classic format has no manifest blob: one is made from its
manifest.json (OCI, each layer an uncompressed tar whose digest is its
diff_id), so its image gets a digest like any other.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tarfile
from typing import IO, Any

from . import beneath, reference
from .errors import ImageFormatError, ImageNotFoundError, InvalidReferenceError
from .media import OCI_INDEX, OCI_MANIFEST, load_json, sha256, verify
from .reference import DIGEST

REF_NAME = "org.opencontainers.image.ref.name"
CONTAINERD_NAME = "io.containerd.image.name"


class LocalSource:
    """A directory or a tarball holding an OCI layout or a docker save.

    `path` itself is the caller's choice and is opened as given (a link to
    a layout is followed), once, without blocking: a directory's members
    are then read beneath that fd only (beneath.py: no link, nothing
    outside, regular files only), a tarball's from that one open file."""

    def __init__(self, path: str) -> None:
        self.where = path
        self.alias: dict[str, str] = {}  # digest -> member, for docker save's layer.tar files
        self.tar: tarfile.TarFile | None = None
        self.members: dict[str, tarfile.TarInfo] = {}
        self.dirfd = -1
        fd = _open_top(path)
        try:
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                self.dirfd, fd = fd, -1
                return
            with contextlib.suppress(OSError):
                os.set_blocking(fd, True)
            self._file: IO[bytes] = os.fdopen(fd, "rb")
            fd = -1
            try:
                self.tar = tarfile.open(path, "r:*", fileobj=self._file)
                self.members = {_norm(m.name): m for m in self.tar.getmembers()}
            except tarfile.TarError as exc:
                self._file.close()
                raise ImageFormatError(path, f"neither an OCI layout directory nor a tarball: {exc}") from None
            except OSError as exc:
                self._file.close()
                raise ImageFormatError(path, f"cannot read it: {exc.strerror or exc}") from None
        finally:
            if fd >= 0:
                os.close(fd)

    def close(self) -> None:
        """Close the tarball, or the directory's fd."""
        if self.tar is not None:
            self.tar.close()
            self._file.close()
        if self.dirfd >= 0:
            os.close(self.dirfd)
            self.dirfd = -1

    def exists(self, name: str) -> bool:
        """Whether the source holds `name`: as anything, so that a link or a FIFO by that name is refused
        when it is read, not passed over."""
        if self.tar is not None:
            return _norm(name) in self.members
        try:
            os.close(beneath.open_beneath(self.dirfd, _safe(name, self.where), os.O_PATH))
        except FileNotFoundError:
            return False
        except OSError:
            return True
        return True

    def open(self, name: str) -> IO[bytes]:
        """A member of the source, for reading: a regular file beneath the directory, or the tarball's member."""
        if self.tar is not None:
            member = self.members.get(_norm(name))
            f = self.tar.extractfile(member) if member is not None else None
            if f is None:
                raise ImageFormatError(self.where, f"{name!r} is missing or not a file")
            return f
        return os.fdopen(self._open_fd(name), "rb")

    def _open_fd(self, name: str) -> int:
        try:
            return beneath.open_regular(self.dirfd, _safe(name, self.where))
        except beneath.NotRegularError as exc:
            raise ImageFormatError(self.where, f"{name!r} is {exc.strerror}: refused") from None
        except OSError as exc:
            raise ImageFormatError(self.where, f"{name!r}: {_why(exc)}") from None

    def read(self, name: str) -> bytes:
        """A small member (JSON), whole."""
        with self.open(name) as f:
            data = f.read((4 << 20) + 1)
        return data

    def open_blob(self, digest: str) -> IO[bytes]:
        """The blob of `digest`."""
        return self.open(self.alias.get(digest) or "blobs/sha256/" + digest.split(":", 1)[1])

    def top(self, ref: str | None) -> tuple[bytes, str | None, list[str]]:
        """The document to start from (a manifest or an index), its media type if known, and the image's names."""
        if self.exists("index.json"):
            return self._oci_top(ref)
        if self.exists("manifest.json"):
            return self._docker_top(ref)
        raise ImageFormatError(self.where, "has neither index.json (an OCI layout) nor manifest.json (docker save)")

    def _oci_top(self, ref: str | None) -> tuple[bytes, str | None, list[str]]:
        index = load_json(f"{self.where}: index.json", self.read("index.json"))
        entries = index.get("manifests")
        if not isinstance(entries, list) or not entries:
            raise ImageFormatError(self.where, "index.json lists no manifests")
        named = [(e, _names(e)) for e in entries if isinstance(e, dict)]
        if ref is not None:
            wanted = _matching(ref)
            chosen = [(e, sorted(wanted - {ref}) or n) for e, n in named if wanted & set(n)]
            # a bare tag of the archive's chooses, and names the image as it reads as a reference
            # (`v1` -> docker.io/library/v1:latest), as a ref matching no name names the one image
            as_named = [_normalized(ref)] if _valid(ref) else []
            chosen += [(e, n or as_named) for e, n in named if ref in _tags(e)]
            if not chosen and len(named) == 1 and _valid(ref):
                chosen = [(named[0][0], [_normalized(ref)])]  # the one image, named by the caller
            if not chosen:
                raise ImageNotFoundError(ref, f"in {self.where}")
        elif len(named) == 1 or any("platform" in e for e, _ in named):
            chosen = named[:1] if len(named) == 1 else []
        else:
            raise ImageFormatError(self.where, f"holds {len(named)} images: name the one to load")
        if not chosen:  # an index of platforms: the store picks one
            return json.dumps({**index, "mediaType": OCI_INDEX}).encode(), OCI_INDEX, []
        entry, names = chosen[0]
        digest = entry.get("digest")
        if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
            raise ImageFormatError(self.where, f"index.json entry digest {digest!r:.100} is not sha256:<64 hex>")
        data = self.read("blobs/sha256/" + digest.split(":", 1)[1])
        verify(f"{self.where}: manifest {digest}", data, digest)
        return data, entry.get("mediaType"), names

    def _docker_top(self, ref: str | None) -> tuple[bytes, str | None, list[str]]:
        entries = json.loads(self.read("manifest.json") or b"null")
        if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
            raise ImageFormatError(self.where, "manifest.json is not a list of images")
        names: list[str] | None = None
        if ref is not None:
            wanted = _matching(ref)
            matched = [e for e in entries if wanted & {_normalized(t) for t in e.get("RepoTags") or [] if _valid(t)}]
            if not matched and not (len(entries) == 1 and _valid(ref)):
                raise ImageNotFoundError(ref, f"in {self.where}")
            entries = matched or entries
            names = [_normalized(ref)] if _valid(ref) else None
        elif len(entries) > 1:
            raise ImageFormatError(self.where, f"holds {len(entries)} images: name the one to load")
        entry = entries[0]
        config_name, layer_names = entry.get("Config"), entry.get("Layers")
        if not isinstance(config_name, str) or not isinstance(layer_names, list):
            raise ImageFormatError(self.where, "a manifest.json entry lacks Config or Layers")
        config = self.read(config_name)
        doc = load_json(f"{self.where}: {config_name}", config)
        diff_ids = (doc.get("rootfs") or {}).get("diff_ids") or []
        if len(diff_ids) != len(layer_names):
            raise ImageFormatError(self.where, f"{len(layer_names)} layers but {len(diff_ids)} diff_ids in the config")
        config_digest = sha256(config)
        self.alias[config_digest] = config_name
        layers = []
        for name, diff_id in zip(layer_names, diff_ids, strict=True):
            self.alias[str(diff_id)] = str(name)
            layers.append({"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": diff_id,
                           "size": self._size(str(name))})
        manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "layers": layers,
                    "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                               "digest": config_digest, "size": len(config)}}
        if names is None:
            names = [_normalized(t) for t in entry.get("RepoTags") or [] if _valid(t)]
        return json.dumps(manifest, sort_keys=True).encode(), OCI_MANIFEST, names

    def _size(self, name: str) -> int:
        if self.tar is not None:
            member = self.members.get(_norm(name))
            while member is not None and (member.issym() or member.islnk()):  # docker save links shared layers
                target = member.linkname if member.islnk() else os.path.join(os.path.dirname(member.name),
                                                                               member.linkname)
                member = self.members.get(_norm(os.path.normpath(target)))
            if member is None:
                raise ImageFormatError(self.where, f"layer {name!r} is missing")
            return member.size
        fd = self._open_fd(name)
        try:
            return os.fstat(fd).st_size
        finally:
            os.close(fd)


def _open_top(path: str) -> int:
    """The caller's path, opened without blocking (a FIFO named as the archive is refused, not waited on)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ImageNotFoundError(path, "to load: no such file or directory") from None
    except OSError as exc:
        raise ImageFormatError(path, f"cannot open it: {exc.strerror or exc}") from None
    mode = os.fstat(fd).st_mode
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        os.close(fd)
        raise ImageFormatError(path, f"a {beneath.kind_of(mode)}, neither a layout directory nor a tarball: refused")
    return fd


def _why(exc: OSError) -> str:
    """An openat2 refusal in words."""
    if exc.errno == errno.ELOOP:
        return ("is a symbolic link or lies below one: a layout's members are read beneath it, never through a "
                "link (load the tarball, or copy the layout with its links resolved)")
    if exc.errno == errno.EXDEV:
        return "leaves the layout's directory"
    if exc.errno == errno.ENOENT:
        return "is missing"
    return exc.strerror or str(exc)


def _norm(name: str) -> str:
    return os.path.normpath(name.lstrip("/")).removeprefix("./")


def _safe(name: str, where: str) -> str:
    parts = name.split("/")
    if name.startswith("/") or ".." in parts:
        raise ImageFormatError(where, f"names a file outside itself: {name!r}")
    return name


def _names(entry: dict[str, Any]) -> list[str]:
    notes = entry.get("annotations") or {}
    out = []
    for key in (CONTAINERD_NAME, REF_NAME):
        value = notes.get(key) if isinstance(notes, dict) else None
        if isinstance(value, str) and ("/" in value or ":" in value) and _valid(value):
            out.append(_normalized(value))
    return out


def _tags(entry: dict[str, Any]) -> list[str]:
    notes = entry.get("annotations") or {}
    value = notes.get(REF_NAME) if isinstance(notes, dict) else None
    return [value] if isinstance(value, str) else []


def _matching(ref: str) -> set[str]:
    """What an archive may call the image `ref` names: its normalized form, or a bare tag."""
    out = {ref}
    if _valid(ref):
        out.add(_normalized(ref))
    return out


def _valid(ref: str) -> bool:
    try:
        reference.parse(ref)
    except InvalidReferenceError:
        return False
    return True


def _normalized(ref: str) -> str:
    return str(reference.parse(ref))
