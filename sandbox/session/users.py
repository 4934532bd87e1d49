"""`user=` of a Session's call: a name or id resolved in the session, never on the host.

The session's own /etc/passwd and /etc/group are read through its root
handle (files.Root: openat2 RESOLVE_IN_ROOT, so a link a command planted
there cannot lead to the host's), parsed as the C library's files backend
parses them, and the result checked against the ids the session maps
(session/ids.py). A command can write those files (a session's root may
be writable): what it plants there names ids of the session, nothing
more. A name for uid 0 is the session's root, which holds no capability
the Spec does not grant; a name for an id outside the mapped range is
refused here, and the kernel refuses it too (setresuid: EINVAL).
"""

from __future__ import annotations

import errno as E
from dataclasses import dataclass

from ..errors import SessionUserError
from .files import Root
from .ids import SessionIds

MAX_DB_BYTES = 4 << 20  # /etc/passwd or /etc/group larger than this is refused
MAX_GROUPS = 64  # csrc/core/sandbox.h's SBX_SESSION_MAX_GROUPS
MAX_ID = 0xFFFFFFFE  # (uid_t)-1 means "unchanged" to the kernel


@dataclass(frozen=True)
class Ids:
    """A command's ids inside the session: uid, gid and supplementary groups."""

    uid: int
    gid: int
    groups: tuple[int, ...]


def resolve(user: str | int, root: Root, ids: SessionIds) -> Ids:
    """The ids `user` (a name of the session's /etc/passwd, or a uid) runs
    as: its passwd entry's gid (a uid without one: the session's gid) and
    the mapped groups /etc/group lists it in. Raises SessionUserError naming
    the user, or the id and the mapped range."""
    if isinstance(user, bool) or not isinstance(user, (str, int)):
        raise SessionUserError(f"user={user!r}: must be a user name or a uid")
    if isinstance(user, str) and (not user or any(c in user for c in ":\n\0")):
        raise SessionUserError(f"user={user!r}: not a user name")
    passwd = _entries(root, "/etc/passwd", 7)
    entry = next((e for e in passwd if e[0] == user), None) if isinstance(user, str) else None
    if entry is None and (isinstance(user, int) or user.isdigit()):
        uid = int(user)
        if not 0 <= uid <= MAX_ID:
            raise SessionUserError(f"user={user!r}: not a uid (0 to {MAX_ID})")
        entry = next((e for e in passwd if _number(e[2]) == uid), None)
        if entry is None:
            return _checked(Ids(uid, ids.gids.own, ()), user, ids)
    if entry is None:
        raise SessionUserError(f"user={user!r}: no such user in the session's /etc/passwd")
    number, gid = _number(entry[2]), _number(entry[3])
    if number is None or gid is None:
        raise SessionUserError(f"user={user!r}: its /etc/passwd entry has no numeric uid and gid")
    groups = [g for g in _member_of(root, entry[0]) if g != gid and g in ids.gids]
    if len(groups) > MAX_GROUPS:
        raise SessionUserError(f"user={user!r}: in {len(groups)} groups, more than the {MAX_GROUPS} a call takes")
    return _checked(Ids(number, gid, tuple(dict.fromkeys(groups))), user, ids)


def _checked(found: Ids, user: str | int, ids: SessionIds) -> Ids:
    if found.uid not in ids.uids:
        raise SessionUserError(f"user={user!r}: uid {found.uid} is not mapped in the session "
                               f"(its uids: {ids.uids.words()})")
    if found.gid not in ids.gids:
        raise SessionUserError(f"user={user!r}: gid {found.gid} is not mapped in the session "
                               f"(its gids: {ids.gids.words()})")
    return found


def _member_of(root: Root, name: str) -> list[int]:
    found = []
    for entry in _entries(root, "/etc/group", 4):
        gid = _number(entry[2])
        if gid is not None and name in entry[3].split(","):
            found.append(gid)
    return found


def _entries(root: Root, path: str, n_fields: int) -> list[list[str]]:
    """The well-formed lines of a colon-separated file of the session (none if it is missing)."""
    try:
        data = root.read_file(path, MAX_DB_BYTES)
    except FileNotFoundError:
        return []
    except OSError as exc:
        why = "larger than 4 MiB" if exc.errno == E.EFBIG else exc.strerror
        raise SessionUserError(f"the session's {path} cannot be read: {why}") from None
    out = []
    for line in data.decode("utf-8", errors="replace").splitlines():
        fields = line.split(":")
        if len(fields) == n_fields and fields[0] and not fields[0].startswith(("+", "-", "#")):
            out.append(fields)
    return out


def _number(text: str) -> int | None:
    return int(text) if text.isdigit() and int(text) <= MAX_ID else None
