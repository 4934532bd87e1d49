"""Field validators shared by the Spec and its mounts: each returns the value
or raises SpecError naming the field."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, Self, TypeAlias, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

from .errors import SpecError

_T = TypeVar("_T")
_D = TypeVar("_D", bound="DataclassInstance")

#: A path as a caller has it: a str or an os.PathLike of one (pathlib.Path); kept as str.
StrPath: TypeAlias = str | os.PathLike[str]


class _Validated(Protocol):
    def __post_init__(self) -> None: ...


def init_fields(obj: _Validated, **values: object) -> None:
    """The body of a frozen dataclass's hand-written __init__ (one that accepts
    what a caller naturally has, a list, a dict, a pathlib.Path, where the
    value keeps a tuple or a str): set each field as given, then run
    __post_init__, which checks and converts them."""
    for name, value in values.items():
        object.__setattr__(obj, name, value)
    obj.__post_init__()


def as_text(value: object) -> object:
    """`value` as a str if it is an os.PathLike of one; anything else as it is."""
    if isinstance(value, os.PathLike):
        try:
            return os.fspath(value)
        except TypeError:  # its __fspath__ returned neither str nor bytes
            return value
    return value


def check_items(field_name: str, value: object, what: str) -> tuple[Any, ...]:
    """The items of a list-like `value` (a list, tuple, set or other iterable,
    but not a str, bytes or a mapping) as a tuple; SpecError saying it must be
    a list of `what` otherwise."""
    if isinstance(value, (str, bytes, bytearray, Mapping)) or not isinstance(value, Iterable):
        raise SpecError(field_name, value, f"must be a list of {what}")
    return tuple(value)


def check_path(field_name: str, value: object) -> str:
    """Return `value` (a str, or an os.PathLike of one, as a str) if it is an
    absolute, NUL-free path without '..' parts."""
    value = as_text(value)
    if not isinstance(value, str):
        raise SpecError(field_name, value, "must be a path (a str or an os.PathLike of one)")
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


MAX_COUNT = 2**63 - 1  # the largest size, count or limit taken: it fits the kernel's 64-bit fields


def check_positive(field_name: str, value: object, allow_none: bool = True) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_COUNT:
        raise SpecError(field_name, value, "must be a positive integer (at most 2**63 - 1)")
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


def valid_env_name(name: object) -> bool:
    """Whether `name` can name an environment variable: a non-empty string
    without '=' (which would end the name) or NUL (which would end the entry)."""
    return isinstance(name, str) and bool(name) and "=" not in name and "\0" not in name


def check_env(field_name: str, value: object) -> tuple[tuple[str, str], ...]:
    """An environment (a mapping of names to values, or (name, value) pairs) as
    sorted pairs; names non-empty without '=' or NUL, values strings without NUL."""
    if isinstance(value, Mapping):
        items: tuple[Any, ...] = tuple(value.items())
    else:
        items = check_items(field_name, value, "(name, value) pairs, or a mapping of names to values")
    out: dict[str, str] = {}
    for pair in items:
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
            raise SpecError(field_name, value, "must be a mapping of names to values")
        name, val = pair
        if not valid_env_name(name):
            raise SpecError(field_name, name, "variable names must be non-empty strings, without '=' or NUL")
        out[name] = check_text(f"{field_name}[{name!r}]", val)
    return tuple(sorted(out.items()))


def check_port(field_name: str, value: object) -> int:
    """A port number 1-65535, from an int or its decimal digits (JSON object keys are strings)."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 5:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise SpecError(field_name, value, "must be a port number (1-65535)")
    return value


def parse_json(field_name: str, text: object) -> Any:
    """The value of JSON `text` (str or bytes); SpecError if it is not JSON."""
    if not isinstance(text, (str, bytes, bytearray)):
        raise SpecError(field_name, text, "must be JSON text (str or bytes)")
    import json  # only here: a run of the command line without --spec reads no JSON

    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than the parser goes
        shown: str | bytes
        if isinstance(text, str):
            shown = text if len(text) < 80 else text[:77] + "..."
        else:
            shown = bytes(text) if len(text) < 80 else bytes(text[:77]) + b"..."
        raise SpecError(field_name, shown, f"is not valid JSON: {exc}") from None


def check_instance(field_name: str, value: object, cls: type[_T], what: str) -> _T:
    """`value` if it is a `cls`; SpecError saying it must be `what` otherwise."""
    if not isinstance(value, cls):
        raise SpecError(field_name, value, f"must be {what}")
    return value


def check_mapping(field_name: str, value: object) -> Mapping[Any, Any] | None:
    """`value` if it is a mapping (an environment) or None."""
    if value is not None and not isinstance(value, Mapping):
        raise SpecError(field_name, value, "must be a mapping of names to values, or None")
    return value


def reject_unknown(where: str, data: Mapping[str, Any], known: set[str]) -> None:
    """SpecError naming the first key of `data` not in `known`."""
    unknown = sorted(set(data) - known, key=str)  # a mapping's keys need not all be str
    if unknown:
        raise SpecError(where, unknown[0], f"unknown key (known: {', '.join(sorted(known))})")


class JsonForm:
    """`to_json` and `from_json` of a description whose JSON form is its `to_dict` / `from_dict`
    (a Spec, a task's Sandbox); `json_name` is what an error calls text that is not JSON."""

    json_name: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, as a dict."""
        raise NotImplementedError

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """Build from `to_dict` output; unknown keys raise SpecError naming the key."""
        raise NotImplementedError

    def to_json(self, indent: int | None = None) -> str:
        """Serialize to JSON text."""
        import json  # only here: a run of the command line never writes JSON

        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Self:
        """Parse JSON text produced by `to_json`."""
        return cls.from_dict(parse_json(cls.json_name, text))


def json_object(where: str, data: object, known: set[str]) -> dict[str, Any]:
    """`data` as a dict, if it is a JSON object with no key outside `known`; SpecError naming `where`
    (or the unknown key) if not."""
    if not isinstance(data, Mapping):
        raise SpecError(where, data, "must be a JSON object")
    reject_unknown(where, data, known)
    return dict(data)


def replaced(obj: _D, where: str, changes: Mapping[str, Any]) -> _D:
    """dataclasses.replace(obj, **changes), validated again; SpecError naming an unknown field."""
    reject_unknown(where, changes, {f.name for f in dataclasses.fields(obj)})
    return dataclasses.replace(obj, **changes)
