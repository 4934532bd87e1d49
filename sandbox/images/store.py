"""ImageStore: a content-addressed store of images, their layers unpacked once, shared between processes.

On disk (the directory is the caller's, mode 0700):

    lock                     flock: shared while a pull or load adds, exclusive while gc removes
    locks/<hex>              flock: held by the one process fetching that layer; the others wait
    blobs/sha256/<hex>       manifests and configs, as fetched (their name is their digest)
    layers/<hex>/root/       a layer's tree, named by its diff_id (the digest of its uncompressed tar)
    layers/<hex>/layer.json  its whiteouts, opaque directories and what was dropped
    layers/<hex>/overlay     present once the tree holds its whiteout devices and opaque xattrs (roots.py)
    merged/<hex>/            an image's layers merged into one tree of hardlinks (roots.py), by manifest digest
    refs/<quoted name>       a name's manifest digest (an image loaded without a name: its digest)
    tmp/                     work in progress; what a killed process left is removed by gc()

Everything appears by rename(2) of a finished, synced temporary: a layer
directory is complete or absent, and a name is written only once its
manifest, config and every layer are in place.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import http.client
import json
import os
import tarfile
import urllib.parse
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, cast

from . import fsutil, reference, roots
from .errors import (
    DigestMismatchError,
    ImageError,
    ImageFormatError,
    ImageNotFoundError,
    RegistryError,
    UnsupportedPlatformError,
)
from .media import (
    INDEXES,
    MAX_JSON,
    Descriptor,
    HashingReader,
    decompressed,
    layer_compression,
    load_json,
    sha256,
    verify,
)
from .model import PLATFORM, Image, Layer, media_type_of, parse_config, parse_manifest, pick_platform
from .reference import DIGEST
from .registry import Registry
from .sources import LocalSource
from .unpack import Bounds, unpack

DEFAULT_MAX_LAYER_BYTES = 64 << 30
DEFAULT_MAX_LAYER_MEMBERS = 1_000_000  # inodes: a large layer (a whole distribution, node_modules) has ~100k-400k
DEFAULT_MAX_LAYER_DEPTH = 256  # path components: deeper than any image's tree; PATH_MAX allows ~2,000


def default_path() -> str:
    """$SANDBOX_IMAGES, else $XDG_CACHE_HOME/sandbox/images, else ~/.cache/sandbox/images."""
    if os.environ.get("SANDBOX_IMAGES"):
        return os.environ["SANDBOX_IMAGES"]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "sandbox", "images")


@dataclass(frozen=True)
class GcResult:
    """What ImageStore.gc() removed: layer diff_ids, blob digests, leftover temporaries."""

    layers: tuple[str, ...]
    blobs: tuple[str, ...]
    temporaries: int


# How a source hands out blobs: digest -> a readable stream (closed by the store).
OpenBlob = Callable[[str], IO[bytes]]


class ImageStore:
    """A content-addressed image store at `path` (default: `default_path()`).

    Safe to share between processes: every addition is published by rename,
    and `gc()` waits for pulls and loads in progress. Each layer is bounded
    before anything of a member is written: `max_layer_bytes` bounds the
    declared size of its files plus 512 bytes per member (a huge sparse
    file in a small layer is refused, and so are 20,000 empty files under
    1 MiB), `max_layer_members` the number of its members (inodes), and
    `max_layer_depth` how many components deep a path goes. A layer over
    any of them is an UnsafeLayerError naming the member and the limit.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *,
                 max_layer_bytes: int = DEFAULT_MAX_LAYER_BYTES,
                 max_layer_members: int = DEFAULT_MAX_LAYER_MEMBERS,
                 max_layer_depth: int = DEFAULT_MAX_LAYER_DEPTH) -> None:
        self.path = os.path.abspath(os.fspath(path) if path is not None else default_path())
        for name, value in (("max_layer_bytes", max_layer_bytes), ("max_layer_members", max_layer_members),
                            ("max_layer_depth", max_layer_depth)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ImageError(f"ImageStore({name}={value!r}): must be a positive integer")
        self.max_layer_bytes = max_layer_bytes
        self.max_layer_members = max_layer_members
        self.max_layer_depth = max_layer_depth
        try:
            os.makedirs(self.path, mode=0o700, exist_ok=True)
            for sub in ("blobs/sha256", "layers", "refs", "tmp", "locks", "merged"):
                os.makedirs(os.path.join(self.path, sub), mode=0o700, exist_ok=True)
        except OSError as exc:
            raise ImageError(f"image store at {self.path}: cannot make its directories: "
                             f"{exc.strerror or exc} ({exc.filename})") from None
        self._lock = fsutil.StoreLock(os.path.join(self.path, "lock"))

    def __repr__(self) -> str:
        return f"ImageStore({self.path!r})"

    # ------------------------------------------------------------ adding

    def load(self, path: str | os.PathLike[str], ref: str | None = None, *, platform: str = PLATFORM) -> Image:
        """Add the image of an OCI layout directory, an OCI archive or a `docker save` tarball.

        `ref` chooses the image when the archive holds several (by name or
        tag; an archive of one image is loaded whatever its names) and names
        it in the store, unless it is a bare tag of the archive's; otherwise
        the archive's own names are kept (an image without one is found by
        its digest).
        """
        src = LocalSource(os.fspath(path))
        try:
            data, media, names = src.top(ref)
            return self._add(data, media, names, src.where, _local_manifest(src), src.open_blob, platform)
        finally:
            src.close()

    def pull(self, ref: str, *, insecure: bool = False, credentials: tuple[str, str] | None = None,
             platform: str = PLATFORM, timeout: float = 60.0) -> Image:
        """Fetch `ref` from its registry (HTTPS; plain HTTP only with `insecure=True`), unpack what is new.

        An index is resolved to its `platform` manifest. `credentials` (user,
        password) answer a Basic challenge or go to the token server; without
        them tokens are asked for anonymously.
        """
        parsed = reference.parse(ref)
        reg = Registry(parsed, insecure=insecure, credentials=credentials, timeout=timeout)
        data, media = reg.manifest(parsed.reference)
        if parsed.digest:
            verify(f"{parsed}: manifest", data, parsed.digest)

        def fetch_manifest(digest: str) -> tuple[bytes, str | None]:
            return reg.manifest(digest)

        def open_blob(digest: str) -> IO[bytes]:
            return reg.blob(digest)

        return self._add(data, media, [str(parsed)], str(parsed), fetch_manifest, open_blob, platform)

    def _add(self, data: bytes, media: str | None, names: list[str], where: str,
             fetch_manifest: Callable[[str], tuple[bytes, str | None]], open_blob: OpenBlob, platform: str) -> Image:
        with self._lock.hold(exclusive=False), fsutil.full_disk_is_typed(self.path):
            doc = load_json(f"{where}: manifest", data)
            media = media_type_of(doc, media)
            if media in INDEXES:
                chosen = pick_platform(doc, where, platform)
                data, media = fetch_manifest(chosen.digest)
                verify(f"{where}: {chosen.platform} manifest", data, chosen.digest)
                doc = load_json(f"{where}: manifest", data)
                media = media_type_of(doc, chosen.media_type or media)
            manifest = parse_manifest(doc, media, f"{where}: manifest")
            config_data = self._small_blob(open_blob, manifest.config, f"{where}: config")
            _, diff_ids, image_platform = parse_config(load_json(f"{where}: config", config_data), f"{where}: config")
            if image_platform != platform:
                raise UnsupportedPlatformError(where, platform, [image_platform])
            if len(diff_ids) != len(manifest.layers):
                raise ImageFormatError(where, f"{len(manifest.layers)} layers but {len(diff_ids)} diff_ids")
            for desc, diff_id in zip(manifest.layers, diff_ids, strict=True):
                if os.path.isdir(self._layer_dir(diff_id)):
                    continue
                # one process fetches a layer, the others wait for it and find it there
                with fsutil.StoreLock(os.path.join(self.path, "locks", diff_id[7:])).hold(exclusive=True):
                    if not os.path.isdir(self._layer_dir(diff_id)):
                        self._unpack_layer(open_blob, desc, diff_id, where)
            self._put_blob(manifest.config.digest, config_data)
            digest = sha256(data)
            self._put_blob(digest, data)
            for name in names or [digest]:
                fsutil.write_atomic(self._ref_path(name), digest.encode(), self._tmp)
        return self.get(digest)

    def _small_blob(self, open_blob: OpenBlob, desc: Descriptor, what: str) -> bytes:
        if desc.size > MAX_JSON:
            raise ImageFormatError(what, f"{desc.size} bytes, more than the {MAX_JSON} a config may have")
        with contextlib.closing(open_blob(desc.digest)) as f:
            try:
                data = f.read(desc.size + 1)
            except (http.client.HTTPException, OSError) as exc:
                raise RegistryError(what, f"the download was cut short: {exc}") from None
        verify(what, data, desc.digest)
        return data

    def _unpack_layer(self, open_blob: OpenBlob, desc: Descriptor, diff_id: str, where: str) -> None:
        """Fetch, check and unpack one layer into tmp/, then publish it as layers/<hex>."""
        what = f"{where}: layer {desc.digest}"
        kind = layer_compression(desc, where)
        tmp = fsutil.temp_name(self._tmp, "layer")
        os.mkdir(tmp, 0o700)
        try:
            os.mkdir(os.path.join(tmp, "root"), 0o700)
            with contextlib.closing(open_blob(desc.digest)) as raw:
                blob = HashingReader(raw, limit=desc.size, what=what)
                try:
                    head = blob.peek_head(4)
                    tar = HashingReader(decompressed(cast(IO[bytes], blob), kind, head, what))
                    bounds = Bounds(self.max_layer_bytes, self.max_layer_members, self.max_layer_depth)
                    out = unpack(cast(IO[bytes], tar), os.path.join(tmp, "root"), desc.digest, bounds)
                    got_diff, got_blob = tar.drain(), blob.drain()
                except (http.client.HTTPException, ConnectionError, TimeoutError) as exc:
                    raise RegistryError(what, f"the download was cut short after {blob.count} of "
                                        f"{desc.size} bytes: {exc!r}") from None
                except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile, ValueError) as exc:
                    _diagnose(blob, desc, what, exc)
                    raise ImageFormatError(what, f"not a valid layer: {exc}") from None
            if got_blob != desc.digest:
                raise DigestMismatchError(what, desc.digest, got_blob)
            if blob.count != desc.size:
                raise ImageFormatError(what, f"{blob.count} bytes, its descriptor says {desc.size}")
            if got_diff != diff_id:
                raise DigestMismatchError(f"{what}: uncompressed (diff_id)", diff_id, got_diff)
            meta = {"digest": diff_id, "blob": desc.digest, "whiteouts": out.whiteouts, "opaque": out.opaque,
                    "dropped": out.dropped, "size": out.size}
            with open(os.path.join(tmp, "layer.json"), "w") as f:
                json.dump(meta, f)
            fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                fsutil.syncfs(fd)  # every file of the layer durable before the rename publishes it
            finally:
                os.close(fd)
        except BaseException:
            fsutil.remove_tree(tmp)
            raise
        fsutil.publish_dir(tmp, self._layer_dir(diff_id))

    # ------------------------------------------------------------ roots

    def overlay_ready(self, image: Image) -> Image:
        """`image` with every layer ready for overlayfs: its whiteouts as 0:0
        devices and its opaque directories marked in its tree (roots.py). Done
        once per layer, by one process (the others wait for it), and kept."""
        layers = []
        with self._lock.hold(exclusive=False), fsutil.full_disk_is_typed(self.path):
            for layer in image.layers:
                directory = self._layer_dir(layer.digest)
                if not layer.overlay:
                    with fsutil.StoreLock(os.path.join(self.path, "locks", layer.digest[7:])).hold(exclusive=True):
                        if not os.path.exists(os.path.join(directory, roots.OVERLAY_MARK)):
                            roots.make_overlay_ready(directory, layer.whiteouts, layer.opaque, self._tmp)
                layers.append(dataclasses.replace(layer, overlay=True))
        return dataclasses.replace(image, layers=tuple(layers))

    def merged(self, image: Image) -> str:
        """The directory of `image`'s layers merged into one tree (hardlinks to
        the layers' files, deletions applied, mount points added: roots.py),
        made once, by one process, and published complete by rename(2)."""
        final = os.path.join(self.path, "merged", image.digest[7:])
        if os.path.isdir(final):
            return final
        with self._lock.hold(exclusive=False), fsutil.full_disk_is_typed(self.path):
            with fsutil.StoreLock(os.path.join(self.path, "locks", "merged-" + image.digest[7:])).hold(exclusive=True):
                if not os.path.isdir(final):
                    roots.build_merged(image, final, self._tmp)
        return final

    def _put_blob(self, digest: str, data: bytes) -> None:
        path = self._blob_path(digest)
        if not os.path.exists(path):
            fsutil.write_atomic(path, data, self._tmp)

    # ------------------------------------------------------------ reading

    def get(self, ref: str) -> Image:
        """The image a name or a digest (`sha256:...`, or `name@sha256:...`) refers to."""
        digest = self._resolve(ref)
        names = tuple(sorted(n for n, d in self._refs() if d == digest and n != digest))
        return self._image(digest, names, ref)

    def list(self) -> list[Image]:
        """Every image with a name (or loaded without one), sorted by their first name."""
        by_digest: dict[str, list[str]] = {}
        for name, digest in self._refs():
            by_digest.setdefault(digest, [])
            if name != digest:
                by_digest[digest].append(name)
        images = [self._image(d, tuple(sorted(n)), d) for d, n in by_digest.items()]
        return sorted(images, key=lambda img: (img.names[:1] or (img.digest,)))

    def _resolve(self, ref: str) -> str:
        if DIGEST.fullmatch(ref):
            if any(d == ref for _, d in self._refs()):
                return ref
            raise ImageNotFoundError(ref, f"in the store at {self.path}")
        parsed = reference.parse(ref)
        try:
            with open(self._ref_path(str(parsed))) as f:
                return f.read().strip()
        except FileNotFoundError:
            pass
        if parsed.digest and any(d == parsed.digest for _, d in self._refs()):
            return parsed.digest
        raise ImageNotFoundError(str(parsed), f"in the store at {self.path}")

    def _image(self, digest: str, names: tuple[str, ...], ref: str) -> Image:
        try:
            with open(self._blob_path(digest), "rb") as f:
                doc = load_json(f"{ref}: manifest", f.read())
            manifest = parse_manifest(doc, media_type_of(doc, None), f"{ref}: manifest")
            with open(self._blob_path(manifest.config.digest), "rb") as f:
                config, diff_ids, platform = parse_config(load_json(f"{ref}: config", f.read()), f"{ref}: config")
            layers = tuple(self._layer(d) for d in diff_ids)
        except FileNotFoundError as exc:
            raise ImageError(f"the store at {self.path} is missing a part of {ref}: {exc.filename} "
                             "(removed under it? pull or load it again)") from None
        return Image(digest, names, layers, config, manifest.config.digest, platform)

    def _layer(self, diff_id: str) -> Layer:
        directory = self._layer_dir(diff_id)
        with open(os.path.join(directory, "layer.json")) as f:
            meta = json.load(f)
        return Layer(diff_id, os.path.join(directory, "root"), tuple(meta["whiteouts"]), tuple(meta["opaque"]),
                     int(meta["size"]), os.path.exists(os.path.join(directory, roots.OVERLAY_MARK)))

    def _refs(self) -> Iterator[tuple[str, str]]:
        refs = os.path.join(self.path, "refs")
        for entry in os.listdir(refs):
            with contextlib.suppress(FileNotFoundError):
                with open(os.path.join(refs, entry)) as f:
                    yield urllib.parse.unquote(entry), f.read().strip()

    # ------------------------------------------------------------ removing

    def remove(self, ref: str) -> None:
        """Remove a name (or, given a digest, every name of that image). Its
        layers stay until gc() finds nothing else uses them."""
        digest = self._resolve(ref)
        if DIGEST.fullmatch(ref):
            doomed = [n for n, d in self._refs() if d == digest]
        else:
            doomed = [str(reference.parse(ref))]
        for name in doomed:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._ref_path(name))
        fsutil.fsync_dir(os.path.join(self.path, "refs"))

    def gc(self) -> GcResult:
        """Remove the manifests, configs and layers no name refers to, and
        what interrupted pulls left in tmp/. Waits for pulls and loads in progress."""
        with self._lock.hold(exclusive=True):
            keep_blobs: set[str] = set()
            keep_layers: set[str] = set()
            for digest in {d for _, d in self._refs()}:
                with contextlib.suppress(ImageError):
                    image = self._image(digest, (), digest)
                    keep_blobs |= {digest, image.config_digest}
                    keep_layers |= {layer.digest for layer in image.layers}
            blobs_dir = os.path.join(self.path, "blobs", "sha256")
            gone_blobs = [f"sha256:{h}" for h in os.listdir(blobs_dir) if f"sha256:{h}" not in keep_blobs]
            for digest in gone_blobs:
                os.unlink(self._blob_path(digest))
            layers_dir = os.path.join(self.path, "layers")
            gone_layers = [f"sha256:{h}" for h in os.listdir(layers_dir) if f"sha256:{h}" not in keep_layers]
            for diff_id in gone_layers:  # renamed into tmp/ first: a layer directory is complete or absent
                tmp = fsutil.temp_name(self._tmp, "gone")
                os.rename(self._layer_dir(diff_id), tmp)
            merged_dir = os.path.join(self.path, "merged")
            images = {d[7:] for _, d in self._refs()}
            gone_merged = [name for name in os.listdir(merged_dir) if name not in images]
            for name in gone_merged:  # the merged tree of an image no name refers to
                os.rename(os.path.join(merged_dir, name), fsutil.temp_name(self._tmp, "gone"))
            leftovers = os.listdir(self._tmp)
            for name in leftovers:
                fsutil.remove_tree(os.path.join(self._tmp, name))
            locks = os.path.join(self.path, "locks")
            for name in os.listdir(locks):  # no pull holds one: they run under the shared lock
                os.unlink(os.path.join(locks, name))
            return GcResult(tuple(sorted(gone_layers)), tuple(sorted(gone_blobs)),
                            len(leftovers) - len(gone_layers) - len(gone_merged))

    # ------------------------------------------------------------ paths

    @property
    def _tmp(self) -> str:
        return os.path.join(self.path, "tmp")

    def _blob_path(self, digest: str) -> str:
        return os.path.join(self.path, "blobs", "sha256", digest.split(":", 1)[1])

    def _layer_dir(self, diff_id: str) -> str:
        return os.path.join(self.path, "layers", diff_id.split(":", 1)[1])

    def _ref_path(self, name: str) -> str:
        return os.path.join(self.path, "refs", urllib.parse.quote(name, safe=""))


def _local_manifest(src: LocalSource) -> Callable[[str], tuple[bytes, str | None]]:
    def fetch(digest: str) -> tuple[bytes, str | None]:
        with src.open_blob(digest) as f:
            return f.read((4 << 20) + 1), None
    return fetch


def _diagnose(blob: HashingReader, desc: Descriptor, what: str, exc: BaseException) -> None:
    """Why a layer failed to unpack, if not for being a bad layer: a download cut
    short (RegistryError), or content other than the digest names (DigestMismatchError)."""
    try:
        digest = blob.drain()
    except (http.client.HTTPException, OSError, ImageFormatError):
        digest = ""
    if blob.count < desc.size:
        raise RegistryError(what, f"the blob ended after {blob.count} of {desc.size} bytes ({exc})") from None
    if digest and digest != desc.digest:
        raise DigestMismatchError(what, desc.digest, digest) from None
