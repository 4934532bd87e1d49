"""The caller's side of a WorkerPool: starting tasks, and one I/O thread that finishes them.

Data flow (control: SOCK_SEQPACKET struct sbx_zmsg; task: a socketpair and two pipes):

  caller threads          I/O thread                 zygote (C loop)           task sandbox
  --------------          ----------                 ---------------           ------------
  submit(fn) -> future                               forks spares ahead ------> waits on its
     | socketpair+pipes   <-- SPARE {pid; socket, pidfd}                       channel
     '-- task's ends ----------- (to the spare's socket, straight) -----------> reads env + pickled
                                                                               (fn, args, kwargs)
                          <------------ reply (u64 length + pickle) ----------- runs, writes
                          <------------ stdout / stderr ----------------------- (pipes)
                          -- TAKEN {pid, id} ------>   a spare now runs task id
                          -- SLOT {cgroup, netns fds}  for the next spares
                          -- SPAWN {plan memfd, slot} ->  forks one for a task
                          -- KILL {id} (timeout) ---->   kills its pid 1
                          <- STARTED / FAILED / EXITED {id, status}
     future.set_result <--'  (reply whole, channels at EOF, or EXITED without a reply)

Per task the caller makes a socketpair (the task reads its payload from it and
writes its reply) and two pipes (its stdout and stderr), hands the task's ends
to a spare sandbox the zygote forked ahead (or to the zygote with SPAWN, which
forks one for the task) and closes its own copies of them; the task writes
straight to the caller, nothing is relayed. The I/O thread reads replies and
output, the zygote's STARTED/FAILED/EXITED, enforces timeouts (KILL: the
zygote kills the task's pid 1, which ends its whole sandbox), starts queued
tasks when a slot frees, and completes the futures.

A task is finished when its reply is complete and its three channels are at
EOF (the kernel closes them when its pid 1 exits), or, without a reply, when
the zygote reports how it ended. Its slot (max_workers) is freed when the
zygote reports its end.

Network namespaces (`netns`: the zygote's factory, handed over with READY):
this side's NetnsPool adopts it and leases one namespace per slot, as for a
cgroup below; the namespace goes back to it (checked) when the sandbox has
ended.

Cgroups (`make_cgroup`: the pool's Limits where the host gives cgroups): every
sandbox the zygote forks enters a cgroup of its own that this side made (a
slot: the zygote gets only its cgroup.procs fds). A SPAWN brings one; spares
take the free ones this side sends ahead (INIT, then one SLOT per SPARE
received), so that making and entering a cgroup is off a spared task's
path. When a task's sandbox has ended (EXITED), its cgroup's usage and the
limit that ended it go to its future's SandboxEnd (TaskFuture.usage waits
for it: a future is done as soon as the reply is in, its sandbox ends ~1-2
ms later, off the result's path), and the cgroup is removed. What is left
when the zygote is gone is removed after it is reaped; a SIGKILLed
caller's, by cgroups.sweep.
"""

from __future__ import annotations

import collections
import os
import selectors
import signal
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from .. import cgroups
from . import channel as ch
from . import control as zc
from .results import BrokenWorkerPool, ReplyLoader, TaskError, TaskFuture, TaskLimitError
from .slots import CgroupSlots
from .task import Task

_CHUNK = 1 << 16

# What a completed task's Task points at instead of its future: the pool
# holds no result once the future is done (the caller's reference decides).
_RETIRED: TaskFuture[Any] = TaskFuture()

# Every engine not yet finished; at interpreter exit their tasks are waited
# for, as concurrent.futures does (threading's exit hooks run before the
# interpreter stops the daemon I/O threads).
_live: weakref.WeakSet[Engine] = weakref.WeakSet()
_exiting = False


def _wait_at_exit() -> None:
    global _exiting
    _exiting = True
    engines = list(_live)
    for engine in engines:
        engine.shutdown(False)
    for engine in engines:
        engine.thread.join()


threading._register_atexit(_wait_at_exit)  # type: ignore[attr-defined]


