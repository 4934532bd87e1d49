"""`user=` of Inspect's exec: which users a Session can run a command as.

Every command runs as the sandbox's own user (root of its user namespace,
with no capability) unless the Session can switch users: `Session.exec`
with a `user` parameter (issue 37's users). Until then a command for another
user raises SandboxUserUnsupportedError, which Inspect's contract names for
"this configuration cannot run as that user" (its tools then run as the
default user). `SESSION_HAS_USERS` is the one place that decides it.
"""

from __future__ import annotations

import inspect

from inspect_ai.util import SandboxUserUnsupportedError

from ..session import Session

SESSION_HAS_USERS = "user" in inspect.signature(Session.astart).parameters
DEFAULT_USERS = frozenset({"root", "0"})


def user_option(user: str | None) -> dict[str, str]:
    """The keyword to pass the Session for `user` (none for the default user)."""
    if user is None or user in DEFAULT_USERS:
        return {}
    if SESSION_HAS_USERS:
        return {"user": user}
    raise SandboxUserUnsupportedError(
        f"nsbox cannot run a command as {user!r}: its sessions run every command as root of the sandbox's "
        "user namespace (uid 0, no capability); another user needs Session.exec(user=)")
