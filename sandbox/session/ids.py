"""The ids a Session's user namespace maps, and how its caller writes them.

A sandbox of the Spec maps one id: the caller's, seen inside as the Spec's
uid and gid. A Session maps a range, so that `exec(user=...)` can run a
command as another user of its own /etc/passwd:

- a root caller: the inside ids 0..65535. The Spec's uid (and gid) is the
  caller itself, as in any sandbox; every other inside id N is host id
  HIGH_BASE + a position, far above any user a host makes (systemd keeps
  0x00080000..0x6FFFFFFF for containers; this range starts above it). So a
  session's "alice" is no host user: it owns nothing of the host's and
  reaches through a bind only what is world-accessible. The range is
  shared by every session of root callers (their pid namespaces keep them
  from signalling each other; a directory bound writable into two of them
  is shared, as any bind is);
- an unprivileged caller: its first /etc/subuid and /etc/subgid range (at
  most 65536 ids), written by the setuid helpers newuidmap and newgidmap,
  beside its own id: the ids the host's administrator gave that user;
- otherwise (no user namespace, `disable_userns`, no range or no helper,
  a seccomp filter that denies what a call process does to take a user,
  or an unprivileged caller's Spec that needs a pooled network namespace:
  `without_pool`): one id, as in any sandbox: `user=` can name only that one.

The setup child waits (the Sync's userns_block_fd, bwrap's
--userns-block-fd) while the caller writes the maps; it then keeps them as
they are: no nested user namespace. That stays safe because nothing in
the session holds a capability the Spec does not grant: the setup child
drops everything but the Spec's set and CAP_SETUID/CAP_SETGID/CAP_SETPCAP
before exec'ing pid 1 (no_new_privs, Landlock and seccomp as in any
sandbox), and each call process drops those three, bounding set included,
before its command exists (csrc/session/session_user.c); a command can then own
no capability over the namespaces the session's user namespace owns.

setgroups(2) stays allowed in a session with a range (root writes the maps;
newgidmap allows it for a user the host gave a subgid range): a call with
`user=` sets the groups the session's /etc/group lists, which drops the
caller's own supplementary groups, so a negative group ACL on a host file
bound in no longer holds against that command. A call without `user=` keeps
them, as any sandbox's command does.
"""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

from .. import syscalls
from ..errors import SessionError
from ..host import HostInfo
from ..plan import Plan
from ..spec import Spec
from ..subids import ROOT_COUNT, helper, subordinate

HIGH_BASE = 0x70000000  # where a root caller's other ids start on the host
HELPER_TIMEOUT = 10.0


@dataclass(frozen=True)
class IdMap:
    """One map (uids or gids): the caller's own id seen inside as `own`, and
    `count` more inside ids: 0, 1, ... skipping `own`, on host ids
    `base`, `base + 1`, ..."""

    own: int
    host: int
    base: int = 0
    count: int = 0

    def extents(self) -> Iterator[tuple[int, int, int]]:
        """(inside, outside, count) lines, as uid_map takes them."""
        yield self.own, self.host, 1
        if self.own >= self.count:  # own lies above the others: 0..count-1 in one line
            if self.count:
                yield 0, self.base, self.count
            return
        if self.own:
            yield 0, self.base, self.own
        yield self.own + 1, self.base + self.own, self.count - self.own

    def __contains__(self, inside: object) -> bool:
        return isinstance(inside, int) and (inside == self.own or 0 <= inside < self.count + (self.own < self.count))

    def host_id(self, inside: int) -> int:
        """The host id an inside id is (ValueError if it is not mapped)."""
        for first, outside, n in self.extents():
            if first <= inside < first + n:
                return outside + inside - first
        raise ValueError(f"id {inside} is not mapped (the mapped ids: {self.words()})")

    def text(self) -> str:
        """What /proc/PID/uid_map (gid_map) is written."""
        return "".join(f"{a} {b} {n}\n" for a, b, n in self.extents())

    def words(self) -> str:
        """The inside ids, for an error: "0-65535" or "1000"."""
        if not self.count:
            return str(self.own)
        top = self.count if self.own < self.count else self.count - 1
        return f"0-{top}" if self.own <= top else f"0-{top} and {self.own}"


@dataclass(frozen=True)
class SessionIds:
    """What a session maps: its uid and gid maps and how they get written
    ("root", "newuidmap", or "" for one id: the sandbox's own maps)."""

    uids: IdMap
    gids: IdMap
    how: str = ""

    @property
    def several(self) -> bool:
        """Whether more than one id is mapped."""
        return bool(self.how)

    def words(self) -> str:
        """probe's words: "range N (newuidmap)" or "one id"."""
        if not self.several:
            return "one id"
        return f"range {self.uids.count + 1} ({self.how})"


def one_id(plan: Plan) -> SessionIds:
    """The sandbox's own maps: the Spec's uid and gid, nothing else."""
    return SessionIds(IdMap(plan.uid, plan.host_uid), IdMap(plan.gid, plan.host_gid))


