"""A Session request's user fields (sandbox/session/wire.py), read back through the cdef."""

from __future__ import annotations

import pytest

from sandbox._core.binding import ffi, lib
from sandbox.errors import SpecError
from sandbox.session import wire


def header(data: bytes) -> object:
    return ffi.cast("struct sbx_session_request *", ffi.from_buffer(data))


def test_user_ids_travel_in_the_header() -> None:
    h = header(wire.request("/usr/bin", "", ["id"], [], quiet=True, ids=(1000, 1001, (2000, 2001))))
    assert h.flags == lib.SBX_SESSION_QUIET | lib.SBX_SESSION_USER  # type: ignore[attr-defined]
    assert (h.uid, h.gid, h.n_groups, list(h.groups[0:2])) == (1000, 1001, 2, [2000, 2001])  # type: ignore[attr-defined]
    plain = header(wire.request("/usr/bin", "", ["id"], []))
    assert plain.flags == 0 and plain.n_groups == 0  # type: ignore[attr-defined]


def test_too_many_groups_is_refused_before_sending() -> None:
    with pytest.raises(SpecError, match="at most 64"):
        wire.request("/usr/bin", "", ["id"], [], ids=(1000, 1000, tuple(range(65))))
