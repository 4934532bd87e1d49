"""The one reader of a header's CDEF region: the text cffi is given, for the core and the client's wire alike.

A header of csrc/ that Python reads marks the declarations cffi takes between
`/* CDEF BEGIN */` and `/* CDEF END */`: csrc/core/sandbox.h (the compiled core,
read by build_ffi.py at build time) and csrc/client/cliwire.h (installed beside the
executables and read at run time by _core/cliwire.py). build_ffi.py loads
this file by path, so it imports nothing of the package.
"""

from __future__ import annotations

import os
import re

REGION = re.compile(r"/\* CDEF BEGIN \*/(.*)/\* CDEF END \*/", re.S)

__all__ = ["read_cdef"]


def read_cdef(header: str | os.PathLike[str]) -> str:
    """The text between the CDEF BEGIN/END markers of `header`; RuntimeError naming the header if it
    is missing or has no such region."""
    try:
        with open(header) as f:
            text = f.read()
    except FileNotFoundError:
        raise RuntimeError(f"{header} is missing: the source tree is incomplete (an sdist must carry csrc/)") from None
    match = REGION.search(text)
    if not match:
        raise RuntimeError(f"{header}: no CDEF BEGIN/END region")
    return match.group(1)
