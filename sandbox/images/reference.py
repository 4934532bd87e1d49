"""Image references: `[registry[:port]/]repository[:tag][@sha256:hex]`, parsed and normalized.

Docker's rules: a first component with a `.` or a `:`, or `localhost`, is a
registry; otherwise the registry is docker.io, where a one-component name is
under `library/`. No tag and no digest means `:latest`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import InvalidReferenceError

DEFAULT_REGISTRY = "docker.io"
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_REGISTRY = re.compile(r"(?:[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?")


@dataclass(frozen=True)
class Reference:
    """A parsed reference. `str()` gives its normalized form, the name the store keeps."""

    registry: str
    repository: str
    tag: str | None
    digest: str | None

    @property
    def name(self) -> str:
        """registry/repository, without tag or digest."""
        return f"{self.registry}/{self.repository}"

    @property
    def reference(self) -> str:
        """What the registry's manifest endpoint takes: the digest if there is one, else the tag."""
        return self.digest or self.tag or "latest"

    def __str__(self) -> str:
        out = self.name
        if self.tag:
            out += f":{self.tag}"
        if self.digest:
            out += f"@{self.digest}"
        return out


def parse(ref: str) -> Reference:
    """Parse and normalize `ref`; InvalidReferenceError names what is wrong."""
    if not isinstance(ref, str) or not ref:
        raise InvalidReferenceError(str(ref), "empty")
    rest, digest = ref, None
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        if not DIGEST.fullmatch(digest):
            raise InvalidReferenceError(ref, f"digest {digest!r} is not sha256: and 64 lowercase hex digits")
    tag = None
    slash = rest.rfind("/")
    if ":" in rest[slash + 1:]:
        rest, tag = rest.rsplit(":", 1)
        if not _TAG.fullmatch(tag):
            raise InvalidReferenceError(ref, f"tag {tag!r} is not a valid tag")
    parts = rest.split("/")
    if len(parts) > 1 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
        registry, parts = parts[0], parts[1:]
        if not _REGISTRY.fullmatch(registry):
            raise InvalidReferenceError(ref, f"registry {registry!r} is not host[:port]")
    else:
        registry = DEFAULT_REGISTRY
    if registry == DEFAULT_REGISTRY and len(parts) == 1:
        parts = ["library", *parts]
    for part in parts:
        if not _COMPONENT.fullmatch(part):
            raise InvalidReferenceError(ref, f"repository component {part!r} is not lowercase [a-z0-9._-]")
    if tag is None and digest is None:
        tag = "latest"
    return Reference(registry, "/".join(parts), tag, digest)
