"""Plain records for what parsing a command line produces: the equality,
hash, repr and read-only attributes that `@dataclass` would give them.

On Python 3.11 a dataclass compiles its generated methods when its module
is imported, ~0.4 ms for one of ten fields, and a direct run of the command
line imports these modules to parse one command line. A record's fields
are its `__slots__` (set by its own `__init__`); `_COMPARED` names those its
equality and hash cover, as `field(compare=False)` leaves one out.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the import (type checkers read the name)
if TYPE_CHECKING:
    from typing import ClassVar


class Record:
    """Equality over `_COMPARED` between records of one class, a repr of every
    field; unhashable (Python sets __hash__ to None for a class that defines
    __eq__ alone), as a mutable dataclass with equality is."""

    __slots__ = ()
    _COMPARED: ClassVar[tuple[str, ...]] = ()

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()

    def __repr__(self) -> str:
        names: tuple[str, ...] = self.__slots__
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in names)
        return f"{type(self).__name__}({fields})"

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self._COMPARED)


class FrozenRecord(Record):
    """A Record whose fields are set once, by its `__init__` (`_init`), and
    hashed over `_COMPARED`, as a frozen dataclass's."""

    __slots__ = ()

    def _init(self, **values: object) -> None:
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"a {type(self).__name__} is read-only (cannot set {name!r})")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"a {type(self).__name__} is read-only (cannot delete {name!r})")

    def __hash__(self) -> int:
        return hash(self._values())
