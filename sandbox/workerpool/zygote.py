"""The zygote: a fresh interpreter inside a WorkerPool's sandbox that forks one sandbox per task.

The caller starts it through the native backend as a script of its own
interpreter (`python -I zygote.py CTL_FD`): it is never a fork of the caller,
and it imports neither the `sandbox` package nor anything but the standard
library, cloudpickle and the pool's `preload` modules. It loads the C core by
path and, per task, calls sbx_fork_sandbox(), which returns twice like fork():
in the zygote with the task's pid, and in the task, which is then set up (its
own namespaces, fresh filesystems, capabilities dropped, seccomp) and runs the
function. The zygote never unpickles anything and never runs task code.

Spares: the zygote forks up to `spares` sandboxes of the pool's plan ahead
of their tasks and hands each to the caller (SPARE: a socket to it and a
pidfd): as soon as half of them or more are gone (taken by tasks; those
being set up count as there), all that are missing, back to back; and when
idle (nothing to do for QUIET seconds), whatever is missing. Back to back, because every page the
zygote's loop writes between two forks is a copy-on-write fault (a copy,
while a child shares it): forks in one interval share those faults. The
caller sends a task's channels straight to a spare, which closes that socket
and runs the task. A fork's cost (page tables, namespaces,
setup, the copy-on-write faults of its first steps) is then paid before the
task is submitted, and the zygote is not on the task's path. A task with a
plan of its own (per-task binds) is forked for itself (SPAWN).

Cgroups (the pool's Limits, where the host gives the caller cgroups): the
zygote cannot make them; the caller does, one per sandbox, and sends only
their cgroup.procs fds with a slot id (INIT, CGROUP, SPAWN). Each fork takes
one slot (a SPAWN its own, a spare one from the free ones the caller keeps
topped up), and the child writes "0" into those fds as its first step
(sbx_fork_sandbox_cg); SPARE, STARTED, FAILED and EXITED name the slot, so
that the caller reads the usage of the right cgroup and removes it. Without
a free slot no spare is forked.

Network namespaces (the task plan's own, loopback only): with `netns` in
INIT the zygote first forks a namespace factory (sandbox/netpool's
_factory_main, run in a child of its own: it makes a user namespace Q, a
child of the zygote's, and loopback-only namespaces owned by Q) and hands
its channel to the caller with READY; the caller's NetnsPool adopts it,
checks every namespace it makes and every one a task gave back, and leases
one per slot: a slot then carries a namespace and Q's fd (`ns`: 2 fds after
its cgroup.procs), which the fork joins (sbx_fork_sandbox_ns) instead of
making a fresh one. A slot without them (INIT's, or when the supply failed)
gets a fresh namespace as before.

The messages and the task's side are channel.py's (loaded here by path).
"""

from __future__ import annotations

import math
import os
import socket
import sys
from types import ModuleType
from typing import Any

QUIET = 0.005  # seconds of nothing to do before the zygote tops the spares up (it competes for the CPU)


def load(path: str, name: str) -> ModuleType:
    """The module in the file `path` (stdlib only), loaded by path as `name`."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sibling(name: str) -> ModuleType:
    """A sibling module (channel, nsfactory), or, when this runs as the zygote's script, loaded by path."""
    if __package__:
        import importlib

        return importlib.import_module(f"{__package__}.{name}")
    return load(os.path.join(os.path.dirname(__file__), f"{name}.py"), f"_sandbox_workerpool_{name}")


C = _sibling("channel")
INIT, SPAWN, KILL, TAKEN, CGROUP = C.INIT, C.SPAWN, C.KILL, C.TAKEN, C.CGROUP
READY, ERROR, SPARE, STARTED, FAILED, EXITED = C.READY, C.ERROR, C.SPARE, C.STARTED, C.FAILED, C.EXITED
read_fd, map_fd, run_task, spare_main = C.read_fd, C.map_fd, C.run_task, C.spare_main


def send(sock: socket.socket, kind: bytes, body: dict[str, Any], fds: list[int] | tuple[int, ...] = ()) -> None:
    """A message to the caller (JSON)."""
    C.send(sock, kind, body, fds, to_caller=True)


