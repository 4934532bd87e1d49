"""The zygote: a fresh interpreter inside a WorkerPool's sandbox that forks one sandbox per task.

The caller starts it through the native backend as a script of its own
interpreter (`python -I zygote.py CTL_FD`): it is never a fork of the caller,
and it imports neither the `sandbox` package nor anything but the standard
library, cloudpickle and the pool's `preload` modules. Here, in Python, it
only starts: INIT (load the C core by path, start the network namespace
factory, import `preload`, freeze the heap), one sandbox forked and set up as
a check of the plan (sbx_zygote_check), READY. Then it serves in C
(sbx_zygote_serve, csrc/core/zygote.c) and never returns to Python between two
forks: every page an interpreter writes while a child shares it is a
copy-on-write fault, and its smallest loop writes dozens. The C loop forks
spares ahead of their tasks (a socket to each and a pidfd go to the
caller, which sends a task's channels straight to it), a sandbox per SPAWN
(a task with a plan of its own, or no spare at hand), reports their
setup and their end, and reaps them; csrc/core/sandbox.h (struct sbx_zmsg) has
its messages, csrc/core/zygote.c its policy (spares, slots).

Each sandbox is a fork of this process (sbx_fork_task), which returns
twice: in the zygote, and in the sandbox, set up (its own namespaces, fresh
filesystems, capabilities dropped, seccomp), where the C loop, once the
sandbox has its task's channel (a spare waits there for it), calls
channel.run_task with it: Python runs the task and exits, never returning
into the zygote's frames. The zygote never unpickles anything and never
runs task code.

Cgroups (the pool's Limits, where the host gives the caller cgroups) and
leased network namespaces come as slots: the caller makes them and sends
only fds (cgroup.procs, the namespace and its owner's) with a slot id, in
INIT, SLOT and SPAWN; each fork takes one. With `netns` in INIT, the zygote
first forks the namespace factory (sandbox/netpool's _factory_main, in a
child of its own: it makes a user namespace Q, a child of the zygote's, and
loopback-only namespaces owned by Q) and hands its channel to the caller
with READY; the caller's NetnsPool adopts it and leases one per slot. At
its first leased fork the zygote joins Q for good (it holds every capability
there already, by the owner rule) and makes a namespace of its own there;
each leased fork enters the lease's namespace, clones, and goes back
(SBX_FORK_STAY, csrc/core/forksandbox.c).
"""

from __future__ import annotations

import os
import socket
import sys
from types import ModuleType
from typing import Any

QUIET_MS = 5  # milliseconds of nothing to do before the zygote tops the spares up (it competes for the CPU)


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
INIT, READY, ERROR = C.INIT, C.READY, C.ERROR
read_fd, run_task = C.read_fd, C.run_task


def send(sock: socket.socket, kind: bytes, body: dict[str, Any], fds: list[int] | tuple[int, ...] = ()) -> None:
    """A message to the caller (JSON)."""
    C.send(sock, kind, body, fds, to_caller=True)


def recv(sock: socket.socket) -> tuple[bytes, dict[str, Any], list[int]] | None:
    """A message from the caller (marshal)."""
    result: tuple[bytes, dict[str, Any], list[int]] | None = C.recv(sock, from_caller=True)
    return result


F = _sibling("forkcall")


# ---------------------------------------------------------------- the zygote

class Zygote:
    """The resident process: starts in Python (init, check), then serves in C."""

    def __init__(self, ctl: socket.socket) -> None:
        self.ctl = ctl
        self.factory_pid = 0  # the network namespace factory's pid (0: none)

    def init(self, body: dict[str, Any], fds: list[int]) -> None:
        """Start the namespace factory, load the C core, import `preload`,
        check that no thread was started, and freeze what was imported."""
        import gc
        import importlib
        import importlib.util

        factory_pidfd = -1
        if body.get("netns"):  # first: a small process, none of the preload
            program = load(body["netns"], "_sandbox_netns_factory")
            self.factory, self.factory_pid = _sibling("nsfactory").start(program)
            factory_pidfd = os.pidfd_open(self.factory_pid)

        for entry in body.get("path", []):
            if entry not in sys.path:
                sys.path.append(entry)
        spec = importlib.util.spec_from_file_location("sandbox._native", body["native"])
        assert spec is not None and spec.loader is not None
        native = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(native)
        ffi, lib = native.ffi, native.lib
        per_slot = int(body.get("cgroups", 0))
        self.loop = F.ZygoteLoop(ffi, lib, body["native"], read_fd(fds[0]), run_task, ctl=self.ctl.fileno(),
                                 spares=int(body.get("spares", 0)), per_slot=per_slot,
                                 slotted=bool(per_slot or body.get("netns")), factory_pidfd=factory_pidfd,
                                 quiet_ms=QUIET_MS, died_base=C.DIED)
        for slot in body.get("slots", []):
            self.loop.add_slot(slot, fds[1:1 + per_slot])
            del fds[1:1 + per_slot]
        import pickle  # noqa: F401
        import traceback  # noqa: F401

        import cloudpickle  # noqa: F401 - every task unpickles with it: import once, here

        lib.sbx_task_death_notes(-1, C.DIED)  # the handlers, once: every task inherits them, C sets its fd

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


def main(argv: list[str]) -> int:
    """The zygote's entry point: INIT, the check, READY, then serve (in C).
    In a task's sandbox the C loop calls run_task itself (were it to return
    there instead, the task would run from here)."""
    ctl = socket.socket(fileno=int(argv[1]))
    zygote = Zygote(ctl)
    try:
        message = recv(ctl)
        if message is None or message[0] != INIT:
            return 1
        zygote.init(message[1], message[2])
        checked = zygote.loop.check()
    except BaseException:  # noqa: BLE001 - reported to the caller, which raises it
        import traceback

        send(ctl, ERROR, {"message": traceback.format_exc()})
        return 1
    if checked == F.IN_TASK:
        ctl.detach()  # closed in the task; the object must not close another
        run_task(zygote.loop.task_fd())
    if checked < 0:
        res = zygote.loop.z.res
        send(ctl, ERROR, {"message": "a task's sandbox could not be set up", "failure": {
            name: getattr(res, name) for name in ("step", "op", "err", "detail", "wait_status")}})
        return 1
    factory = getattr(zygote, "factory", None)
    send(ctl, READY, {"pid": os.getpid(), "netns": factory is not None}, [factory.fileno()] if factory else [])
    if factory is not None:
        factory.close()
    served = zygote.loop.serve()
    if served == F.IN_TASK:
        ctl.detach()
        run_task(zygote.loop.task_fd())
    return 0 if served == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
