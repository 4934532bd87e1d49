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

The root is the caller's path; everything below it is opened beneath it
with no link on the way (`_dirs`, fsutil.own_dir: openat2 with
RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS) and worked on through those fds, and
a ref file must hold a digest: a sandbox that could write the store (a
writable bind of ~/.cache) gets its links refused, not followed by gc(),
the locks, or a root handed out.
"""

from __future__ import annotations

import builtins
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

from . import fsutil, reference, roots, treewalk
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
from .unpack import Bounds, Unpacked, unpack

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
        self._lock = fsutil.StoreLock(self.path, "lock")

    def __repr__(self) -> str:
        return f"ImageStore({self.path!r})"

    # ------------------------------------------------------------ adding

    def load(self, path: str | os.PathLike[str], ref: str | None = None, *, platform: str = PLATFORM) -> Image:
        """Add the image of an OCI layout directory, an OCI archive or a `docker save` tarball.

        `ref` chooses the image when the archive holds several (by name or
        tag; an archive of one image is loaded whatever its names) and names
        it in the store: a bare tag of the archive's (`v1`, as `skopeo copy
        ... oci:DIR:v1` writes) names it as the reference it reads as
        (docker.io/library/v1:latest) when the archive gives the image no
        full name. Without `ref` the archive's own names are kept (an image
        without one is found by its digest).
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
                if self._has_layer(diff_id):
                    continue
                # one process fetches a layer, the others wait for it and find it there
                with fsutil.StoreLock(self.path, "locks/" + diff_id[7:]).hold(exclusive=True):
                    if not self._has_layer(diff_id):
                        self._unpack_layer(open_blob, desc, diff_id, where)
            self._put_blob(manifest.config.digest, config_data)
            digest = sha256(data)
            self._put_blob(digest, data)
            with self._dirs("refs", "tmp") as (refs, tmp):
                for name in names or [digest]:
                    fsutil.write_atomic_at(refs, _ref_name(name), digest.encode(), tmp)
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
        with self._dirs("tmp", "layers") as (tmp_fd, layers_fd):
            tmp = fsutil.fresh("layer")
            os.mkdir(tmp, 0o700, dir_fd=tmp_fd)
            try:
                layer_fd = os.open(tmp, roots.DIR_FLAGS, dir_fd=tmp_fd)
                try:
                    out = self._unpack_into(layer_fd, open_blob, desc, diff_id, what, kind)
                    meta = {"digest": diff_id, "blob": desc.digest, "whiteouts": out.whiteouts,
                            "opaque": out.opaque, "dropped": out.dropped, "size": out.size}
                    fd = os.open("layer.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                                 0o600, dir_fd=layer_fd)
                    with os.fdopen(fd, "w") as f:
                        json.dump(meta, f)
                    fsutil.syncfs(layer_fd)  # every file of the layer durable before the rename publishes it
                finally:
                    os.close(layer_fd)
            except BaseException:
                treewalk.remove_entry(tmp_fd, tmp)
                raise
            fsutil.publish_dir_at(tmp_fd, tmp, layers_fd, diff_id[7:])

    def _unpack_into(self, layer_fd: int, open_blob: OpenBlob, desc: Descriptor, diff_id: str, what: str,
                     kind: str) -> Unpacked:
        os.mkdir("root", 0o700, dir_fd=layer_fd)
        root = os.open("root", roots.DIR_FLAGS, dir_fd=layer_fd)
        try:
            with contextlib.closing(open_blob(desc.digest)) as raw:
                blob = HashingReader(raw, limit=desc.size, what=what)
                try:
                    head = blob.peek_head(4)
                    tar = HashingReader(decompressed(cast(IO[bytes], blob), kind, head, what))
                    bounds = Bounds(self.max_layer_bytes, self.max_layer_members, self.max_layer_depth)
                    out = unpack(cast(IO[bytes], tar), root, desc.digest, bounds)
                    got_diff, got_blob = tar.drain(), blob.drain()
                except (http.client.HTTPException, ConnectionError, TimeoutError) as exc:
                    raise RegistryError(what, f"the download was cut short after {blob.count} of "
                                        f"{desc.size} bytes: {exc!r}") from None
                except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile, ValueError) as exc:
                    _diagnose(blob, desc, what, exc)
                    raise ImageFormatError(what, f"not a valid layer: {exc}") from None
        finally:
            os.close(root)
        if got_blob != desc.digest:
            raise DigestMismatchError(what, desc.digest, got_blob)
        if blob.count != desc.size:
            raise ImageFormatError(what, f"{blob.count} bytes, its descriptor says {desc.size}")
        if got_diff != diff_id:
            raise DigestMismatchError(f"{what}: uncompressed (diff_id)", diff_id, got_diff)
        return out

    # ------------------------------------------------------------ roots

    def overlay_ready(self, image: Image) -> Image:
        """`image` with every layer ready for overlayfs: its whiteouts as 0:0
        devices and its opaque directories marked in its tree (roots.py). Done
        once per layer, by one process (the others wait for it), and kept."""
        layers = []
        with self._lock.hold(exclusive=False), fsutil.full_disk_is_typed(self.path):
            for layer in image.layers:
                if not layer.overlay:
                    with fsutil.StoreLock(self.path, "locks/" + layer.digest[7:]).hold(exclusive=True), \
                            self._dirs("layers/" + layer.digest[7:], "tmp") as (layer_fd, tmp_fd):
                        if not _exists(layer_fd, roots.OVERLAY_MARK):
                            roots.make_overlay_ready(layer_fd, layer.digest, layer.whiteouts, layer.opaque, tmp_fd)
                layers.append(dataclasses.replace(layer, overlay=True))
        return dataclasses.replace(image, layers=tuple(layers))

    def merged(self, image: Image) -> str:
        """The directory of `image`'s layers merged into one tree (hardlinks to
        the layers' files, deletions applied, mount points added: roots.py),
        made once, by one process, and published complete by rename(2)."""
        name = "merged/" + image.digest[7:]
        if self._is_own_dir(name):  # (a link there is refused: never handed out as a root)
            return os.path.join(self.path, name)
        with self._lock.hold(exclusive=False), fsutil.full_disk_is_typed(self.path):
            with fsutil.StoreLock(self.path, "locks/merged-" + image.digest[7:]).hold(exclusive=True):
                if not self._is_own_dir(name):
                    layer_names = [f"layers/{layer.digest[7:]}/root" for layer in image.layers]
                    with self._dirs("tmp", "merged", *layer_names) as (tmp_fd, merged_fd, *layer_fds):
                        roots.build_merged(image, layer_fds, tmp_fd, merged_fd, image.digest[7:])
        return os.path.join(self.path, name)

    def _put_blob(self, digest: str, data: bytes) -> None:
        with self._dirs("blobs/sha256", "tmp") as (blobs, tmp):
            if not _exists(blobs, digest[7:]):
                fsutil.write_atomic_at(blobs, digest[7:], data, tmp)

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
            with self._dirs("refs") as (refs,):
                return _digest_in(fsutil.read_own(refs, _ref_name(str(parsed)), 200, self.path), str(parsed))
        except FileNotFoundError:
            pass
        if parsed.digest and any(d == parsed.digest for _, d in self._refs()):
            return parsed.digest
        raise ImageNotFoundError(str(parsed), f"in the store at {self.path}")

    def _image(self, digest: str, names: tuple[str, ...], ref: str) -> Image:
        try:
            with self._dirs("blobs/sha256") as (blobs,):
                doc = load_json(f"{ref}: manifest", fsutil.read_own(blobs, digest[7:], MAX_JSON + 1, self.path))
                manifest = parse_manifest(doc, media_type_of(doc, None), f"{ref}: manifest")
                data = fsutil.read_own(blobs, manifest.config.digest[7:], MAX_JSON + 1, self.path)
            config, diff_ids, platform = parse_config(load_json(f"{ref}: config", data), f"{ref}: config")
            layers = tuple(self._layer(d) for d in diff_ids)
        except FileNotFoundError as exc:
            raise ImageError(f"the store at {self.path} is missing a part of {ref}: {exc.filename} "
                             "(removed under it? pull or load it again)") from None
        return Image(digest, names, layers, config, manifest.config.digest, platform)

    def _layer(self, diff_id: str) -> Layer:
        """A layer of the store; its tree checked to be a directory of the store's (no link on the way),
        as it is handed out to be a sandbox's root."""
        name = "layers/" + diff_id[7:]
        with self._dirs(name, name + "/root") as (layer_fd, _):
            meta = json.loads(fsutil.read_own(layer_fd, "layer.json", MAX_JSON + 1, self.path))
            overlay = _exists(layer_fd, roots.OVERLAY_MARK)
        return Layer(diff_id, os.path.join(self.path, name, "root"), tuple(meta["whiteouts"]), tuple(meta["opaque"]),
                     int(meta["size"]), overlay)

    def _refs(self) -> Iterator[tuple[str, str]]:
        with self._dirs("refs") as (refs,):
            entries = os.listdir(refs)
            found = []
            for entry in entries:
                with contextlib.suppress(FileNotFoundError):
                    text = fsutil.read_own(refs, entry, 200, self.path)
                    found.append((urllib.parse.unquote(entry), _digest_in(text, entry)))
        yield from found

    # ------------------------------------------------------------ removing

    def remove(self, ref: str) -> None:
        """Remove a name (or, given a digest, every name of that image). Its
        layers stay until gc() finds nothing else uses them."""
        digest = self._resolve(ref)
        if DIGEST.fullmatch(ref):
            doomed = [n for n, d in self._refs() if d == digest]
        else:
            doomed = [str(reference.parse(ref))]
        with self._dirs("refs") as (refs,):
            for name in doomed:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(_ref_name(name), dir_fd=refs)
            os.fsync(refs)

    def gc(self) -> GcResult:
        """Remove the manifests, configs and layers no name refers to, and
        what interrupted pulls left in tmp/. Waits for pulls and loads in progress."""
        with self._lock.hold(exclusive=True):
            keep_blobs: set[str] = set()
            keep_layers: set[str] = set()
            for digest in {d for _, d in self._refs()}:
                with contextlib.suppress(ImageError):
                    image = self._image(digest, (), digest)
                    keep_blobs |= {digest[7:], image.config_digest[7:]}
                    keep_layers |= {layer.digest[7:] for layer in image.layers}
            images = {d[7:] for _, d in self._refs()}
            with self._dirs("blobs/sha256", "layers", "merged", "tmp", "locks") as (blobs, layers, merged, tmp, locks):
                gone_blobs = [h for h in os.listdir(blobs) if h not in keep_blobs]
                for name in gone_blobs:
                    os.unlink(name, dir_fd=blobs)
                gone_layers = [h for h in os.listdir(layers) if h not in keep_layers]
                gone_merged = [h for h in os.listdir(merged) if h not in images]
                # renamed into tmp/ first: a layer directory (a merged tree) is complete or absent
                for name in gone_layers:
                    os.rename(name, fsutil.fresh("gone"), src_dir_fd=layers, dst_dir_fd=tmp)
                for name in gone_merged:
                    os.rename(name, fsutil.fresh("gone"), src_dir_fd=merged, dst_dir_fd=tmp)
                leftovers = os.listdir(tmp)
                for name in leftovers:
                    treewalk.remove_entry(tmp, name)
                for name in os.listdir(locks):  # no pull holds one: they run under the shared lock
                    os.unlink(name, dir_fd=locks)
            return GcResult(tuple(sorted(f"sha256:{h}" for h in gone_layers)),
                            tuple(sorted(f"sha256:{h}" for h in gone_blobs)),
                            len(leftovers) - len(gone_layers) - len(gone_merged))

    # ------------------------------------------------------------ paths

    @contextlib.contextmanager
    def _dirs(self, *names: str) -> Iterator[tuple[int, ...]]:
        """The store's own directories `names` (relative to its root) as fds, each opened beneath the
        root with no link on the way (fsutil.own_dir): what a sandbox that could write the store
        planted there is refused, never followed. The root is the caller's path, followed."""
        try:
            root = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise ImageError(f"image store at {self.path}: {exc.strerror or exc}") from None
        fds: builtins.list[int] = []
        try:
            for name in names:
                fds.append(fsutil.own_dir(root, name, self.path))
            yield tuple(fds)
        finally:
            for fd in fds:
                os.close(fd)
            os.close(root)

    def _has_layer(self, diff_id: str) -> bool:
        return self._is_own_dir("layers/" + diff_id[7:])

    def _is_own_dir(self, name: str) -> bool:
        """Whether the store has the directory `name`; a link or a file there is an ImageError."""
        try:
            with self._dirs(name):
                return True
        except ImageError:
            with self._dirs(os.path.dirname(name)) as (parent,):
                if not _exists(parent, os.path.basename(name)):
                    return False
            raise


def _exists(dirfd: int, name: str) -> bool:
    try:
        os.lstat(name, dir_fd=dirfd)
    except FileNotFoundError:
        return False
    return True


def _ref_name(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def _digest_in(data: bytes, ref: str) -> str:
    """The digest a ref file holds; one that is not `sha256:<64 hex>` (a path) is refused."""
    text = data.decode("ascii", "replace").strip()
    if not DIGEST.fullmatch(text):
        raise ImageError(f"the store's name {ref!r} holds {text[:80]!r}, not a digest (not written by the store)")
    return text


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
