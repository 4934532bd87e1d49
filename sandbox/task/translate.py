"""Paths between host and sandbox: argv, env values and chdir rewritten, relative(), outside().

A host path under a shown source is rewritten to where the sandbox sees it:
by path component (`/a/b` does not match `/a/bc`), the longest source
winning, also after `=` in `--opt=/path` and inside `:`-separated lists.
Grants shown at their own location map to themselves, so a granted path
inside a bind's source keeps its name when it is the more specific one.
Pure string work, except `outside()`, which resolves links on the host to
refuse a path that escapes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence

from ..errors import SpecError
from ..paths import is_under
from .description import Sandbox, check_sandbox


def _swap(path: str, old: str, new: str) -> str:
    rest = path[len(old):] if old != "/" else path[1:] if path != "/" else ""
    rest = rest.lstrip("/")
    return new if not rest else new.rstrip("/") + "/" + rest


class Translator:
    """Rewrites host paths to sandbox paths for one description."""

    def __init__(self, mapping: Iterable[tuple[str, str]], layout: tuple[str, str] | None = None) -> None:
        # longest source first: the most specific grant wins
        self.mapping = sorted(dict(mapping).items(), key=lambda kv: len(kv[0]), reverse=True)
        self.layout = layout

    @classmethod
    def of(cls, sb: Sandbox) -> Translator:
        """The translator of `sb`: its binds, and its read/write grants (each at its own location)."""
        check_sandbox(sb)
        pairs = [(p, p) for p in (*sb.read, *sb.write)] + [(b.source, b.target) for b in sb.binds]
        layout = (sb.layout.outside, sb.layout.inside) if sb.layout is not None else None
        return cls(pairs, layout)

    # ------------------------------------------------------------ host -> inside

    def path(self, path: str) -> str:
        """`path` as the sandbox sees it if it lies under a shown source, else unchanged."""
        if not path.startswith("/"):
            return path
        norm = os.path.normpath(path)
        for src, dst in self.mapping:
            if is_under(norm, src):
                out = _swap(norm, src, dst)
                return out + "/" if path.endswith("/") and out != "/" else out
        return path

    def word(self, text: str) -> str:
        """One argv element or env value: a path, `--opt=/path`, or a `:`-list of either."""
        if ":" in text and not _is_url(text):
            return ":".join(self.word(part) for part in text.split(":"))
        if text.startswith("/"):
            return self.path(text)
        if "=" in text:
            head, _, tail = text.partition("=")
            if tail.startswith("/") or ":" in tail:
                return head + "=" + self.word(tail)
        return text

    def argv(self, argv: Sequence[str]) -> list[str]:
        """Every element rewritten."""
        return [self.word(a) for a in argv]

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        """Every value rewritten."""
        return {k: self.word(v) for k, v in env.items()}

    # ------------------------------------------------------------ learner's view

    def relative(self, host_path: str) -> str:
        """`host_path` relative to the layout's inside root, as a learner is told it."""
        if self.layout is None:
            raise SpecError("layout", None, "relative() needs a layout")
        outside_root, inside_root = self.layout
        norm = os.path.normpath(host_path)
        if is_under(norm, outside_root):
            inside = _swap(norm, outside_root, inside_root)
        else:
            inside = self.path(norm)
        if not is_under(inside, inside_root):
            raise SpecError("path", host_path, f"is not under the layout's root {outside_root}")
        return os.path.relpath(inside, inside_root)

    def outside(self, inside_path: str) -> str:
        """The host path for a path the learner names (relative ones against
        the layout's inside root). SpecError for a path under no bind or
        layout, or one that escapes with `..` or a link."""
        if not inside_path.startswith("/"):
            if self.layout is None:
                raise SpecError("path", inside_path, "is relative, and there is no layout to resolve it against")
            joined = os.path.join(self.layout[1], inside_path)
        else:
            joined = inside_path
        raw = "/" + "/".join(p for p in joined.split("/") if p and p != ".")
        norm = os.path.normpath(joined)
        for host_root, inside_root in self._reverse():
            if not is_under(raw, inside_root):
                continue
            if not is_under(norm, inside_root):
                raise SpecError("path", inside_path, f"escapes {inside_root} with '..'")
            host = _swap(norm, inside_root, host_root)
            real, real_root = os.path.realpath(host), os.path.realpath(host_root)
            if not is_under(real, real_root):
                raise SpecError("path", inside_path, f"leads out of {inside_root} through a link")
            return host
        raise SpecError("path", inside_path, "is under no bind or layout of this sandbox")

    def _reverse(self) -> list[tuple[str, str]]:
        pairs = [(src, dst) for src, dst in self.mapping]
        if self.layout is not None:
            pairs.append(self.layout)
        return sorted(pairs, key=lambda kv: len(kv[1]), reverse=True)


def _is_url(text: str) -> bool:
    head = text.split(":", 1)[0]
    return text[len(head):].startswith("://") and head.replace("+", "").replace("-", "").replace(".", "").isalnum()
