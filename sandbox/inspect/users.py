"""`user=` of Inspect's exec: the keyword a Session takes for it.

A name or uid is resolved by the Session in the sandbox's own /etc/passwd
(`Session.exec(user=)`, docs/session.md); a name it does not know is a
failed command (exit 126, as `docker exec --user` reports it), not an
exception, as Inspect's contract asks (`unknown_user_result`).
"""

from __future__ import annotations

from inspect_ai.util import ExecResult

from ..errors import SessionUserError


def user_option(user: str | None) -> dict[str, str]:
    """The keyword to pass the Session for `user` (none for the default user)."""
    return {} if user is None else {"user": user}


def unknown_user_result(user: str | None, exc: SessionUserError) -> ExecResult[str]:
    """What a command for a user the sandbox cannot run as returns."""
    return ExecResult(success=False, returncode=126, stdout="", stderr=f"unable to find user {user}: {exc}\n")
