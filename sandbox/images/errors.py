"""The typed errors of sandbox.images: every one is an ImageError, a SandboxError.

Each names what it is about (the reference, the digest, the path inside a
layer, the media type) in its attributes and in its message.
"""

from __future__ import annotations

from ..errors import SandboxError


class ImageError(SandboxError):
    """Base class of the image store's errors."""


class InvalidReferenceError(ImageError, ValueError):
    """An image reference (`name[:tag][@digest]`) cannot be parsed. `ref` holds it."""

    def __init__(self, ref: str, problem: str) -> None:
        self.ref = ref
        super().__init__(f"image reference {ref!r}: {problem}")


class ImageNotFoundError(ImageError, LookupError):
    """No image by that reference: not in the store (get, remove), not in the
    archive, or the registry says it has none (pull). `ref` holds it."""

    def __init__(self, ref: str, where: str) -> None:
        self.ref = ref
        super().__init__(f"no image {ref!r} {where}")


class DigestMismatchError(ImageError):
    """Content did not hash to the digest that names it (a manifest, a config,
    a blob, an unpacked layer's diff_id): nothing of it was kept."""

    def __init__(self, what: str, expected: str, actual: str) -> None:
        self.what = what
        self.expected = expected
        self.actual = actual
        super().__init__(f"{what}: expected digest {expected}, the content hashes to {actual}; nothing was kept")


class UnsupportedMediaTypeError(ImageError):
    """A manifest, config or layer of a kind this store cannot use."""

    def __init__(self, what: str, media_type: str, supported: tuple[str, ...]) -> None:
        self.what = what
        self.media_type = media_type
        super().__init__(f"{what}: unsupported media type {media_type!r} (supported: {', '.join(supported)})")


class UnsupportedPlatformError(ImageError):
    """An image index has no manifest for the wanted platform. `available`
    lists the platforms it has."""

    def __init__(self, ref: str, wanted: str, available: list[str]) -> None:
        self.ref = ref
        self.wanted = wanted
        self.available = available
        super().__init__(f"image {ref!r} has no {wanted} manifest (it has: {', '.join(available) or 'none'})")


class ImageFormatError(ImageError):
    """An archive, layout, manifest or config is malformed. `source` names it."""

    def __init__(self, source: str, problem: str) -> None:
        self.source = source
        super().__init__(f"{source}: {problem}")


class RegistryError(ImageError):
    """A registry could not be reached or answered with an error (`status`, 0
    when there was no HTTP answer), or a download was cut short."""

    def __init__(self, url: str, problem: str, status: int = 0) -> None:
        self.url = url
        self.status = status
        super().__init__(f"{url}: {problem}")


class AuthError(RegistryError):
    """The registry refused the credentials, or wants ones that were not given."""


class UnsafeLayerError(ImageError):
    """A layer tries to write outside its directory (`../`, a path through a
    symlink it made, a hardlink to a missing or outside target, a whiteout of
    `..`) or is too big. `layer` is its digest, `member` the path in the tar.
    Nothing of the layer was kept."""

    def __init__(self, layer: str, member: str, problem: str) -> None:
        self.layer = layer
        self.member = member
        super().__init__(f"layer {layer}: member {member!r}: {problem}; nothing of the layer was kept")


class StoreFullError(ImageError, OSError):
    """The store's file system is full (ENOSPC, EDQUOT) or a file size limit
    was hit (EFBIG): the pull or load was undone, nothing half-written kept."""

    def __init__(self, errno: int, path: str, strerror: str) -> None:
        super().__init__(errno, f"image store at {path}: {strerror}; the pull or load was undone")
        self.filename = path
