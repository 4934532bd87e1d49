"""The zygote: a fresh interpreter inside a WorkerPool's sandbox that forks one sandbox per task.

The caller starts it through the native backend as a script of its own
interpreter (`python -I zygote.py CTL_FD`): it is never a fork of the caller,
and it imports neither the `sandbox` package nor anything but the standard
library, cloudpickle and the pool's `preload` modules. It loads the C core by
path and, per task, calls sbx_fork_sandbox(), which returns twice like fork():
in the zygote with the task's pid, and in the task, which is then set up (its
own namespaces, fresh filesystems, capabilities dropped, seccomp) and runs the
function. The zygote never unpickles anything and never runs task code.

Spares: when idle, the zygote forks up to `spares` sandboxes of the pool's
plan ahead of their tasks and hands each to the caller (SPARE: a socket to it
and a pidfd). The caller sends a task's channels straight to a spare, which
closes that socket and runs the task. A fork's cost (page tables, namespaces,
setup, the copy-on-write faults of its first steps) is then paid before the
task is submitted, and the zygote is not on the task's path. A task with a
plan of its own (per-task binds) is forked for itself (SPAWN).

The caller's side also imports this module, for the message format below.

Control socket (AF_UNIX, SOCK_SEQPACKET: one message per packet): a kind byte,
a u32 length, a JSON body of that length; fds travel with SCM_RIGHTS.
    caller -> zygote  INIT  {native, preload, path, spares}  fds: [task blob memfd]
                      SPAWN {id, env?, blob?, trees: n}   fds: [result, stdout, stderr, (blob memfd), n trees]
                      KILL  {id}
                      TAKEN {pid, id}                     (the caller gave spare pid task id)
    zygote -> caller  READY {pid} | ERROR {message}
                      SPARE {pid}                         fds: [socket to the spare, pidfd]
                      STARTED {id, pid} | FAILED {id, step, op, err, detail, wait_status}
                      EXITED {id, pid, status}            (a raw wait status; id null: an unused spare)
    caller -> spare   SPAWN {env?}                        fds: [result, stdout, stderr]
The task reads its payload from its result socket (a u64 length, then the
pickled (fn, args, kwargs)) and writes its reply there (a u64 length, then
the pickled (ok, value or exception record)).
"""

from __future__ import annotations

import array
import json
import os
import socket
import struct
import sys
from typing import Any, NoReturn

INIT, SPAWN, KILL, TAKEN = b"I", b"S", b"K", b"T"
READY, ERROR, SPARE, STARTED, FAILED, EXITED = b"R", b"E", b"p", b"s", b"f", b"x"
_HEADER = struct.Struct("<cI")
LENGTH = struct.Struct("<Q")  # the length prefix on a task's result socket
MAX_MESSAGE = 60 * 1024
MAX_FDS = 64
STAMPS = ("start", "child", "idmap", "mounts", "pivot", "ready", "return", "done")  # enum sbx_stamp


def send(sock: socket.socket, kind: bytes, body: dict[str, Any], fds: list[int] | tuple[int, ...] = ()) -> None:
    """Send one control message (its fds with SCM_RIGHTS)."""
    data = json.dumps(body, separators=(",", ":")).encode()
    packet = _HEADER.pack(kind, len(data)) + data
    if len(packet) > MAX_MESSAGE:
        raise ValueError(f"control message of {len(packet)} bytes is too large (at most {MAX_MESSAGE})")
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    sock.sendmsg([packet], ancillary)


def recv(sock: socket.socket) -> tuple[bytes, dict[str, Any], list[int]] | None:
    """Receive one control message: (kind, body, fds), or None at EOF."""
    data, ancillary, flags, _ = sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(MAX_FDS * 4))
    fds = array.array("i")
    for level, type_, payload in ancillary:
        if level == socket.SOL_SOCKET and type_ == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    if not data:
        for fd in fds:
            os.close(fd)
        return None
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(data) < _HEADER.size:
        raise ValueError("truncated control message")
    kind, size = _HEADER.unpack_from(data)
    return kind, json.loads(data[_HEADER.size:_HEADER.size + size]), list(fds)


def read_fd(fd: int) -> bytes:
    """The whole content of a memfd (from offset 0), which is then closed."""
    try:
        size = os.fstat(fd).st_size
        return os.pread(fd, size, 0)
    finally:
        os.close(fd)


# ---------------------------------------------------------------- the task

def _recv_exact(sock: socket.socket, size: int) -> bytes:
    buf = bytearray()
    while len(buf) < size:
        chunk = sock.recv(min(size - len(buf), 1 << 20))
        if not chunk:
            raise EOFError("the caller closed the task's channel")
        buf += chunk
    return bytes(buf)


def _dumps_or_none(obj: Any) -> bytes | None:
    import cloudpickle

    try:
        return cloudpickle.dumps(obj)
    except Exception:  # noqa: BLE001 - what cannot be pickled comes back by name
        return None


