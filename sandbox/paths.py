"""Facts about host paths, decided once for every layer: whether one lies
below another (lexically), and the symlinks a path leads through."""

from __future__ import annotations

import os
from collections.abc import Iterable

__all__ = ["executable_chain", "is_under", "root_holding"]


def is_under(path: str, top: str) -> bool:
    """Whether `path` is `top` or lies below it (lexically: both absolute and
    normalized, no `..`; "/a/bc" is not under "/a/b"; everything is under "/")."""
    return path == top or path.startswith(top.rstrip("/") + "/")


def root_holding(path: str, roots: Iterable[str]) -> str | None:
    """The first of `roots` that `path` is or lies below, if any."""
    return next((root for root in roots if is_under(path, root)), None)


def executable_chain(path: str) -> list[str]:
    """`path` and every symlink it leads through, ending at the real file."""
    chain: list[str] = []
    while path not in chain:
        chain.append(path)
        if not os.path.islink(path):
            break
        path = os.path.normpath(os.path.join(os.path.dirname(path), os.readlink(path)))
    return chain
