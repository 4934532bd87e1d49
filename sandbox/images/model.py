"""What the store hands out: Image, its Layers and its ImageConfig; and the
reading of manifests, indexes and configs into them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import ImageFormatError, UnsupportedMediaTypeError, UnsupportedPlatformError
from .media import CONFIGS, INDEXES, MANIFESTS, OCI_INDEX, OCI_MANIFEST, Descriptor, layer_compression
from .reference import DIGEST

PLATFORM = "linux/amd64"


@dataclass(frozen=True)
class ImageConfig:
    """The parts of an image's config a sandbox uses (OCI image-spec `config`)."""

    env: tuple[tuple[str, str], ...] = ()
    working_dir: str = "/"
    user: str = ""
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()

    @property
    def argv(self) -> tuple[str, ...]:
        """What the image runs by default: entrypoint then cmd."""
        return self.entrypoint + self.cmd


@dataclass(frozen=True)
class Layer:
    """One unpacked layer: its tree at `path`, and what it deletes from the layers below it.

    `digest` is its diff_id (the digest of the uncompressed tar), `whiteouts`
    the paths it deletes and `opaque` the directories whose lower contents it
    hides (both relative to the root, `/`-separated). `overlay`: the tree
    also holds them as overlayfs reads them (ImageStore.overlay_ready)."""

    digest: str
    path: str
    whiteouts: tuple[str, ...] = ()
    opaque: tuple[str, ...] = ()
    size: int = 0
    overlay: bool = False


@dataclass(frozen=True)
class Image:
    """An image in the store: `digest` is its manifest's, `layers` bottom first."""

    digest: str
    names: tuple[str, ...]
    layers: tuple[Layer, ...]
    config: ImageConfig
    config_digest: str
    platform: str = PLATFORM


@dataclass(frozen=True)
class Manifest:
    """A parsed image manifest: its config and layer descriptors."""

    config: Descriptor
    layers: tuple[Descriptor, ...]


def media_type_of(doc: dict[str, Any], given: str | None) -> str:
    """A manifest's or index's media type: the document's own, else the one it was served as, else its shape."""
    media = doc.get("mediaType")
    if not media:
        known = given in (*MANIFESTS, *INDEXES)  # a registry may serve any of them as application/json
        media = given if known else OCI_INDEX if "manifests" in doc else OCI_MANIFEST
    return str(media)


def parse_manifest(doc: dict[str, Any], media: str, where: str) -> Manifest:
    """Check an image manifest's shape and media types."""
    if media not in MANIFESTS:
        raise UnsupportedMediaTypeError(where, media, (*MANIFESTS, *INDEXES))
    config = Descriptor.parse(doc.get("config"), f"{where} config")
    if config.media_type not in CONFIGS:
        raise UnsupportedMediaTypeError(f"{where} config", config.media_type, CONFIGS)
    raw_layers = doc.get("layers")
    if not isinstance(raw_layers, list):
        raise ImageFormatError(where, "`layers` is not a list")
    layers = tuple(Descriptor.parse(x, f"{where} layer {i}") for i, x in enumerate(raw_layers))
    for desc in layers:
        layer_compression(desc, where)
    return Manifest(config, layers)


def pick_platform(doc: dict[str, Any], ref: str, platform: str = PLATFORM) -> Descriptor:
    """The manifest of an index for `platform` (os/arch; a variant is ignored)."""
    raw = doc.get("manifests")
    if not isinstance(raw, list):
        raise ImageFormatError(ref, "an image index without a `manifests` list")
    found = [Descriptor.parse(x, f"{ref} index entry {i}") for i, x in enumerate(raw)]
    for desc in found:
        if desc.platform and "/".join(desc.platform.split("/")[:2]) == platform:
            return desc
    raise UnsupportedPlatformError(ref, platform, sorted({d.platform or "unspecified" for d in found}))


def parse_config(doc: dict[str, Any], where: str) -> tuple[ImageConfig, tuple[str, ...], str]:
    """The config's runtime part, its diff_ids (one per layer, bottom first) and its os/arch."""
    cfg = doc.get("config") or {}
    if not isinstance(cfg, dict):
        raise ImageFormatError(where, "`config` is not an object")
    env = []
    for item in _strings(cfg.get("Env"), f"{where} Env"):
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ImageFormatError(where, f"Env entry {item!r:.100} is not NAME=value")
        env.append((name, value))
    rootfs = doc.get("rootfs") or {}
    diff_ids = _strings(rootfs.get("diff_ids") if isinstance(rootfs, dict) else None, f"{where} rootfs.diff_ids")
    for d in diff_ids:
        if not DIGEST.fullmatch(d):
            raise ImageFormatError(where, f"diff_id {d!r:.100} is not sha256:<64 hex>")
    config = ImageConfig(
        env=tuple(env),
        working_dir=str(cfg.get("WorkingDir") or "/"),
        user=str(cfg.get("User") or ""),
        entrypoint=_strings(cfg.get("Entrypoint"), f"{where} Entrypoint"),
        cmd=_strings(cfg.get("Cmd"), f"{where} Cmd"),
    )
    platform = f"{doc.get('os', 'linux')}/{doc.get('architecture', 'amd64')}"
    return config, diff_ids, platform


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise ImageFormatError(where, f"not a list of strings: {value!r:.100}")
    return tuple(value)
