"""A package's names imported from their submodules on first use (PEP 562).

A package whose `__init__` imports its submodules eagerly makes every user pay
for all of them; with `__getattr__ = lazy_getattr(__name__, {name: submodule})`
a name is imported when it is first asked for, then kept in the package, so
later lookups never reach `__getattr__` again.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (type checkers read the name)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping


def lazy_getattr(package: str, exports: Mapping[str, str]) -> Callable[[str], object]:
    """A module `__getattr__` for `package`: `exports` maps each name to the submodule that defines it."""

    def __getattr__(name: str) -> object:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        from importlib import import_module

        value = getattr(import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
