"""The command-line grammar of `python -m sandbox run` (bubblewrap 0.8.0's, plus options of this package).

`grammar.py` holds the one table of options and `usage()`, `handlers.py` the
handler of each option, `values.py` how bwrap reads their values, `state.py`
what the handlers gather (and `BwrapArgsError`), `parse.py` reads a
command line into a Spec, `unparse.py` writes a Spec back as one, and
`argv.py` spells the options both writers (and the bwrap backend) emit.
This package is the grammar only; running bwrap is `sandbox.backends.bwrap`.
"""

from __future__ import annotations

from .grammar import usage
from .parse import CliExtras, from_bwrap_args, parse_bwrap_args
from .state import BwrapArgsError
from .unparse import to_bwrap_args

__all__ = ["BwrapArgsError", "CliExtras", "from_bwrap_args", "parse_bwrap_args", "to_bwrap_args", "usage"]
