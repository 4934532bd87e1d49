"""A Session with users of its own (an /etc/passwd and /etc/group written into it): the world of the tests of
Session users (tests/integration/test_session_users.py) and of their attacks
(tests/adversarial/test_session_user_attacks.py); `sh`, a shell line in a Session (test_session.py's too)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from conftest import make_base_spec

import sandbox
from sandbox.mounts import File, Tmpfs


def users_world(passwd: str, group: str, perms: int, **fields: object) -> sandbox.Spec:
    """The base world with `passwd` and `group` (of mode `perms`) and a shared sticky /work."""
    return make_base_spec(File("/etc/passwd", passwd, perms=perms), File("/etc/group", group, perms=perms),
                          Tmpfs("/work", perms=0o1777), **fields)  # type: ignore[arg-type]


@contextmanager
def several_ids(spec: sandbox.Spec, otherwise: str) -> Iterator[sandbox.Session]:
    """A Session of `spec`; the test skipped, saying `otherwise`, where this caller maps one id."""
    with sandbox.Session(spec) as s:
        if not s.ids.several:
            pytest.skip(f"this caller maps one id ({sandbox.probe().ids}): {otherwise}")
        yield s


def sh(s: sandbox.Session, script: str, **kw: object) -> sandbox.CompletedProcess:
    """`sh -c script` in `s`, text captured, within a minute."""
    return s.exec(["sh", "-c", script], capture_output=True, text=True, timeout=60, **kw)  # type: ignore[arg-type]