def recv(sock: socket.socket) -> tuple[bytes, dict[str, Any], list[int]] | None:
    """A message from the caller (marshal)."""
    result: tuple[bytes, dict[str, Any], list[int]] | None = C.recv(sock, from_caller=True)
    return result


F = _sibling("forkcall")
ctypes_prototype = F.ctypes_prototype


# ---------------------------------------------------------------- the zygote

class Child:
    """A sandbox forked by the zygote: a task's, or a spare waiting for one (task_id None)."""

    def __init__(self, pid: int, res: Any, task_id: int | None = None, sock: socket.socket | None = None) -> None:
        self.pid, self.res, self.task_id, self.sock = pid, res, task_id, sock
        self.pidfd = -1
        self.slot: int | None = None  # the caller's id of the cgroup it entered (None: none)
        self.claim: tuple[dict[str, Any], list[int]] | None = None  # a SPAWN waiting for this spare's setup


class Zygote:
    """The resident process: forks spares for the caller, and tasks on SPAWN;
    kills on KILL; reports every end."""

    def __init__(self, ctl: socket.socket) -> None:
        self.ctl = ctl
        self.blob = b""
        self.children: dict[int, Child] = {}  # pidfd -> a running child
        self.tasks: dict[int, Child] = {}  # task id -> its child
        self.setting_up: dict[int, Child] = {}  # report fd -> a child still setting up
        self.spares: dict[int, Child] = {}  # pid -> a spare handed to the caller, not yet taken
        self.spare_target = 0
        self.spares_failed = False  # a spare's setup failed: fork per task from now on
        self.per_slot = 0  # cgroup.procs fds per slot (0: no cgroups)
        self.slotted = False  # every fork takes a slot (cgroups, or leased network namespaces)
        self.free: list[tuple[int, list[int], list[int]]] = []  # slots for the next forks: (id, cgroup.procs
        # fds, [userns, netns] fds of a leased network namespace or [])
        self.factory_pid = 0  # the network namespace factory's pid (0: none)
        self.factory_pidfd = -1
        import select

        self.POLLIN = select.POLLIN
        self.poll = select.poll()  # no fd of its own, unlike epoll: nothing for a task to inherit

    def init(self, body: dict[str, Any], fds: list[int]) -> None:
        """Start the namespace factory, load the C core, import `preload`,
        check that no thread was started."""
        import gc
        import importlib
        import importlib.util

        if body.get("netns"):  # first: a small process, none of the preload
            program = load(body["netns"], "_sandbox_netns_factory")
            self.factory, self.factory_pid = _sibling("nsfactory").start(program)
            self.factory_pidfd = os.pidfd_open(self.factory_pid)

        for entry in body.get("path", []):
            if entry not in sys.path:
                sys.path.append(entry)
        spec = importlib.util.spec_from_file_location("sandbox._native", body["native"])
        assert spec is not None and spec.loader is not None
        native = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(native)
        self.ffi, self.lib = native.ffi, native.lib
        self.blob = read_fd(fds[0])
        self.per_slot = int(body.get("cgroups", 0))
        self.slotted = bool(self.per_slot or body.get("netns"))
        for slot in body.get("slots", []):
            self.add_slot(slot, fds[1:1 + self.per_slot])
            del fds[1:1 + self.per_slot]
        self.spare_target = int(body.get("spares", 0))
        self.fork = F.ForkCall(self.ffi, self.lib, body["native"], self.blob, self.per_slot)
        import pickle  # noqa: F401
        import traceback  # noqa: F401

        import cloudpickle  # noqa: F401 - every task unpickles with it: import once, here

        self.death_notes(-1)  # the handlers, once: every task inherits them and sets only its fd

        for name in body.get("preload", []):
            importlib.import_module(name)
        threads = os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else ["1"]
        if len(threads) != 1:
            raise RuntimeError(f"preloading {body.get('preload')} started {len(threads) - 1} thread(s); "
                               "a zygote must stay single-threaded to fork")
        # What is imported now lives on in every task: keep the collector off
        # it, so that no task writes (copies) those pages just to scan them.
        gc.collect()
        gc.freeze()

    def death_notes(self, fd: int) -> None:
        """In a task: say on `fd` which signal ends it (see sbx_task_death_notes)."""
        self.lib.sbx_task_death_notes(fd, C.DIED)

    def add_slot(self, slot: int, fds: list[int], ns_fds: list[int] | None = None) -> None:
        """A slot the caller made for a later fork (INIT, CGROUP, or a SPAWN
        that took a spare): its cgroup.procs fds, and a leased namespace's."""
        self.free.append((slot, list(fds), list(ns_fds or [])))

    def take_slot(self) -> tuple[int | None, list[int], list[int]]:
        """A free slot for the next fork ((None, [], []) without one, unless
        the forks need cgroups: then there always is one)."""
        return self.free.pop(0) if self.free or self.per_slot else (None, [], [])

    def spawn(self, body: dict[str, Any], fds: list[int]) -> None:
        """Fork the task of a SPAWN message (in the task, run it: never
        returns). Its setup goes on while the zygote serves: its report fd is
        watched."""
        slot = body.get("slot")
        n_slot = self.per_slot + int(body.get("ns", 0)) if slot is not None else 0
        slot_fds = fds[len(fds) - n_slot:]
        cg_fds, ns_fds = slot_fds[:self.per_slot], slot_fds[self.per_slot:]
        fds = fds[:len(fds) - n_slot]
        result_fd, out_fd, err_fd, *rest = fds
        if not body.get("blob") and not body.get("trees"):
            pending = next((c for c in self.setting_up.values() if c.task_id is None and c.claim is None), None)
            if pending is not None:  # a spare is being set up: take it rather than fork twice
                pending.claim = (body, fds)
                if slot is not None:  # the task runs in the spare's slot: this one waits for a later fork
                    self.add_slot(slot, cg_fds, ns_fds)
                return
        own_plan = map_fd(rest.pop(0)) if body.get("blob") else None
        trees, rest = rest[:body.get("trees", 0)], rest[body.get("trees", 0):]
        rest += slot_fds
        try:
            pid, res = self.fork(self.blob if own_plan is None else own_plan, [-1, out_fd, err_fd], result_fd,
                                 trees, cg_fds, ns_fds)
            if pid == 0:
                self.ctl.detach()  # its fd is closed in the task; the object must not close another
                run_task(result_fd, self.death_notes)
        finally:
            if own_plan is not None:
                own_plan.close()  # the task's plan (its binds' paths) leaves no copy in the zygote
            for fd in (result_fd, out_fd, err_fd, *trees, *rest):
                os.close(fd)
        if pid < 0:
            self.failed(body["id"], res, slot)
            return
        child = Child(pid, res, task_id=body["id"])
        child.slot = slot
        self.watch_setup(child)

    def taken(self, body: dict[str, Any]) -> None:
        """The caller gave a spare a task: its end is that task's."""
        child = self.spares.pop(body["pid"], None)
        if child is not None:
            child.task_id = body["id"]
            self.tasks[child.task_id] = child

    def make_spare(self) -> tuple[Child | None, Any]:
        """Fork a sandbox ahead of its task (the pool's plan), waiting on a
        socket: (its Child, setting up; or None if the clone failed, res)."""
        slot, cg_fds, ns_fds = self.take_slot()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            pid, res = self.fork(self.blob, [-1, -1, -1], theirs.fileno(), [], cg_fds, ns_fds)
            if pid == 0:
                self.ctl.detach()
                mine.detach()
                spare_main(theirs.detach(), self.death_notes)
        finally:
            theirs.close()
            for fd in cg_fds + ns_fds:
                os.close(fd)
        if pid < 0:
            mine.close()
            self.spares_failed = True
            if slot is not None:
                send(self.ctl, EXITED, {"id": None, "pid": 0, "status": 0, "slot": slot})
            return None, res
        child = Child(pid, res, sock=mine)
        child.slot = slot
        self.watch_setup(child)
        return child, res

    def watch_setup(self, child: Child) -> None:
        self.setting_up[child.res.status_fd] = child
        self.poll.register(child.res.status_fd, self.POLLIN)

    def ready(self, report_fd: int) -> None:
        """A child's setup ended: watch it (pidfd), and say STARTED for a task's
        or keep a spare; or say FAILED (a spare's failure stops the spares)."""
        child = self.setting_up.pop(report_fd)
        self.poll.unregister(report_fd)
        if self.lib.sbx_fork_ready(report_fd, child.pid, child.res) < 0:
            if child.task_id is None:
                self.spares_failed = True
                assert child.sock is not None
                child.sock.close()
                if child.claim is not None:
                    for fd in child.claim[1]:
                        os.close(fd)
                    self.failed(child.claim[0]["id"], child.res, child.slot)
                elif child.slot is not None:  # its cgroup is the caller's to remove
                    send(self.ctl, EXITED, {"id": None, "pid": child.pid, "status": child.res.wait_status,
                                            "slot": child.slot})
            else:
                self.failed(child.task_id, child.res, child.slot)
            return
        self.watch(child)
        if child.task_id is None and child.claim is not None:
            self.assign(child, *child.claim)
            return
        if child.task_id is None:
            self.offer(child)
            return
        self.tasks[child.task_id] = child
        t = child.res.t_ns  # enum sbx_stamp: start, child, idmap, mounts, pivot, ready, return, done
        stamps = {name: (t[k] - t[0]) / 1000 for k, name in enumerate(C.STAMPS) if t[k] >= t[0] and t[k]}
        send(self.ctl, STARTED, {"id": child.task_id, "pid": child.pid, "t": stamps, "slot": child.slot})

    def assign(self, child: Child, body: dict[str, Any], fds: list[int]) -> None:
        """Give a spare the task that claimed it while it was set up."""
        assert child.sock is not None
        child.task_id = body["id"]
        self.tasks[child.task_id] = child
        try:
            C.send(child.sock, SPAWN, {}, fds)  # to the spare: marshal, as from the caller
        except OSError:
            pass  # it died meanwhile: its end is the task's
        finally:
            child.sock.close()
            child.sock = None
            for fd in fds:
                os.close(fd)
        send(self.ctl, STARTED, {"id": child.task_id, "pid": child.pid, "spare": True, "slot": child.slot})

    def watch(self, child: Child) -> None:
        child.pidfd = os.pidfd_open(child.pid)
        self.children[child.pidfd] = child
        self.poll.register(child.pidfd, self.POLLIN)

    def offer(self, child: Child) -> None:
        """Hand a ready spare to the caller (a socket to it and a pidfd); the
        zygote keeps only its own pidfd, to reap it."""
        assert child.sock is not None
        self.spares[child.pid] = child
        pidfd = os.pidfd_open(child.pid)
        try:
            send(self.ctl, SPARE, {"pid": child.pid, "slot": child.slot}, [child.sock.fileno(), pidfd])
        finally:
            os.close(pidfd)
            child.sock.close()
            child.sock = None

    def failed(self, task_id: int, res: Any, slot: int | None) -> None:
        send(self.ctl, FAILED, {"id": task_id, "step": res.step, "op": res.op, "err": res.err,
                                "detail": res.detail, "wait_status": res.wait_status, "slot": slot})

    def reap(self, pidfd: int) -> None:
        """A child ended: report its task's wait status (or forget the spare)."""
        child = self.children.pop(pidfd)
        self.poll.unregister(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(child.pid, 0)
        if child.task_id is None:
            self.spares.pop(child.pid, None)
            if child.sock is not None:
                child.sock.close()
        else:
            del self.tasks[child.task_id]
        send(self.ctl, EXITED, {"id": child.task_id, "pid": child.pid, "status": status, "slot": child.slot})

    def kill(self, task_id: int) -> None:
        """SIGKILL to the task's pid 1: the kernel ends its whole pid namespace."""
        import signal

        child = self.tasks.get(task_id) or next(
            (c for c in self.setting_up.values()
             if c.task_id == task_id or (c.claim is not None and c.claim[0]["id"] == task_id)), None)
        if child is not None:
            try:
                os.kill(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def check(self) -> tuple[Child | None, Any]:
        """Fork one sandbox of the pool's plan and wait for its setup, so that a
        plan tasks cannot be set up with fails the pool's start: (the sandbox,
        to offer as a spare once READY, or None; its sbx_result)."""
        child, res = self.make_spare()
        if child is None:
            return None, res
        report_fd = res.status_fd
        del self.setting_up[report_fd]
        self.poll.unregister(report_fd)
        if self.lib.sbx_fork_ready(report_fd, child.pid, res) < 0:
            self.spares_failed = True
            assert child.sock is not None
            child.sock.close()
            return None, res
        self.watch(child)
        return child, res

    def fill_spares(self) -> None:
        """Fork every spare wanted (and with a slot), back to back: the pages
        the loop writes between two forks are copied (a fault each) once per
        interval, so two forks in one interval cost half as many."""
        while self.missing()[0] and self.make_spare()[0] is not None:
            pass

    def missing(self) -> tuple[int, int]:
        """(how many spares are wanted and can be forked now, how many are being set up)."""
        pending = sum(1 for c in self.setting_up.values() if c.task_id is None and c.claim is None)
        if self.spares_failed or (self.slotted and not self.free):
            return 0, pending
        return max(0, self.spare_target - len(self.spares) - pending), pending

    def want_spare(self) -> float | None:
        """0 if the missing spares should be forked now (half of them or more
        are gone); else QUIET (top them up if nothing happens meanwhile), or
        None if none is wanted."""
        wanted, pending = self.missing()
        if not wanted:
            return None
        return 0.0 if len(self.spares) + pending <= self.spare_target // 2 else QUIET

    def serve(self) -> None:
        """Until the caller closes the control socket. Spares are forked when
        nothing else is waiting."""
        ctl_fd = self.ctl.fileno()
        self.poll.register(ctl_fd, self.POLLIN)
        if self.factory_pid:
            self.poll.register(self.factory_pidfd, self.POLLIN)
        while True:
            wait = self.want_spare()
            if wait == 0.0:
                self.fill_spares()  # until none is missing, or a fork failed, or no slot is left: no spin
                continue
            events = self.poll.poll(None if wait is None else math.ceil(wait * 1000))  # ceil: never spin
            if not events and wait is not None:
                self.fill_spares()
            for fd, _ in events:
                if fd in self.setting_up:
                    self.ready(fd)
                elif fd == self.factory_pidfd:
                    self.poll.unregister(fd)
                    os.waitpid(self.factory_pid, 0)  # the caller closed its pool (or it failed)
                elif fd != ctl_fd:
                    self.reap(fd)
                else:
                    message = recv(self.ctl)
                    if message is None:
                        return
                    kind, body, fds = message
                    if kind == SPAWN:
                        self.spawn(body, fds)
                    elif kind == KILL:
                        self.kill(body["id"])
                    elif kind == TAKEN:
                        self.taken(body)
                    elif kind == CGROUP:
                        self.add_slot(body["slot"], fds[:self.per_slot], fds[self.per_slot:])


def main(argv: list[str]) -> int:
    """The zygote's entry point: INIT, READY, then serve."""
    ctl = socket.socket(fileno=int(argv[1]))
    zygote = Zygote(ctl)
    try:
        message = recv(ctl)
        if message is None or message[0] != INIT:
            return 1
        zygote.init(message[1], message[2])
        first, res = zygote.check()
    except BaseException:  # noqa: BLE001 - reported to the caller, which raises it
        import traceback

        send(ctl, ERROR, {"message": traceback.format_exc()})
        return 1
    if first is None:
        send(ctl, ERROR, {"message": "a task's sandbox could not be set up", "failure": {
            name: getattr(res, name) for name in ("step", "op", "err", "detail", "wait_status")}})
        return 1
    factory = getattr(zygote, "factory", None)
    send(ctl, READY, {"pid": os.getpid(), "netns": factory is not None}, [factory.fileno()] if factory else [])
    if factory is not None:
        factory.close()
    if zygote.spare_target:
        zygote.offer(first)
    else:
        assert first.sock is not None
        first.sock.close()  # unused: it exits at EOF, and is reaped as any child
    zygote.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