def _error_record(exc: BaseException) -> dict[str, Any]:
    """What the caller needs to raise `exc` again: the exception pickled if
    possible, its class's module and name, its args and attributes (to make it
    again from a class the caller has), its message, and the formatted traceback."""
    import traceback

    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not lose the error
        message = "<unprintable>"
    kind = type(exc)
    return {"module": kind.__module__, "qualname": kind.__qualname__, "message": message,
            "exception": _dumps_or_none(exc), "args": _dumps_or_none((exc.args, getattr(exc, "__dict__", {}))),
            "traceback": "".join(traceback.format_exception(exc))}


def _execute(payload: bytes) -> bytes:
    """Run the pickled call; the pickled reply (ok, value or error record)."""
    import pickle

    import cloudpickle

    try:
        fn, args, kwargs = pickle.loads(payload)
        reply: tuple[bool, Any] = (True, fn(*args, **kwargs))
    except BaseException as exc:  # noqa: BLE001 - everything the task raises goes back to the caller
        reply = (False, _error_record(exc))
    try:
        return cloudpickle.dumps(reply)
    except Exception as exc:  # noqa: BLE001 - an unpicklable result is the task's error
        return cloudpickle.dumps((False, _error_record(exc)))


def run_task(result_fd: int, env: dict[str, str] | None) -> NoReturn:
    """The task's sandbox, after sbx_fork_sandbox returned 0 in it: run the
    call read from `result_fd`, write the reply there, and exit without
    unwinding into the zygote's code (os._exit: no atexit, no finalizers)."""
    code = 0
    try:
        if env:
            os.environ.update(env)
        with socket.socket(fileno=result_fd) as sock:
            (size,) = LENGTH.unpack(_recv_exact(sock, LENGTH.size))
            reply = _execute(_recv_exact(sock, size))
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:  # noqa: BLE001, S110 - a closed stream must not lose the reply
                    pass
            sock.sendall(LENGTH.pack(len(reply)) + reply)
        # EOF on every channel now, not after the exit has torn down our memory
        for fd in (1, 2):
            os.close(fd)
    except BaseException:  # noqa: BLE001 - the channel itself failed: say so on the task's stderr
        code = 70
        try:
            import traceback

            traceback.print_exc()
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001, S110
            pass
    os._exit(code)


def spare_main(sock_fd: int) -> NoReturn:
    """A spare sandbox, forked before its task is known: wait for the task's
    channels from the zygote (then close that socket: no way back to the
    zygote is left), put its stdout and stderr on 1 and 2, and run it."""
    try:
        with socket.socket(fileno=sock_fd) as sock:
            message = recv(sock)
        if message is None:
            os._exit(0)  # the zygote dropped us
        _, body, (result_fd, out_fd, err_fd) = message
        for fd, target in ((out_fd, 1), (err_fd, 2)):
            os.dup2(fd, target)
            os.close(fd)
    except BaseException:  # noqa: BLE001 - nothing to report to: the task's channels are not ours
        os._exit(70)
    run_task(result_fd, body.get("env"))


# ---------------------------------------------------------------- the zygote