def session_ids(plan: Plan, host: HostInfo) -> SessionIds:
    """The ids a Session of `plan` maps on this host (see the module's text)."""
    if not plan.user_ns or plan.disable_userns or not allows_switch(plan.seccomp):
        return one_id(plan)
    if host.is_root:
        return SessionIds(IdMap(plan.uid, plan.host_uid, HIGH_BASE, ROOT_COUNT),
                          IdMap(plan.gid, plan.host_gid, HIGH_BASE, ROOT_COUNT), "root")
    sub = subordinate(plan.host_uid, plan.host_gid)
    if sub is None:
        return one_id(plan)
    (ubase, ucount), (gbase, gcount) = sub
    return SessionIds(IdMap(plan.uid, plan.host_uid, ubase, ucount),
                      IdMap(plan.gid, plan.host_gid, gbase, gcount), "newuidmap")


PR_SET_DUMPABLE, PR_SET_KEEPCAPS, PR_CAPBSET_DROP, PR_CAP_AMBIENT = 4, 8, 24, 47
PR_CAP_AMBIENT_RAISE, PR_CAP_AMBIENT_CLEAR_ALL = 2, 4
# What a call process does under the session's filter to take a user (csrc/session/session_user.c).
SWITCH_CALLS: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("prctl", (PR_CAPBSET_DROP, 0)), ("prctl", (PR_CAPBSET_DROP, 40)), ("prctl", (PR_SET_KEEPCAPS, 1)),
    ("prctl", (PR_SET_KEEPCAPS, 0)), ("prctl", (PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)),
    ("prctl", (PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, 10)), ("prctl", (PR_SET_DUMPABLE, 0)),
    *((name, (n, n, n)) for name in ("setresuid", "setresgid") for n in (0, 1000, 0xFFFFFFFE)),
    ("setgroups", (0, 0)), ("setgroups", (2, 0x7FFFF000)),
    ("capset", (0x7FFFF000, 0x7FFFF100)),
)


def allows_switch(prog: bytes) -> bool:
    """Whether the Spec's seccomp filter (pid 1's, inherited by its call
    processes) allows what a call process does to take a user: if not, the
    session maps one id rather than fail every call."""
    if not prog:
        return True
    # lazy: a Spec's filter only: seccomp's evaluator, 1.3 ms (import timed, median of 7) for a Session without one
    from ..seccomp.bpf import SECCOMP_RET_ACTION_FULL, SECCOMP_RET_ALLOW
    from ..seccomp.debug import evaluate

    numbers = syscalls.table()
    for name, args in SWITCH_CALLS:
        nr = numbers.get(name)
        if nr is not None and evaluate(prog, nr, args) & SECCOMP_RET_ACTION_FULL != SECCOMP_RET_ALLOW:
            return False
    return True


def without_pool(spec: Spec, plan: Plan, host: HostInfo, ids: SessionIds) -> tuple[Plan, SessionIds]:
    """The plan and ids of a session with a range when the plan leases a
    pooled network namespace. An unprivileged caller's pooled namespaces
    are owned by a user namespace that maps its one id, and a child user
    namespace can only map ids its parent maps: such a session gets a fresh
    network namespace of its own instead (as the Spec's defaults would
    without a pool), or one id where the Spec needs the pool (network="pool",
    a check or forwarded ports)."""
    if not ids.several or plan.network != "pool" or host.is_root:
        return plan, ids
    if spec.network == "pool" or plan.check_network:
        return plan, one_id(plan)
    return dataclasses.replace(plan, network="none", recycle_lease=False), ids


def write_maps(pid: int, ids: SessionIds) -> None:
    """Write the maps of the user namespace of `pid` (waiting for them).
    Raises SessionError naming what refused."""
    if ids.how == "root":
        for name, m in (("uid_map", ids.uids), ("gid_map", ids.gids)):
            try:
                with open(f"/proc/{pid}/{name}", "w") as f:
                    f.write(m.text())
            except OSError as exc:
                raise SessionError(f"could not write the session's {name} ({m.words()} inside): "
                                   f"{exc.strerror}") from None
        return
    _run_helpers(pid, (("newuidmap", ids.uids), ("newgidmap", ids.gids)))


def _run_helpers(pid: int, maps: tuple[tuple[str, IdMap], ...]) -> None:
    """newuidmap and newgidmap on `pid`, side by side (each is a setuid
    program's start: a few ms); SessionError with what the first refused."""
    running: list[tuple[str, IdMap, subprocess.Popen[bytes]]] = []
    try:
        for name, m in maps:
            args = [helper(name) or name, str(pid), *(str(v) for line in m.extents() for v in line)]
            try:
                running.append((name, m, subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                                          stderr=subprocess.PIPE)))
            except OSError as exc:
                raise SessionError(f"{name} could not map the session's ids: {exc}") from None
        for name, m, proc in running:
            try:
                _, err = proc.communicate(timeout=HELPER_TIMEOUT)
            except subprocess.TimeoutExpired:
                raise SessionError(f"{name} did not map the session's ids within {HELPER_TIMEOUT:g} s") from None
            if proc.returncode != 0:
                said = err.decode(errors="replace").strip()[-300:]
                raise SessionError(f"{name} refused the session's ids ({m.words()} inside): exit "
                                   f"{proc.returncode}: {said}")
    finally:
        for _, _, proc in running:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()
