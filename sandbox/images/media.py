"""Media types, descriptors and the content streams of blobs: digests checked, layers decompressed.

A layer blob is gzip, zstd or a plain tar (its media type says which, and
the first bytes are checked against it); zstd needs the `zstandard` module
(the `zstd` extra), or Python 3.14's compression.zstd, and says so when
neither is there.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib
from dataclasses import dataclass
from typing import IO, Any

from .errors import DigestMismatchError, ImageFormatError, UnsupportedMediaTypeError
from .reference import DIGEST

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MANIFESTS = (OCI_MANIFEST, DOCKER_MANIFEST)
INDEXES = (OCI_INDEX, DOCKER_LIST)
CONFIGS = ("application/vnd.oci.image.config.v1+json", "application/vnd.docker.container.image.v1+json")
LAYERS = {
    "application/vnd.oci.image.layer.v1.tar": "tar",
    "application/vnd.oci.image.layer.v1.tar+gzip": "gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd": "zstd",
    "application/vnd.oci.image.layer.nondistributable.v1.tar": "tar",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip": "gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd": "zstd",
    "application/vnd.docker.image.rootfs.diff.tar": "tar",
    "application/vnd.docker.image.rootfs.diff.tar.gzip": "gzip",
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip": "gzip",
}
MAX_JSON = 4 << 20  # a manifest, index or config larger than this is refused


@dataclass(frozen=True)
class Descriptor:
    """An OCI descriptor: what a manifest says a blob is."""

    media_type: str
    digest: str
    size: int
    platform: str | None = None  # "os/arch[/variant]" in an index
    annotations: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, raw: Any, where: str) -> Descriptor:
        """Check and read one descriptor of `where` (a JSON object)."""
        if not isinstance(raw, dict):
            raise ImageFormatError(where, f"a descriptor is not an object: {raw!r:.100}")
        digest, size, media = raw.get("digest"), raw.get("size"), raw.get("mediaType", "")
        if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
            raise ImageFormatError(where, f"descriptor digest {digest!r:.100} is not sha256:<64 hex>")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ImageFormatError(where, f"descriptor size {size!r:.50} is not a non-negative integer")
        if not isinstance(media, str):
            raise ImageFormatError(where, f"descriptor mediaType {media!r:.100} is not a string")
        plat = raw.get("platform")
        platform = None
        if isinstance(plat, dict):
            platform = "/".join(str(p) for p in (plat.get("os"), plat.get("architecture"), plat.get("variant")) if p)
        notes = raw.get("annotations") or {}
        annotations = tuple(sorted((str(k), str(v)) for k, v in notes.items())) if isinstance(notes, dict) else ()
        return cls(media, digest, size, platform, annotations)

    def annotation(self, key: str) -> str | None:
        """One annotation's value, or None."""
        return dict(self.annotations).get(key)


def sha256(data: bytes) -> str:
    """The digest of `data`, in `sha256:hex` form."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def verify(what: str, data: bytes, digest: str) -> None:
    """Raise DigestMismatchError unless `data` hashes to `digest`."""
    actual = sha256(data)
    if actual != digest:
        raise DigestMismatchError(what, digest, actual)


def load_json(what: str, data: bytes) -> dict[str, Any]:
    """Parse a manifest, index or config; ImageFormatError names `what` when it is not a JSON object."""
    import json

    if len(data) > MAX_JSON:
        raise ImageFormatError(what, f"{len(data)} bytes, more than the {MAX_JSON} a manifest or config may have")
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ImageFormatError(what, f"not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ImageFormatError(what, "not a JSON object")
    return obj


class HashingReader:
    """A read-only stream that hashes and counts what passes through it, and
    refuses to pass more than `limit` bytes (a blob larger than its descriptor)."""

    def __init__(self, raw: IO[bytes], limit: int | None = None, what: str = "blob") -> None:
        self.raw = raw
        self.what = what
        self.hash = hashlib.sha256()
        self.count = 0
        self.limit = limit
        self.head = b""  # bytes already read from raw (and hashed): given out first

    def read(self, n: int = -1) -> bytes:
        """Read up to n bytes (all with -1), hashing them."""
        if self.head:
            data, self.head = (self.head, b"") if n < 0 or n >= len(self.head) else (self.head[:n], self.head[n:])
            return data
        data = self.raw.read(n)
        self.hash.update(data)
        self.count += len(data)
        if self.limit is not None and self.count > self.limit:
            raise ImageFormatError(self.what, f"more than the {self.limit} bytes its descriptor gives")
        return data

    def peek_head(self, n: int) -> bytes:
        """The first n bytes, read now and given out again by the next read()."""
        self.head = self.read(n)
        return self.head

    def drain(self) -> str:
        """Read to the end (tar's trailing padding) and return the digest of everything."""
        while self.read(1 << 20):
            pass
        return "sha256:" + self.hash.hexdigest()


def layer_compression(desc: Descriptor, where: str) -> str:
    """"tar", "gzip" or "zstd" for a layer descriptor; UnsupportedMediaTypeError otherwise."""
    kind = LAYERS.get(desc.media_type)
    if kind is None:
        raise UnsupportedMediaTypeError(f"{where}: layer {desc.digest}", desc.media_type, tuple(LAYERS))
    return kind


def decompressed(raw: IO[bytes], kind: str, head: bytes, where: str) -> IO[bytes]:
    """The tar stream inside a layer blob whose first bytes are `head`."""
    sniffed = "gzip" if head[:2] == b"\x1f\x8b" else "zstd" if head[:4] == b"\x28\xb5\x2f\xfd" else "tar"
    if sniffed != kind and not (kind == "tar" and sniffed != "tar"):
        raise ImageFormatError(where, f"the media type says {kind}, the content is {sniffed}")
    kind = sniffed  # docker save's layer.tar and some registries call a compressed blob "tar"
    if kind == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    if kind == "zstd":
        return _zstd_reader(raw, where)
    return raw


def _zstd_reader(raw: IO[bytes], where: str) -> IO[bytes]:
    for module in ("compression.zstd", "zstandard"):
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        if module == "zstandard":
            return mod.ZstdDecompressor().stream_reader(raw)  # type: ignore[no-any-return]
        return mod.ZstdFile(raw)  # type: ignore[no-any-return]
    raise UnsupportedMediaTypeError(f"{where}: a zstd-compressed layer needs the zstandard module "
                                    "(pip install 'sandbox[zstd]')", "tar+zstd", ("tar", "tar+gzip"))
