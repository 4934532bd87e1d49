"""Field validators shared by the Spec and its mounts: each returns the value
or raises SpecError naming the field."""

from __future__ import annotations

from .errors import SpecError


def check_path(field_name: str, value: object) -> str:
    """Return `value` if it is an absolute, NUL-free path without '..' parts."""
    if not isinstance(value, str):
        raise SpecError(field_name, value, "must be a string path")
    if not value.startswith("/"):
        raise SpecError(field_name, value, "must be an absolute path")
    if "\0" in value:
        raise SpecError(field_name, value, "contains a NUL byte")
    if ".." in value.split("/"):
        raise SpecError(field_name, value, "must not contain '..'")
    return value


def normalize_path(path: str) -> str:
    """Collapse repeated and trailing slashes and '.' parts ('/a//b/./' -> '/a/b')."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    return "/" + "/".join(parts)


def check_perms(field_name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0o7777:
        raise SpecError(field_name, value, "must be an integer mode between 0 and 0o7777")
    return value


def check_positive(field_name: str, value: object, allow_none: bool = True) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SpecError(field_name, value, "must be a positive integer")
    return value


def check_text(field_name: str, value: object) -> str:
    if not isinstance(value, str):
        raise SpecError(field_name, value, "must be a string")
    if "\0" in value:
        raise SpecError(field_name, value, "contains a NUL byte")
    return value


def check_bool(field_name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise SpecError(field_name, value, "must be true or false")
    return value
