"""One WorkerPool task as the caller's I/O sees it: its channels, what came back, how it ended."""

from __future__ import annotations

import json
import os
import signal
import socket
from dataclasses import dataclass, field
from typing import Any

from ..cgroups import Usage
from ..output import OutputCap
from . import channel as ch
from .results import SandboxEnd, TaskError, TaskFuture, TaskTimeoutError


@dataclass(eq=False)
class Task:
    """One submitted call and its channels (the caller's ends)."""

    id: int
    future: TaskFuture[Any]
    payload: bytes
    timeout: float | None = None
    env: dict[str, str] | None = None  # sent on its own channel, then dropped
    max_reply: int | None = None  # caps in bytes (None: none)
    max_output: int | None = None  # per stream
    on_overflow: str = "raise"  # past max_output (sandbox.output)
    sources: tuple[str, ...] = ()  # the modules its call's code was sent from (for its traceback)
    blob: bytes | None = None  # a per-task plan (per-task binds), else the pool's
    trees: list[int] = field(default_factory=list)  # detached source trees of its per-task binds
    sock: socket.socket | None = None
    pipes: dict[int, OutputCap] = field(default_factory=dict)  # open stdout/stderr read ends -> what they keep
    output: tuple[OutputCap, OutputCap] | None = None  # made with its channels, from the caps above
    reply: bytearray = field(default_factory=bytearray)
    unsent: memoryview | None = None
    open_channels: int = 3
    deadline: float | None = None
    timed_out: bool = False
    caller_end: str | None = None  # "timeout", "output" or "kill" (a reply cap): this side killed it
    status: int | None = None  # raw wait status, once the zygote reported it
    rusage: tuple[float, float] | None = None  # ... and wait4's (CPU s, peak RSS MiB) of its pid 1
    failure: BaseException | None = None
    ended: bool = False  # the zygote reported EXITED or FAILED: its slot is free
    done: bool = False
    submitted: float = 0.0  # when submit_task was called (monotonic)
    t0: float = 0.0  # when its channels went to a spare or SPAWN was sent (monotonic)
    pid: int = 0  # a spare's pid (in the zygote's pid namespace), once it runs this task
    pidfd: int = -1  # ... and a pidfd of it, to kill it
    slot: int | None = None  # the engine's id of the cgroup its sandbox entered (None: none)
    usage: Usage | None = None  # once its sandbox has ended
    killed_by: str | None = None  # ... and the limit that ended it
    end: SandboxEnd = field(default_factory=SandboxEnd)  # its future's (which the engine drops once done)

    def __post_init__(self) -> None:
        self.end = self.future.end

    def make_channels(self, theirs: list[int]) -> None:
        """Make the task's socket and output pipes, keeping this side's ends
        and appending the task's to `theirs` (the caller sends and closes
        them), with its plan and trees after them; start sending its env and
        payload, straight to the task (nothing of it passes through the
        zygote): what the socket does not take now, the I/O thread writes."""
        mine, their_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        theirs.append(their_sock.detach())
        self.sock = mine
        self.output = (OutputCap(self.max_output, self.on_overflow), OutputCap(self.max_output, self.on_overflow))
        for buf in self.output:
            r, w = os.pipe2(os.O_CLOEXEC)
            self.pipes[r] = buf
            theirs.append(w)
        mine.setblocking(False)
        env = json.dumps(self.env).encode() if self.env else b""
        data = ch.LENGTH.pack(len(env)) + env + ch.LENGTH.pack(len(self.payload)) + self.payload
        self.payload, self.env = b"", None
        try:
            sent = mine.send(data)
        except BlockingIOError:
            sent = 0
        self.unsent = memoryview(data)[sent:] if sent < len(data) else None
        if self.blob is not None:
            theirs.append(_memfd(self.blob))
        theirs += self.trees
        self.trees = []

    def owns(self, fd: int) -> bool:
        """Whether `fd` is one of its channels still open here."""
        return fd in self.pipes or (self.sock is not None and self.sock.fileno() == fd)

    def reply_size(self) -> int | None:
        """The size its reply announces, once known (None also for a death note)."""
        if len(self.reply) < ch.LENGTH.size:
            return None
        (size,) = ch.LENGTH.unpack_from(self.reply)
        return None if size >= ch.DIED else int(size)

    def died_of(self) -> int | None:
        """The signal the task's own death note names, if it wrote one."""
        if len(self.reply) < ch.LENGTH.size:
            return None
        (size,) = ch.LENGTH.unpack_from(self.reply)
        return int(size - ch.DIED) if size >= ch.DIED else None

    def reply_complete(self) -> bool:
        size = self.reply_size()
        return size is not None and len(self.reply) >= ch.LENGTH.size + size

    def record_outputs(self) -> None:
        """What the task wrote to its stdout and stderr (what their caps kept), onto its future."""
        if self.output is not None:
            fut = self.future
            fut.stdout, fut.stderr = self.output[0].kept(), self.output[1].kept()
            fut.stdout_dropped, fut.stderr_dropped = self.output[0].dropped, self.output[1].dropped

    def ended_error(self) -> TaskError:
        """The error of a task whose sandbox ended (status known) without a reply."""
        code = self.returncode()
        fut = self.future
        if self.timed_out:
            return TaskTimeoutError(f"the task ran past its timeout of {self.timeout} s; its sandbox was killed",
                                    returncode=code, stdout=fut.stdout, stderr=fut.stderr,
                                    stdout_dropped=fut.stdout_dropped, stderr_dropped=fut.stderr_dropped)
        how = f"was killed by signal {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
        if self.killed_by is not None:
            how += f" at its {self.killed_by} limit"
        return TaskError(f"the task's sandbox {how} without a result", returncode=code, stdout=fut.stdout,
                         stderr=fut.stderr, stdout_dropped=fut.stdout_dropped, stderr_dropped=fut.stderr_dropped)

    def returncode(self) -> int:
        """How its sandbox ended: an exit code, or -N for signal N (its death note's, else the wait status's)."""
        assert self.status is not None
        signum = self.died_of()
        return -signum if signum is not None else os.waitstatus_to_exitcode(self.status)

    def close_trees(self) -> None:
        """Close the detached trees of its binds (if it never got to hand them over)."""
        for fd in self.trees:
            os.close(fd)
        self.trees = []


def _memfd(data: bytes) -> int:
    fd = os.memfd_create("sandbox-task-plan", os.MFD_CLOEXEC)
    os.write(fd, data)
    return fd
