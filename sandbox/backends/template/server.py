"""One sandbox-template process: started by the native core in the root it
prepares, asked for one sandbox per request over a SOCK_SEQPACKET socket.

Data flow (one request; every arrow a SOCK_SEQPACKET message, fds by SCM_RIGHTS):

  caller (Server.spawn)                 sandbox-template (csrc/template/template.c), pid 1
  ---------------------                 ------------------------------------------
  request: blob|"", argv, env,  ----->  _sock: clone a sandbox from the prepared
   stdio, pass_fds, netns, cgroups       root (per-call binds cloned here)
   + a fresh report socket     ----->  _fast: a standby (csrc/template/standby.c), set up
                                         ahead, takes it and execs; the server
                                         makes its replacement
                                               |
  _started(report) <---- STARTED {pidfd, pid, stamps, netns inode, cgroup tag}
                   <---- FAILED {step, op, errno, detail}   (or EOF: it died)
  status: a pipe, or with a reaper the report socket itself: the exit status

A request too large for one message travels in a memfd (SBX_REQ_IN_MEMFD).
Closing both sockets (close(), or the caller's death) ends the server, and
with it (pid 1 of their pid namespace) every sandbox it made.
"""

from __future__ import annotations

import errno as E
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ... import netpool
from ..._core.binding import BIN_DIR, STAMP_NAMES, ffi, lib
from ..._core.report import setup_error
from ...cgroups import Walls
from ...errors import RequestTooLargeError, SandboxError, SetupError
from ...netpool import Lease
from ...plan import OpFlag, Plan
from ...reaper import after_exit
from ...stdio import inheritable
from ...warm_plan import net_kept_plan
from .. import ExitSource
from ..handle import ProcessHandle
from ..native import launch as native_launch
from .placed import PlacedCgroups
from .wire import FAILURE_SIZE, INLINE_MAX, REQUEST_SIZE, in_memfd, parse_failure, request, sandbox_blob, store_request

TEMPLATE_PATH = BIN_DIR / "sandbox-template"


@dataclass
class Started:
    """A sandbox the server cloned and that has exec'd its command."""

    pidfd: int
    pid: int  # in the caller's pid namespace
    status_fd: int
    timings: dict[str, float]
    landlock_abi: int
    lease: Lease | None = None  # the leased network namespace it lives in, the caller's to release
    cgroup_tag: int = 0  # the cgroup it entered last (placed.tag_of; 0: none)
    cgroup_left: int = 0  # the cgroup made ahead it left for the request's own (0: none)
    next_used: bool = False  # the request took the set made ahead it carried (spawn's next_fds)
    recycled: bool = False  # it may be a recycled sandbox, whose pid 1 outlives the request


