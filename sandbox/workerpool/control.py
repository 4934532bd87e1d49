"""The caller's end of a serving zygote's control socket: one struct sbx_zmsg per message.

Once READY, the zygote serves in C (csrc/core/zygote.c) and every message, both
ways, is a struct sbx_zmsg of csrc/core/sandbox.h's cdef, with fds (SCM_RIGHTS);
its fields are read and written here by name through cffi, never by offset.
A message from the zygote that is not one of its kinds, or not whole, is
refused (ValueError): the caller trusts a sandbox no further than that.
handle() is what the engine's I/O thread does with each.
"""

from __future__ import annotations

import os
import socket
import time
from typing import TYPE_CHECKING, Any

from .._core.binding import STAMP_NAMES, ffi, lib
from .._core.fdpass import recv_fds, send_fds
from .._core.report import setup_error

if TYPE_CHECKING:
    from .engine import Engine

SPAWN, KILL, TAKEN, SLOT = lib.SBX_Z_SPAWN, lib.SBX_Z_KILL, lib.SBX_Z_TAKEN, lib.SBX_Z_SLOT
SPARE, STARTED, FAILED, EXITED = lib.SBX_Z_SPARE, lib.SBX_Z_STARTED, lib.SBX_Z_FAILED, lib.SBX_Z_EXITED
PLAN, CLAIMED = lib.SBX_ZF_PLAN, lib.SBX_ZF_SPARE  # SPAWN: a plan of its own; STARTED: a spare it claimed
MAX_FDS = lib.SBX_Z_MAX_FDS
SIZE = ffi.sizeof("struct sbx_zmsg")
FROM_ZYGOTE = frozenset({SPARE, STARTED, FAILED, EXITED})


def send(sock: socket.socket, kind: int, fds: list[int] | tuple[int, ...] = (), **fields: int) -> None:
    """One message of `kind` with `fields` set by name (id and slot default to -1: none) and `fds`."""
    message = ffi.new("struct sbx_zmsg *", {"id": -1, "slot": -1, **fields, "kind": kind})
    send_fds(sock, bytes(ffi.buffer(message)), fds)


def recv(sock: socket.socket) -> tuple[Any, list[int]] | None:
    """One message from the zygote (a struct sbx_zmsg, by name) and its fds;
    None at EOF. ValueError for anything else (its fds closed)."""
    data, fds, flags = recv_fds(sock, SIZE, MAX_FDS)
    message = ffi.new("struct sbx_zmsg *")
    if data and len(data) == SIZE and not flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        ffi.memmove(message, data, SIZE)
    if not data or message.kind not in FROM_ZYGOTE:
        for fd in fds:
            os.close(fd)
        if not data:
            return None
        raise ValueError(f"a control message from the zygote that is not one ({len(data)} bytes, flags {flags})")
    return message, fds


STAMPS = tuple(STAMP_NAMES[k] for k in sorted(STAMP_NAMES))  # enum sbx_stamp, in order


def stamps(message: Any, names: tuple[str, ...]) -> dict[str, float]:
    """A STARTED message's timing stamps, µs after the fork began, by name."""
    t = message.t_ns
    return {name: (t[k] - t[0]) / 1000 for k, name in enumerate(names) if t[k] >= t[0] and t[k]}


def handle(engine: Engine, m: Any, fds: list[int]) -> None:
    """What the engine's I/O thread does with message `m` from the zygote:
    keep a spare (and offer a slot for the next), or note a task's start,
    its setup's failure or its end (its slot's cgroup read and removed, its
    namespace given back; its worker freed)."""
    slot = m.slot if m.slot >= 0 else None
    if m.kind == SPARE and len(fds) == 2:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, 0, fileno=fds[0])  # not asked of the kernel
        with engine.lock:
            engine.spares.append((m.pid, sock, fds[1], slot))
        if slot is not None:
            engine.slots.offer(engine.ctl)
        return
    for fd in fds:
        os.close(fd)
    if m.kind == EXITED and m.id < 0:
        spare_exited(engine, m.pid, m.status, slot, rusage(m))
        return
    task = engine.tasks.get(m.id)
    if task is None:
        if m.kind in (FAILED, EXITED):
            engine.slots.end(None, slot)
        return
    if m.kind == STARTED:
        if slot is not None:
            task.slot = slot  # a spare's, which the task claimed while it was set up
        if not m.flags & CLAIMED:
            task.future.timings.update({f"fork.{k}": v for k, v in stamps(m, STAMPS).items()})
        task.future.timings["started"] = (time.monotonic() - task.t0) * 1e6
        return
    if m.kind == FAILED:
        res = ffi.new("struct sbx_result *")
        res.step, res.op, res.err, res.detail, res.wait_status = m.step, m.op, m.err, m.detail, m.status
        task.failure = setup_error(res, task.blob or engine.task_blob, ["<task>"])
        engine.slots.end(None, slot)
        task.end.set(None, None)
    else:  # EXITED
        task.status, task.rusage = m.status, rusage(m)
        engine.slots.end(task, slot)
    engine._release(task)
    engine._maybe_finish(task)


def rusage(m: Any) -> tuple[float, float] | None:
    """An EXITED message's wait4 rusage of the task's pid 1: (CPU seconds, peak RSS MiB); None if it has none."""
    t = m.t_ns
    utime, stime, maxrss = t[lib.SBX_Z_RU_UTIME_US], t[lib.SBX_Z_RU_STIME_US], t[lib.SBX_Z_RU_MAXRSS_KB]
    if not (utime or stime or maxrss):
        return None
    return (utime + stime) / 1e6, maxrss / 1024


def spare_exited(engine: Engine, pid: int, status: int, slot: int | None,
                 ru: tuple[float, float] | None = None) -> None:
    """A spare ended: a task's (its end raced the TAKEN), or an unused one."""
    with engine.lock:
        task = engine.by_pid.get(pid) if pid else None
        unused = [s for s in engine.spares if s[0] == pid]
        for spare in unused:
            engine.spares.remove(spare)
    for _, sock, pidfd, _slot in unused:
        sock.close()
        os.close(pidfd)
    if task is not None:
        task.status, task.rusage = status, ru
    engine.slots.end(task, slot)
    if task is not None:
        engine._release(task)
        engine._maybe_finish(task)
