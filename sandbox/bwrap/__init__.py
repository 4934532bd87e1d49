"""The command-line grammar of `python -m sandbox run` (bubblewrap 0.8.0's, plus options of this package).

`grammar.py` holds the one table of options and `usage()`, `handlers.py` the
handler of each option, `values.py` how bwrap reads their values, `state.py`
what the handlers gather (and `BwrapArgsError`), `parse.py` reads a
command line into a Spec, `unparse.py` writes a Spec back as one, and
`argv.py` spells the options both writers (and the bwrap backend) emit.
This package is the grammar only; running bwrap is `sandbox.backends.bwrap`.
The names below are imported from their module on first use (PEP 562).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (type checkers read the name)
if TYPE_CHECKING:
    from .grammar import usage
    from .parse import CliExtras, from_bwrap_args, parse_bwrap_args
    from .state import BwrapArgsError
    from .unparse import to_bwrap_args

BWRAP_RELEASE = "0.8.0"  # the bubblewrap release whose command line this grammar is (what `bwrap --version` says)

_EXPORTS = {"BwrapArgsError": "state", "CliExtras": "parse", "from_bwrap_args": "parse",
            "parse_bwrap_args": "parse", "to_bwrap_args": "unparse", "usage": "grammar"}


# sandbox.lazy's lazy_getattr, written out: `sandbox --version` imports this package and nothing more
# (tests/unit/test_cold_path.py); one more module is 0.13 ms of python -X importtime.
def __getattr__(name: str) -> object:
    """A name of `__all__`, imported from its module on first use (then kept here)."""
    from importlib import import_module

    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = ["BwrapArgsError", "CliExtras", "from_bwrap_args", "parse_bwrap_args", "to_bwrap_args", "usage"]
