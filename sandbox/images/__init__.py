"""sandbox.images: container images as sandbox roots, with no daemon and no root.

    from sandbox.images import ImageStore
    store = ImageStore()                          # $SANDBOX_IMAGES, else ~/.cache/sandbox/images
    img = store.load("build/oci-layout")          # an OCI layout, an OCI archive or a `docker save` tarball
    img = store.pull("registry.example/app:1.2")  # the OCI distribution API over HTTPS
    img.layers[0].path, img.config.env, img.config.argv

Layers are unpacked once each, into a directory of their own, with
whiteouts recorded beside the tree; a hostile layer cannot write outside
its directory. `sandbox.presets.image(img)` makes an image a sandbox's
root: its layers made overlay-ready once (`store.overlay_ready`) and
stacked by overlayfs in the sandbox's user namespace, or merged once into
one tree of hardlinks (`store.merged`). docs/images.md has the details.
"""

from .errors import (
    AuthError,
    DigestMismatchError,
    ImageError,
    ImageFormatError,
    ImageNotFoundError,
    InvalidReferenceError,
    RegistryError,
    StoreFullError,
    UnsafeLayerError,
    UnsupportedMediaTypeError,
    UnsupportedPlatformError,
)
from .model import Image, ImageConfig, Layer
from .reference import Reference, parse
from .store import GcResult, ImageStore, default_path

__all__ = [
    "AuthError",
    "DigestMismatchError",
    "GcResult",
    "Image",
    "ImageConfig",
    "ImageError",
    "ImageFormatError",
    "ImageNotFoundError",
    "ImageStore",
    "InvalidReferenceError",
    "Layer",
    "Reference",
    "RegistryError",
    "StoreFullError",
    "UnsafeLayerError",
    "UnsupportedMediaTypeError",
    "UnsupportedPlatformError",
    "default_path",
    "parse",
]