class Engine:
    """Task bookkeeping and the I/O thread of one pool."""

    def __init__(self, ctl: socket.socket, zygote_stderr: int, max_workers: int, loader: ReplyLoader,
                 on_closed: Callable[[], None], make_cgroup: Callable[[], cgroups.SandboxCgroup] | None = None,
                 slots: dict[int, cgroups.SandboxCgroup] | None = None, mechanism: str = "rlimit",
                 cpu_s: int | None = None, netns: socket.socket | None = None, spares: int = 0) -> None:
        self.ctl = ctl
        self.slots = CgroupSlots(make_cgroup, slots, mechanism, cpu_s)
        if netns is not None:  # the namespaces in use at once: tasks, spares, the slots offered for the next
            self.slots.adopt(netns, max_workers + 2 * spares + 2)
        self.max_workers = max_workers
        self.loader = loader
        self.on_closed = on_closed  # reaps the zygote once the thread ends
        self.lock = threading.Lock()
        self.queued: collections.deque[Task] = collections.deque()
        self.tasks: dict[int, Task] = {}  # started (SPAWN sent), slot not yet freed
        self.inbox: collections.deque[Task] = collections.deque()  # started, channels to register
        self.unfinished: set[Task] = set()  # started, future not yet done
        self.spares: collections.deque[tuple[int, socket.socket, int, int | None]] = collections.deque()
        # ^ (pid, sock, pidfd, slot)
        self.by_pid: dict[int, Task] = {}  # tasks run by spares
        self.broken: str | None = None
        self.closing = False
        self.zygote_stderr = bytearray()
        self.zygote_stderr_fd: int | None = zygote_stderr
        self.sel = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.wake_lock = threading.Lock()
        # held while what select() returned is handled: a thread that takes it
        # may register a task's channels itself instead of waking the I/O thread
        self.io_lock = threading.RLock()
        self.sel.register(self.wake_r, selectors.EVENT_READ, ("wake", None))
        self.sel.register(ctl, selectors.EVENT_READ, ("ctl", None))
        os.set_blocking(zygote_stderr, False)
        self.sel.register(zygote_stderr, selectors.EVENT_READ, ("zstderr", None))
        self.thread = threading.Thread(target=self._run, name="WorkerPool-io", daemon=True)
        self.thread.start()
        _live.add(self)
        if netns is not None and not slots:  # the slots of the first spares (with cgroups, INIT's)
            for _ in range(spares):
                self.slots.offer(ctl)

    # ------------------------------------------------------------ any thread

    def submit(self, task: Task) -> None:
        """Queue `task`; it starts at once if a slot is free."""
        with self.lock:
            if self.broken is not None:
                raise BrokenWorkerPool(self.broken)
            if self.closing:
                raise RuntimeError("cannot submit to a WorkerPool after shutdown()")
            if _exiting:
                raise RuntimeError("cannot submit to a WorkerPool after interpreter shutdown")
            self.queued.append(task)
        self._fill()

    def shutdown(self, cancel_futures: bool) -> None:
        """Accept no more tasks; the thread ends once every task has ended."""
        with self.lock:
            self.closing = True
            cancelled = list(self.queued) if cancel_futures else []
            if cancel_futures:
                self.queued.clear()
        for task in cancelled:
            task.future.cancel()
            task.close_trees()
        self._wake()

    def _fill(self) -> None:
        """Start queued tasks while slots are free (any thread; a loop, never a recursion)."""
        while True:
            with self.lock:
                if self.broken is not None or not self.queued or len(self.tasks) >= self.max_workers:
                    return
                task = self.queued.popleft()
                if not task.future.set_running_or_notify_cancel():
                    task.close_trees()
                    continue
                self.tasks[task.id] = task
                self.unfinished.add(task)
            if not self._start(task):
                self._free(task)

    def _wake(self) -> None:
        # under wake_lock: once _close has closed the pipe, its number may be
        # another file's (a later pool's control socket): never write there
        with self.wake_lock:
            if self.wake_w < 0:
                return
            try:
                os.write(self.wake_w, b"x")
            except (BlockingIOError, OSError):
                pass

    def _start(self, task: Task) -> bool:
        """Make the task's channels, write its payload (what the socket does not
        take now, the I/O thread writes), and send SPAWN; False if that failed
        (the task has failed). Runs in any thread; after SPAWN only the I/O
        thread touches the task's channels."""
        theirs: list[int] = []
        try:
            body: dict[str, int] = {"id": task.id, "n_trees": len(task.trees),
                                    "flags": zc.PLAN if task.blob is not None else 0}
            task.make_channels(theirs)
            if task.timeout is not None:
                task.deadline = time.monotonic() + task.timeout
            task.t0 = time.monotonic()
            task.future.timings["queued"] = (task.t0 - task.submitted) * 1e6
            if task.blob is not None or body["n_trees"] or not self._to_spare(task, theirs):
                if self.slots.on:
                    task.slot = self.slots.new(theirs, body)
                zc.send(self.ctl, zc.SPAWN, theirs, **body)
        except Exception as exc:  # noqa: BLE001 - the task fails, the pool goes on
            task.end.set(None, None)  # it never ran
            self._drop_channels(task)
            if isinstance(exc, (BrokenPipeError, ConnectionError)):
                exc = BrokenWorkerPool(f"the WorkerPool's zygote is gone ({exc})")
                with self.lock:
                    self.broken = self.broken or str(exc)
            self._complete(task, False, exc)
            return False
        finally:
            for fd in theirs:
                os.close(fd)
        # Its channels watched: by this thread when the I/O thread is not
        # handling events (epoll takes an fd from any thread, and the selector
        # maps it first), else by the I/O thread, woken for it, as it is for a
        # deadline (its wait must end in time). A wake-up is a process to run,
        # on this VM ~0.1 ms, at the moment the task's sandbox needs the CPU.
        if task.deadline is None and self.io_lock.acquire(blocking=False):
            try:
                self._register(task)
            finally:
                self.io_lock.release()
            return True
        self.inbox.append(task)
        self._wake()
        return True

    def _to_spare(self, task: Task, fds: list[int]) -> bool:
        """Hand the task's channels to a ready spare (then it is the task's
        sandbox), and tell the zygote; False if no spare took it."""
        while True:
            with self.lock:
                if not self.spares:
                    return False
                pid, sock, pidfd, slot = self.spares.popleft()
                self.by_pid[pid] = task
                task.pid, task.pidfd, task.slot = pid, pidfd, slot
            try:
                with sock:
                    zc.send(sock, zc.SPAWN, fds[:3])
            except OSError:  # it died meanwhile: the zygote reports its end
                with self.lock:
                    self.by_pid.pop(pid, None)
                task.pid, task.pidfd, task.slot = 0, -1, None
                os.close(pidfd)
                continue
            zc.send(self.ctl, zc.TAKEN, pid=pid, id=task.id)
            return True

    def _free(self, task: Task) -> None:
        """The task holds no slot any more."""
        task.ended = True
        with self.lock:
            self.tasks.pop(task.id, None)
            self.by_pid.pop(task.pid, None)
        if task.pidfd >= 0:
            os.close(task.pidfd)
            task.pidfd = -1
        task.close_trees()

    def _release(self, task: Task) -> None:
        """The task's sandbox has ended: its slot goes to a queued task."""
        self._free(task)
        self._fill()

    # ------------------------------------------------------------ the I/O thread

    def _run(self) -> None:
        try:
            while not self._finished():
                ready = self.sel.select(self._next_deadline())
                with self.io_lock:
                    self._dispatch(ready)
                    self._expire()
        except BaseException as exc:  # noqa: BLE001 - any failure here breaks the pool, never hangs it
            self._break(f"the WorkerPool's I/O thread failed: {exc!r}")
        finally:
            self._close()

    def _finished(self) -> bool:
        if self.broken is not None:
            return True
        with self.lock:
            return self.closing and not self.tasks and not self.queued and not self.unfinished

    def _dispatch(self, ready: Iterable[tuple[selectors.SelectorKey, int]]) -> None:
        """Handle what select() returned (a function of its own: no task stays
        referenced from the loop while the thread waits)."""
        for key, events in ready:
            self._event(key, events)

    def _event(self, key: selectors.SelectorKey, events: int) -> None:
        what, task = key.data
        if what == "wake":
            while True:
                try:
                    if not os.read(self.wake_r, 4096):
                        break
                except BlockingIOError:
                    break
            while self.inbox:
                self._register(self.inbox.popleft())
        elif what == "ctl":
            self._control()
        elif what == "zstderr":
            self._read_zygote_stderr(key.fd)
        elif task.done or not task.owns(key.fd):
            # its channels were dropped by an event earlier in this batch (a cap passed): this fd is closed
            # (or already another's), and select() saw it before
            return
        elif what == "sock":
            if events & selectors.EVENT_WRITE:
                self._write_payload(task)
            if events & selectors.EVENT_READ:
                self._read_reply(task)
        else:
            self._read_pipe(task, key.fd)

    def _register(self, task: Task) -> None:
        if task.done:  # failed before its channels were registered: they are closed
            return
        assert task.sock is not None
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if task.unsent is not None else 0)
        self.sel.register(task.sock, events, ("sock", task))
        for fd in task.pipes:
            self.sel.register(fd, selectors.EVENT_READ, ("pipe", task))

    def _write_payload(self, task: Task) -> None:
        assert task.sock is not None and task.unsent is not None
        try:
            sent = task.sock.send(task.unsent)
        except BlockingIOError:
            return
        except OSError:
            sent = len(task.unsent)  # the task is gone; its end says why
        task.unsent = task.unsent[sent:] if sent < len(task.unsent) else None
        if task.unsent is None:
            self.sel.modify(task.sock, selectors.EVENT_READ, ("sock", task))

    def _read_reply(self, task: Task) -> None:
        assert task.sock is not None
        try:
            chunk = task.sock.recv(_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if chunk:
            task.reply += chunk
            size = task.reply_size()
            if task.max_reply is not None and size is not None:
                if size > task.max_reply or len(task.reply) > ch.LENGTH.size + task.max_reply:
                    self._over_cap(task, "max_reply", task.max_reply, "reply")
            return
        self.sel.unregister(task.sock)
        task.sock.close()
        task.open_channels -= 1
        self._maybe_finish(task)

    def _read_pipe(self, task: Task, fd: int) -> None:
        chunk = os.read(fd, _CHUNK)
        if chunk:
            if task.pipes[fd].feed(chunk) and not task.done:
                self._output_over_cap(task)
            return
        self.sel.unregister(fd)
        os.close(fd)
        del task.pipes[fd]
        task.open_channels -= 1
        self._maybe_finish(task)

    def _read_zygote_stderr(self, fd: int) -> None:
        try:
            chunk = os.read(fd, _CHUNK)
        except BlockingIOError:
            return
        if not chunk:
            self.sel.unregister(fd)
            os.close(fd)
            self.zygote_stderr_fd = None
            return
        self.zygote_stderr = (self.zygote_stderr + chunk)[-8192:]

    def _control(self) -> None:
        message = zc.recv(self.ctl)
        if message is None:
            tail = self.zygote_stderr.decode(errors="replace").strip()
            self._break("the WorkerPool's zygote exited" + (f": {tail}" if tail else ""))
            return
        zc.handle(self, *message)

    task_blob = b""  # set by the pool: the task plan's blob, for setup error messages

    def _next_deadline(self) -> float | None:
        deadlines = [t.deadline for t in list(self.tasks.values()) if t.deadline is not None and not t.timed_out]
        return None if not deadlines else max(0.0, min(deadlines) - time.monotonic())

    def _expire(self) -> None:
        now = time.monotonic()
        for task in list(self.tasks.values()):
            if task.deadline is not None and not task.timed_out and now >= task.deadline and not task.done:
                task.timed_out = True
                task.caller_end = "timeout"
                self._kill(task)

    def _kill(self, task: Task) -> None:
        """SIGKILL to the task's pid 1: the kernel ends its whole pid namespace."""
        if task.pidfd >= 0:  # a spare's: the caller holds a pidfd of it
            try:
                signal.pidfd_send_signal(task.pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass
        elif not task.ended:
            zc.send(self.ctl, zc.KILL, id=task.id)

    def _over_cap(self, task: Task, limit: str, cap: int, what: str) -> None:
        """The task sent more than `limit` allows: kill it, drop what it sent, fail its future."""
        task.failure = TaskLimitError(f"the task's {what} exceeded {limit}={cap} bytes; its sandbox was killed",
                                      limit=limit, cap=cap)
        task.caller_end = task.caller_end or "kill"
        task.reply = bytearray()
        self._kill(task)
        self._maybe_finish(task)

    def _output_over_cap(self, task: Task) -> None:
        """A stream of the task passed max_output under "kill" or "raise": its
        sandbox is killed (killed_by "output"); under "raise" its future fails
        now with TaskLimitError, carrying what the caps kept."""
        task.caller_end = "output"
        if task.on_overflow == "raise":
            assert task.max_output is not None
            task.record_outputs()
            fut = task.future
            task.failure = TaskLimitError(
                f"the task's output exceeded max_output={task.max_output} bytes on a stream; its sandbox was killed",
                limit="max_output", cap=task.max_output, stdout=fut.stdout, stderr=fut.stderr,
                stdout_dropped=fut.stdout_dropped, stderr_dropped=fut.stderr_dropped)
            task.failure.killed_by = "output"
            task.reply = bytearray()
        self._kill(task)
        self._maybe_finish(task)

    # ------------------------------------------------------------ completion

    def _maybe_finish(self, task: Task) -> None:
        if task.done:
            return
        if task.failure is not None:
            self._drop_channels(task)
            self._complete(task, False, task.failure)
        elif task.open_channels == 0 and task.reply_complete() and not task.timed_out:
            task.record_outputs()
            try:
                ok, value = self.loader.outcome(bytes(task.reply[ch.LENGTH.size:]), task.sources)
            except Exception as exc:  # noqa: BLE001 - an unloadable reply is the task's error
                ok, value = False, exc
            self._complete(task, ok, value)
        elif task.open_channels == 0 and task.status is not None:
            task.record_outputs()
            self._complete(task, False, task.ended_error())

    def _complete(self, task: Task, ok: bool, value: Any) -> None:
        """Set the task's future (once) and forget its reply."""
        if task.done:
            return
        task.done = True
        task.reply = bytearray()
        future, task.future = task.future, _RETIRED
        future.timings["done"] = (time.monotonic() - task.t0) * 1e6
        if isinstance(value, TaskError) and not ok:  # the sandbox has ended (but past a reply or output cap)
            value.usage, value.killed_by = task.usage, task.killed_by or value.killed_by
        with self.lock:
            self.unfinished.discard(task)
        if future.done():
            return
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

    def _drop_channels(self, task: Task) -> None:
        """Close the task's channels (unregistering those the thread watches)."""
        registered = self.sel.get_map()
        if task.sock is not None:
            if task.sock.fileno() >= 0 and task.sock.fileno() in registered:
                self.sel.unregister(task.sock)
            task.sock.close()
        for fd in task.pipes:
            if fd in registered:
                self.sel.unregister(fd)
            os.close(fd)
        task.pipes = {}
        task.open_channels = 0

    def _break(self, reason: str) -> None:
        """The zygote is gone: every task not done fails, none starts."""
        with self.lock:
            if self.broken is None:
                self.broken = reason
            pending = list(self.queued) + list(self.unfinished)
            started = list(self.tasks.values())
            self.queued.clear()
            self.tasks.clear()
        self.inbox.clear()
        for task in started + pending:
            if not task.end.event.is_set():
                task.end.set(None, None)  # its end will not be reported
        for task in pending:
            task.close_trees()
            if not task.done:
                self._drop_channels(task)
                self._complete(task, False, BrokenWorkerPool(reason))

    def _close(self) -> None:
        with self.lock:
            spares = list(self.spares)
            self.spares.clear()
        for _, sock, pidfd, _slot in spares:  # unused spares exit at EOF
            sock.close()
            os.close(pidfd)
        self.sel.close()
        if self.zygote_stderr_fd is not None:
            os.close(self.zygote_stderr_fd)
            self.zygote_stderr_fd = None
        os.close(self.wake_r)
        with self.wake_lock:
            os.close(self.wake_w)
            self.wake_w = -1
        self.ctl.close()
        try:
            self.on_closed()
        finally:
            self.slots.remove_all()