class Server:
    """A running sandbox-template for one shared plan.

    It is the caller's child, pid 1 of its own pid namespace; closing its
    sockets (close(), or the caller's death) makes it exit, and every sandbox
    it made dies with it. `default` is the sandbox plan without per-call
    overrides: its blob is stored in the server once. When its command keeps
    no capability, the server keeps standby sandboxes of it, set up ahead of
    any request (csrc/template/standby.c): requests without per-call binds go to
    them, on a socket of their own; the rest, to the server. Requests from
    several threads go out one at a time; each sandbox answers on a socket
    of its own.

    A pooled template's standbys each join a leased network namespace ahead
    of their request: the server gets one lease per standby with the store
    request, and then one with every request (a standby that takes it hands
    it on to its replacement). Each sandbox's report names the lease it
    lives in; the leases sent and not reported yet are kept here (`_leases`),
    and released when the server has gone.

    With `recycle` (the plan whose mounts a reset makes again), its standbys
    are recycled: each serves request after request, reset in between
    (csrc/template/template_recycle.c).

    When the default plan has cgroup limits and its standbys are not
    recycled, they are placed in cgroups made ahead (`placed`, cgroup mode:
    see placed.py).
    """

    def __init__(self, shared: Plan, default: Plan, name: str = "sandbox-template",
                 recycle: Plan | None = None) -> None:
        if not TEMPLATE_PATH.exists():
            raise SandboxError(f"sandbox-template is missing at {TEMPLATE_PATH}; reinstall the package")
        self.plan = shared
        self.default = default
        # A pooled template lives in the user namespace of the pool it was made with, and can join only
        # that pool's namespaces: it leases from that pool alone.
        self.pool = netpool.pool_for("pool") if default.network == "pool" else None
        self.standby_reason = ""  # why it has no standby sandboxes, if it has none
        self._lock = threading.Lock()
        self._leases: dict[int, Lease] = {}  # netns inode -> a lease sent to the server, not reported yet
        self._leases_lock = threading.Lock()
        self._reserved = 0  # leases the pool counts as held by our standbys (NetnsPool.reserve)
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._fast, theirs_fast = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        opened: list[int] = []
        try:
            proc = _open(opened, "/proc", os.O_PATH | os.O_DIRECTORY)
            exe = _open(opened, str(TEMPLATE_PATH), os.O_PATH)
            null = _open(opened, os.devnull, os.O_RDWR)
            # the core appends the number of the host tree it keeps (SBX_OPT_HOST_TREE)
            argv = [name, str(theirs.fileno()), str(theirs_fast.fileno()), str(proc)]
            self._launched = native_launch(shared, argv, (null, null, -1),
                                           tuple(sorted({theirs.fileno(), theirs_fast.fileno(), proc})),
                                           exec_fd=exe)
        except BaseException:
            self._sock.close()
            self._fast.close()
            raise
        finally:
            theirs.close()
            theirs_fast.close()
            for fd in opened:
                os.close(fd)
        self.pid = self._launched.pid
        self.closed = False
        if self._launched.on_exit is not None:
            # A pooled template joined a leased namespace only to enter the pool's user namespace: it uses
            # no network itself, so the pool may count that namespace gone now (not recycled: we stay in it)
            # rather than for as long as the template lives.
            self._launched.on_exit()
        self.recycle = recycle is not None
        self.placed = (PlacedCgroups(default.cgroup) if default.cgroup is not None and recycle is None
                       and default.keep_caps == 0 else None)
        try:
            if recycle is not None:  # its standbys serve request after request (csrc/template/template_recycle.c)
                self._store(recycle, standby=False, flags=lib.SBX_REQ_RECYCLE)
                self._store(net_kept_plan(recycle), standby=False,
                            flags=lib.SBX_REQ_RECYCLE | lib.SBX_REQ_RECYCLE_NET_KEPT)
            self.standby = self._store(default, standby=default.keep_caps == 0)
        except BaseException:
            self.close()
            raise

    def _store(self, plan: Plan, standby: bool, flags: int = 0) -> bool:
        """Store `plan`'s blob in the server (with `flags`: SBX_REQ_RECYCLE
        stores a reset blob) and, if `standby`, have it keep standby
        sandboxes of it; whether it does."""
        flags |= lib.SBX_REQ_STANDBY if standby else 0
        leases = self._lease_for_standbys() if standby and self.pool is not None else []
        if leases:
            flags |= lib.SBX_REQ_JOIN_NETNS
        placed = self.placed if standby else None
        sets = [placed.make() for _ in range(lib.SBX_N_STANDBY)] if placed is not None else []
        blob = sandbox_blob(plan)
        msg = store_request(blob, flags, placed.count if placed is not None else 0)
        dups = [lease.dup_netns_fd() for lease in leases]
        try:
            for tag, cgroup in sets:
                assert placed is not None
                placed.sending(tag, cgroup)
            report = self._send(self._sock, msg, [*dups, *(fd for _, c in sets for fd in c.procs_fds)])
        finally:
            for fd in dups:
                os.close(fd)
            for _, cgroup in sets:
                cgroup.close_fds()
        try:
            data = os.read(report, FAILURE_SIZE)  # one message: the server's answer
        finally:
            os.close(report)
        answer = parse_failure(data)
        if answer is None:
            raise SandboxError("the template process has gone")
        step, op, err, detail = answer
        if step == lib.SBX_STEP_CONFIG:
            raise _failure(plan, ["sandbox-template"], step, op, err, detail)
        if step != lib.SBX_STEP_NONE:  # a standby could not set up here: the server clones per request
            self.standby_reason = str(_failure(plan, ["(standby)"], step, op, err, detail))
            return False
        if not standby and not flags & lib.SBX_REQ_RECYCLE:
            self.standby_reason = "its command keeps capabilities (checked against its namespaces' owner)"
        return standby

    def _lease_for_standbys(self) -> list[Lease]:
        """One lease per standby, kept here until a sandbox reports it."""
        assert self.pool is not None
        self.pool.reserve(lib.SBX_N_STANDBY)
        self._reserved = lib.SBX_N_STANDBY
        leases = [self.pool.lease() for _ in range(lib.SBX_N_STANDBY)]
        with self._leases_lock:
            for lease in leases:
                self._leases[lease.netns_inode] = lease
        return leases

    def spawn(self, plan: Plan, argv: Sequence[str], stdio: tuple[int, int, int], pass_fds: Sequence[int],
              lease: Lease | None = None, cgroup_fds: Sequence[int] = (), next_fds: Sequence[int] = (),
              own: bool = False, unsent: Callable[[], None] | None = None) -> Started:
        """Clone one sandbox for `plan` (a sandbox plan of this template's);
        return once its command has been exec'd. Raises what spawn raises.

        `lease` (for a pooled plan) goes to the server: the sandbox lives in
        it or, taken by a standby already in another, that one's
        replacement does. Started.lease is the sandbox's; a failure releases
        the one that came back. `cgroup_fds`: the entry files of the
        sandbox's cgroups (the caller's to close), which its first process
        enters before anything of the request runs. `next_fds` (cgroup mode):
        a set made ahead, which a standby taking the request passes on to its
        replacement (a standby is in such a set already: with `cgroup_fds`
        too, it moves into those), and which a sandbox the server clones
        enters when the request has no `cgroup_fds`; Started.next_used says
        whether the request took it, Started.cgroup_tag names the set the
        sandbox lives in, Started.cgroup_left the one it left. `own`: a
        sandbox the server clones, not a standby. `unsent` is called when
        the request fails before it reaches the server."""
        statr = statw = netns_fd = report = -1
        try:
            if plan is self.default:
                blob, fast = b"", self.standby
            else:  # per-call binds are cloned by the server, in its mount namespace
                blob, fast = sandbox_blob(plan), self.standby and not _per_call_binds(plan)
            if own:
                fast = False
            next_used = bool(next_fds) and (fast or not cgroup_fds)
            if next_used:  # for the replacement of the standby taking it, or the cgroup of the one cloned
                cgroup_fds = [*cgroup_fds, *next_fds]
            child_stdio, mask = _stdio(stdio)
            msg = request(blob, argv, plan.env, pass_fds, join_netns=lease is not None, stdio_mask=mask,
                          n_cgroup=len(cgroup_fds), cgroup_next=bool(next_fds) and fast)
            statr, statw = os.pipe2(os.O_CLOEXEC) if not plan.reaper else (-1, -1)
            if lease is not None:
                netns_fd = lease.dup_netns_fd()  # the template is in the pool's user namespace already
                with self._leases_lock:
                    self._leases[lease.netns_inode] = lease
            fds = [*([statw] if statw >= 0 else []), *([netns_fd] if netns_fd >= 0 else []),
                   *cgroup_fds, *child_stdio, *pass_fds]
            start = time.monotonic_ns()
            report = self._send(self._fast if fast else self._sock, msg, fds)
        except BaseException:
            _close(statr)
            if lease is not None:  # it never reached the server
                self._take_lease(lease.netns_inode)
                lease.release(wait=False, unprivileged_tenant=True)
            if unsent is not None:
                unsent()
            raise
        finally:
            _close(statw)
            _close(netns_fd)
        try:
            answer, used = self._started(report, plan, argv)
        except BaseException:
            os.close(report)
            _close(statr)
            raise
        r = answer.report
        # the server's "start" stamp is when it cloned the sandbox: "clone" here
        timings = {STAMP_NAMES[i] if i else "clone": (t - start) / 1000.0 for i, t in enumerate(r.t_ns) if t}
        timings["start"] = 0.0
        timings["exec"] = (time.monotonic_ns() - start) / 1000.0
        if plan.reaper:
            status_fd = report
        else:
            os.close(report)
            status_fd = statr
        return Started(pidfd=answer.pidfd, pid=answer.pid, status_fd=status_fd, timings=timings,
                       landlock_abi=r.op, lease=used, cgroup_tag=r.err & 0xFFFFFFFF,
                       cgroup_left=r.detail & 0xFFFFFFFF, next_used=next_used, recycled=self.recycle and fast)

    def _send(self, sock: socket.socket, msg: bytes, fds: list[int]) -> int:
        """Send a request with a fresh report socket and `fds`; our end of
        that socket. A request too large for one message goes in a memfd."""
        if len(fds) + 2 > lib.SBX_REQ_MAX_FDS:  # with the report socket, and maybe a memfd
            raise RequestTooLargeError("a Template request's fds", len(fds), lib.SBX_REQ_MAX_FDS - 2)
        if len(msg) > INLINE_MAX:
            return self._send_in_memfd(sock, msg, fds)
        err = self._send_message(sock, msg, fds)
        if err == -E.EMSGSIZE:  # more than this socket's send buffer
            return self._send_in_memfd(sock, msg, fds)
        return err

    def _send_in_memfd(self, sock: socket.socket, msg: bytes, fds: list[int]) -> int:
        """Send `msg` in a memfd (SBX_REQ_IN_MEMFD): its header alone, the memfd last of the fds."""
        head, memfd = in_memfd(msg)
        try:
            return self._send_message(sock, head, [*fds, memfd])
        finally:
            os.close(memfd)

    def _send_message(self, sock: socket.socket, msg: bytes, fds: list[int]) -> int:
        """Send one message (csrc/core/wire.c): our end of its report socket, or
        -EMSGSIZE when it is larger than one message can carry."""
        out = ffi.new("int *")
        with self._lock:
            if self.closed:
                raise SandboxError("the Template is closed")
            err: int = lib.sbx_template_send(sock.fileno(), msg, len(msg), fds, len(fds), out)
        if err == -E.EMSGSIZE and len(msg) > REQUEST_SIZE:
            return err
        if err < 0:
            raise SandboxError(f"the template process has gone ({os.strerror(-err)})")
        return int(out[0])

    def _started(self, report: int, plan: Plan, argv: Sequence[str]) -> tuple[Any, Lease | None]:
        """Wait for the sandbox's word on `report` (csrc/core/wire.c checks it):
        its struct sbx_template_answer and lease once its command runs; raise
        why it did not (having released the lease that came back with the
        failure)."""
        answer = ffi.new("struct sbx_template_answer *")
        kind = lib.sbx_template_report(report, answer)
        used = self._take_lease(answer.netns_ino) if answer.netns_ino else None
        try:
            if kind == lib.SBX_ANSWER_EOF:
                if not self.alive():
                    raise SandboxError("the template process has gone")
                raise SetupError("The sandbox's setup child died before its exec", step="crashed",
                                 errno=0, backend="template")
            if kind != lib.SBX_ANSWER_STARTED:
                if kind < 0:
                    raise SandboxError(f"the template process has gone ({os.strerror(-kind)})")
                if used is not None:  # no command of the sandbox ran in it
                    used.release(wait=False, unprivileged_tenant=True)
                    used = None
                r = answer.report
                raise _failure(plan, argv, r.step, r.op, r.err, r.detail)
            if not plan.reaper:  # it sent its word before its own exec: EOF says that exec worked
                more = ffi.new("struct sbx_template_answer *")
                kind = lib.sbx_template_report(report, more)
                _close(more.pidfd)
                if kind != lib.SBX_ANSWER_EOF:
                    r = more.report if more.report.step != lib.SBX_STEP_NONE else None
                    raise _failure(plan, argv, *((r.step, r.op, r.err, r.detail) if r is not None
                                                 else (lib.SBX_STEP_CONFIG, -1, 0, 0)))
        except BaseException:
            _close(answer.pidfd)
            if used is not None:
                used.release(wait=False, unprivileged_tenant=True)
            raise
        return answer, used

    def _take_lease(self, inode: int) -> Lease | None:
        with self._leases_lock:
            return self._leases.pop(inode, None)

    def alive(self) -> bool:
        """Whether the server process is still running."""
        try:
            pid, _ = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return False
        return pid == 0

    def close(self) -> None:
        """Stop the server (its sandboxes die with it) and reap it."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self._sock.close()
            self._fast.close()
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
        # Nothing of the server is left to use them (its standbys died with it).
        with self._leases_lock:
            leases, self._leases = list(self._leases.values()), {}
        for lease in leases:
            lease.release(wait=False, unprivileged_tenant=True)
        if self._reserved and self.pool is not None:
            self.pool.reserve(-self._reserved)
            self._reserved = 0
        if self.placed is not None:
            self.placed.close()


def _per_call_binds(plan: Plan) -> bool:
    return any(int(op.flags) & FROM_FD for op in plan.ops)


FROM_FD = int(OpFlag.FROM_FD)


def _close(fd: int) -> None:
    if fd >= 0:
        os.close(fd)


class SandboxHandle(ProcessHandle):
    """A Template sandbox's handle. Its status socket alone says when it has
    ended: its pid 1 writes the status there, or, gone, leaves it at EOF (no
    other process holds the sandbox's end: it came close-on-exec, and each
    request's own), so a wait polls that alone, not its pidfd as well."""

    recycled = False  # its pid 1 may be a recycled sandbox's, which outlives the request

    def wait_fds(self) -> list[int]:
        if self.ended_fd < 0:
            return super().wait_fds()
        try:
            return [os.dup(self.ended_fd)]
        except OSError:
            return []

    def _remove_walls_after_exit(self) -> Callable[[], None] | None:
        """A recycled sandbox's pid 1 never enters its request's cgroup and
        lives on, and it writes the status once every process of the
        command's has exited (it killed and reaped them): the cgroup is empty
        then and goes at once, not when pid 1 exits. (A sandbox the server
        cloned for a request no recycled one was ready for has its pid 1 in
        there, exiting: its cgroup goes once it has.)"""
        walls = self.walls
        if not self.recycled or walls is None or walls.cgroup is None:
            return super()._remove_walls_after_exit()
        cgroup = walls.cgroup
        try:
            pidfd = os.dup(self.pidfd)
        except OSError:
            return walls.remove

        def remove() -> None:  # once finish() has read its usage
            if cgroup.remove():
                os.close(pidfd)
            else:
                after_exit(pidfd, walls.remove)
        return remove


def launched(started: Started, exit_source: ExitSource, isolation: dict[str, Any],
             on_exit: Callable[[], None] | None, walls: Walls | None = None) -> ProcessHandle:
    """The handle of a started sandbox: the server's child, reached through
    its pidfd (its status fd tells when it has ended, if its exit source can
    say so early); `walls`: its cgroup, if it has one."""
    ended = started.status_fd if hasattr(exit_source, "arrived") else -1
    handle = SandboxHandle(started.pid, exit_source, started.timings, isolation=isolation, on_exit=on_exit,
                           pidfd=started.pidfd, ended_fd=ended, walls=walls)
    handle.recycled = started.recycled
    return handle


def _open(opened: list[int], path: str, flags: int) -> int:
    fd = os.open(path, flags | os.O_CLOEXEC)
    opened.append(fd)
    return fd


def _stdio(stdio: tuple[int, int, int]) -> tuple[list[int], int]:
    """The fds to send for the sandbox's stdio (-1: the caller's own fd i, if
    a command it execs would get it: stdio.inheritable) and the mask of those
    present (the server's own fds stand in for the rest)."""
    out, mask = [], 0
    for i, fd in enumerate(stdio):
        if fd < 0:
            if not inheritable(i):
                continue
            fd = i
        out.append(fd)
        mask |= 1 << i
    return out, mask


def _failure(plan: Plan, argv: Sequence[str], step: int, op: int, err: int, detail: int) -> SandboxError:
    res = ffi.new("struct sbx_result *")
    res.step, res.op, res.err, res.detail = step, op, err, detail
    exc = setup_error(res, sandbox_blob(plan), list(argv))
    if isinstance(exc, SetupError):
        exc.backend = "template"
    return exc


__all__ = ["Server", "Started", "TEMPLATE_PATH", "launched"]
