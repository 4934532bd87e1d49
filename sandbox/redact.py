"""The one redaction rule for what the package prints or keeps: key-like values become `<NAME>`.

A variable whose name looks like a credential (`*_API_KEY`, `*_KEY`,
`*_TOKEN`, `*_SECRET`) and whose value is at least 16 characters long is a
secret: wherever its value appears in a record (sandbox.task.records), in
`explain()` or in `--dry-run`'s output, it is replaced by the variable's name
in angle brackets (`<OPENAI_API_KEY>`). Shorter values are left alone (a
value like `1` would otherwise be replaced everywhere).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from typing import Any

KEY_PATTERNS = ("*_API_KEY", "*_KEY", "*_TOKEN", "*_SECRET")
MIN_SECRET = 16
SHOW_SECRETS_ENV = "SANDBOX_SHOW_SECRETS"  # "1": the CLI's --dry-run prints values as they are


def is_secret(name: str, value: str) -> bool:
    """Whether the variable `name`=`value` is redacted."""
    return len(value) >= MIN_SECRET and any(fnmatch.fnmatchcase(name, p) for p in KEY_PATTERNS)


def secrets_of(*environs: Mapping[str, str]) -> dict[str, str]:
    """value -> name of each key-like variable of `environs` (longest values
    first, so a secret that contains another is replaced whole)."""
    found = {v: k for environ in environs for k, v in environ.items() if is_secret(k, v)}
    return dict(sorted(found.items(), key=lambda kv: len(kv[0]), reverse=True))


def env_of(assignments: Iterable[str]) -> dict[str, str]:
    """`NAME=value` strings (a Plan's environment) as a mapping."""
    return dict(a.split("=", 1) for a in assignments if "=" in a)


def scrub(value: Any, secrets: Mapping[str, str]) -> Any:
    """`value` (text, or JSON-ready data) with every secret replaced by `<NAME>`, in keys and values alike."""
    if isinstance(value, str):
        for secret, name in secrets.items():
            value = value.replace(secret, f"<{name}>")
        return value
    if isinstance(value, Mapping):
        return {scrub(k, secrets): scrub(v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub(v, secrets) for v in value]
    return value


def redact(text: str, *environs: Mapping[str, str]) -> str:
    """`text` with the value of each key-like variable of `environs` replaced by `<NAME>`."""
    return str(scrub(text, secrets_of(*environs)))