class Child:
    """A sandbox forked by the zygote: a task's, or a spare waiting for one (task_id None)."""

    def __init__(self, pid: int, res: Any, task_id: int | None = None, sock: socket.socket | None = None) -> None:
        self.pid, self.res, self.task_id, self.sock = pid, res, task_id, sock
        self.pidfd = -1


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
        import select

        self.POLLIN = select.POLLIN
        self.poll = select.poll()  # no fd of its own, unlike epoll: nothing for a task to inherit

    def init(self, body: dict[str, Any], fds: list[int]) -> None:
        """Load the C core, import `preload`, check that no thread was started."""
        import ctypes
        import gc
        import importlib
        import importlib.util

        for entry in body.get("path", []):
            if entry not in sys.path:
                sys.path.append(entry)
        spec = importlib.util.spec_from_file_location("sandbox._native", body["native"])
        assert spec is not None and spec.loader is not None
        native = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(native)
        self.ffi, self.lib = native.ffi, native.lib
        # sbx_fork_sandbox is called with the GIL held, as os.fork() calls
        # fork(): cffi would release it across the clone. PyDLL keeps it.
        self.fork_c = ctypes.PyDLL(body["native"]).sbx_fork_sandbox
        self.fork_c.restype = ctypes.c_int
        self.fork_c.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        self.api = ctypes.pythonapi
        self.blob = read_fd(fds[0])
        self.spare_target = int(body.get("spares", 0))
        import pickle  # noqa: F401
        import traceback  # noqa: F401

        import cloudpickle  # noqa: F401 - every task unpickles with it: import once, here

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

    def addr(self, cdata: Any) -> int:
        return int(self.ffi.cast("uintptr_t", cdata))

    def fork(self, blob: bytes, stdio: list[int], keep: list[int], trees: list[int]) -> tuple[int, Any]:
        """sbx_fork_sandbox, between CPython's before- and after-fork hooks
        (the task's random is reseeded there, as after os.fork())."""
        ffi = self.ffi
        res = ffi.new("struct sbx_result *")
        c_blob = ffi.from_buffer(blob)
        c_stdio = ffi.new("int[3]", stdio)
        c_keep = ffi.new("int[]", keep or [0])
        c_trees = ffi.new("int[]", trees or [0])
        self.api.PyOS_BeforeFork()
        pid = self.fork_c(self.addr(c_blob), len(blob), self.addr(c_stdio), self.addr(c_keep), len(keep),
                          self.addr(c_trees), len(trees), self.addr(res))
        if pid == 0:
            self.api.PyOS_AfterFork_Child()
        else:
            self.api.PyOS_AfterFork_Parent()
        return pid, res

    def spawn(self, body: dict[str, Any], fds: list[int]) -> None:
        """Fork the task of a SPAWN message (in the task, run it: never
        returns). Its setup goes on while the zygote serves: its report fd is
        watched."""
        result_fd, out_fd, err_fd, *rest = fds
        blob = read_fd(rest.pop(0)) if body.get("blob") else self.blob
        trees, rest = rest[:body.get("trees", 0)], rest[body.get("trees", 0):]
        try:
            pid, res = self.fork(blob, [-1, out_fd, err_fd], [result_fd], trees)
            if pid == 0:
                self.ctl.detach()  # its fd is closed in the task; the object must not close another
                run_task(result_fd, body.get("env"))
        finally:
            for fd in (result_fd, out_fd, err_fd, *trees, *rest):
                os.close(fd)
        if pid < 0:
            self.failed(body["id"], res)
            return
        self.watch_setup(Child(pid, res, task_id=body["id"]))

    def taken(self, body: dict[str, Any]) -> None:
        """The caller gave a spare a task: its end is that task's."""
        child = self.spares.pop(body["pid"], None)
        if child is not None:
            child.task_id = body["id"]
            self.tasks[child.task_id] = child

    def make_spare(self) -> tuple[Child | None, Any]:
        """Fork a sandbox ahead of its task (the pool's plan), waiting on a
        socket: (its Child, setting up; or None if the clone failed, res)."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            pid, res = self.fork(self.blob, [-1, -1, -1], [theirs.fileno()], [])
            if pid == 0:
                self.ctl.detach()
                mine.detach()
                spare_main(theirs.detach())
        finally:
            theirs.close()
        if pid < 0:
            mine.close()
            self.spares_failed = True
            return None, res
        child = Child(pid, res, sock=mine)
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
            else:
                self.failed(child.task_id, child.res)
            return
        self.watch(child)
        if child.task_id is None:
            self.offer(child)
            return
        self.tasks[child.task_id] = child
        t = child.res.t_ns  # enum sbx_stamp: start, child, idmap, mounts, pivot, ready, return, done
        stamps = {name: (t[k] - t[0]) / 1000 for k, name in enumerate(STAMPS) if t[k] >= t[0] and t[k]}
        send(self.ctl, STARTED, {"id": child.task_id, "pid": child.pid, "t": stamps})

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
            send(self.ctl, SPARE, {"pid": child.pid}, [child.sock.fileno(), pidfd])
        finally:
            os.close(pidfd)
            child.sock.close()
            child.sock = None

    def failed(self, task_id: int, res: Any) -> None:
        send(self.ctl, FAILED, {"id": task_id, "step": res.step, "op": res.op, "err": res.err,
                                "detail": res.detail, "wait_status": res.wait_status})

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
        send(self.ctl, EXITED, {"id": child.task_id, "pid": child.pid, "status": status})

    def kill(self, task_id: int) -> None:
        """SIGKILL to the task's pid 1: the kernel ends its whole pid namespace."""
        import signal

        child = self.tasks.get(task_id) or next(
            (c for c in self.setting_up.values() if c.task_id == task_id), None)
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

    def want_spare(self) -> bool:
        pending = sum(1 for c in self.setting_up.values() if c.task_id is None)
        return not self.spares_failed and len(self.spares) + pending < self.spare_target

    def serve(self) -> None:
        """Until the caller closes the control socket. Spares are forked when
        nothing else is waiting."""
        ctl_fd = self.ctl.fileno()
        self.poll.register(ctl_fd, self.POLLIN)
        while True:
            events = self.poll.poll(0 if self.want_spare() else None)
            if not events and self.want_spare():
                self.make_spare()
            for fd, _ in events:
                if fd in self.setting_up:
                    self.ready(fd)
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
    send(ctl, READY, {"pid": os.getpid()})
    if zygote.spare_target:
        zygote.offer(first)
    else:
        assert first.sock is not None
        first.sock.close()  # unused: it exits at EOF, and is reaped as any child
    zygote.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
