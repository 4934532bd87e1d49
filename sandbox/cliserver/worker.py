"""One handed-off command line, in a process forked from the server.

The worker becomes the process the Python CLI would have been: it takes
the client's fds at their numbers (and no other), its working directory,
environment, umask, rlimits, nice value, CPU affinity, OOM score adjustment,
signal mask and ignored signals, then runs `sandbox.cli` on the client's
argv. What it cannot take on (a limit above the server's, a nice value
below it) sends the command line back (FALLBACK) before anything of the
client's is used. It sends the client its exit status (STATUS) as it ends;
the server sends that of a worker a signal killed. Its process group is its
own: when the client goes away the server kills that group, which holds the
sandbox unless `--new-session` moved it out (as the caller's group kill
would have reached it).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import socket
import sys
from typing import Any, NoReturn

from .._core import cliwire as wire
from ..bwrap.grammar import BY_NAME
from .clientstate import F_OWNER_TID, F_SETOWN_EX, Fallback, client_limits, read_at
from .peer import Peer, status_fields
from .rehearse import learned

LOW_FD = 63  # the worker's own fds go above it and above the client's while those are put in place
ACK_POLL = 0.002  # seconds between looks for the client's ACK (see _Frames.ack)
FALLBACK_EXIT = 0  # the worker's exit status after a FALLBACK (the server sends nothing more)


def run(conn: socket.socket, peer: Peer, request: wire.Request, fds: list[int], notes: int = -1,
        ctrl: socket.socket | None = None, pending: tuple[int, ...] = ()) -> NoReturn:
    """The forked worker's whole life: never returns. `notes`: the fd of the server's notes (-1:
    none), written through, never opened again by its name; `ctrl`: the socket to the server, to
    tell it the command line parsed (rehearse.py); `pending`: signals the client relayed before
    the worker could act on them (while it proved itself, spare.py)."""
    code = 1
    try:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # the client's own limit is taken on below
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        base = max([LOW_FD, *request.fd_numbers]) + 1  # above every number the client's fds take
        if hard != resource.RLIM_INFINITY and base + len(fds) + 2 > hard:
            conn.send(wire.frame(wire.FALLBACK))
            os._exit(FALLBACK_EXIT)
        ctrl_fd = ctrl.detach() if ctrl is not None else os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
        notes_fd = notes if notes >= 0 else os.open("/dev/null", os.O_WRONLY | os.O_CLOEXEC)
        own = _move_high([conn.detach(), peer.pidfd, ctrl_fd, notes_fd, *fds], base)
        conn_fd, peer.pidfd, received = own[0], own[1], own[4:]
        notes = own[3] if notes >= 0 else -1
        conn = socket.socket(fileno=conn_fd)
        ctrl = socket.socket(fileno=own[2]) if ctrl is not None else None
        _close_all_but(own)
        _forget_closed_fds()
        try:
            _take_on(peer, request.sigmask)
            peer.confirm()
        except (Fallback, OSError) as exc:
            note(notes, f"pid {peer.pid}: runs directly: {exc}")
            conn.send(wire.frame(wire.FALLBACK))
            os._exit(FALLBACK_EXIT)
        for number, fd in zip(request.fd_numbers, received, strict=True):
            os.dup2(fd, number, inheritable=True)
        for fd in received:  # above every number taken
            os.close(fd)
        code = _run_cli(conn, peer, request, ctrl, own[3], pending)
    except KeyboardInterrupt:  # as it ends the Python CLI: a traceback, then SIGINT itself (the server reports it)
        import traceback

        with contextlib.suppress(BaseException):
            traceback.print_exc()
            sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:  # as an uncaught exception ends the Python CLI: a traceback, status 1
        import traceback

        with contextlib.suppress(BaseException):
            traceback.print_exc()
            sys.stderr.flush()
    finally:
        with contextlib.suppress(BaseException):
            conn.send(wire.frame(wire.STATUS, code))
        os._exit(code)


def note(notes: int, text: str) -> None:
    """A line in the server's notes, through their fd `notes` (-1: none; opened O_APPEND)."""
    if notes >= 0:
        with contextlib.suppress(OSError):
            os.write(notes, text.encode(errors="backslashreplace") + b"\n")


def _move_high(fds: list[int], base: int) -> list[int]:
    """Each fd duplicated at `base` or above (close-on-exec), the original closed."""
    import fcntl

    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, base) for fd in fds]
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    return moved


def _forget_closed_fds() -> None:
    """What the server's process kept open for later is closed now: forget it (the native
    backend's sandbox-init fd, opened again when this process needs it)."""
    from ..backends import native  # lazy: the server runs without the C core (bwrap only)

    native._init_fd = None


def _close_all_but(keep: list[int]) -> None:
    """Close every fd of this process (the server's listener, other clients', 0-2) but `keep`."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)


# ---------------------------------------------------------------- the client's process state

IOPRIO_WHO_PROCESS = 1  # <linux/ioprio.h>


def _take_on(peer: Peer, sigmask: int) -> None:
    """This process takes on the client's process state (Fallback if it cannot), read through its
    pinned /proc entry; its signal mask is `sigmask`, the one the client had before it blocked every
    signal to send its request."""
    proc = peer.open_proc()
    try:
        _take_on_from(peer.pid, proc, sigmask)
    finally:
        os.close(proc)


def _take_on_from(pid: int, proc: int, sigmask: int) -> None:
    fields = status_fields(proc)
    os.umask(int(fields["Umask"].strip(), 8))
    for which, (soft, hard) in client_limits(proc).items():
        _, our_hard = resource.getrlimit(which)
        if _above(hard, our_hard):
            raise Fallback(f"the client's limit {which} is above the server's")
        resource.setrlimit(which, (soft, hard))
    stat = read_at(proc, "stat")
    nice = int(stat[stat.rindex(")") + 2:].split()[16])
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
        _take_scheduling(pid)
        os.sched_setaffinity(0, os.sched_getaffinity(pid))
        oom = read_at(proc, "oom_score_adj")
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(oom)
    except OSError as exc:
        raise Fallback(f"the client's scheduling, affinity or OOM score cannot be taken on ({exc})") from None
    _take_signals(sigmask, int(fields["SigIgn"], 16))
    cwd = os.open("cwd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=proc)
    try:
        os.fchdir(cwd)
    finally:
        os.close(cwd)


def _take_scheduling(pid: int) -> None:
    """The client's scheduling policy (with SCHED_RESET_ON_FORK), its priority and its I/O
    priority; OSError if one cannot be taken (SCHED_DEADLINE, which sched_setscheduler cannot
    set; a real-time class the server may not enter)."""
    os.sched_setscheduler(0, os.sched_getscheduler(pid), os.sched_getparam(pid))
    libc, get, put = ioprio_calls()
    prio = libc.syscall(get, IOPRIO_WHO_PROCESS, pid)
    if prio < 0 or libc.syscall(put, IOPRIO_WHO_PROCESS, 0, prio) < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"ioprio of pid {pid}: {os.strerror(err)}")


_ioprio: tuple[Any, int, int] | None = None


def ioprio_calls() -> tuple[Any, int, int]:
    """libc and the numbers of ioprio_get and ioprio_set (the os module has neither), found once:
    the server calls this as it warms up, and each worker, its fork, has them."""
    global _ioprio
    if _ioprio is None:
        # lazy: the warm-up's (after --after's wait), not this module's import (before it): 0.7 ms
        from ..syscalls import number

        get, put = number("ioprio_get"), number("ioprio_set")
        if get is None or put is None:
            raise OSError(0, "the system call numbers of ioprio_get and ioprio_set are unknown")
        lib = ctypes.CDLL(None, use_errno=True)
        lib.syscall.restype = ctypes.c_long
        _ioprio = (lib, get, put)
    return _ioprio


def _above(a: int, b: int) -> bool:
    inf = resource.RLIM_INFINITY
    return b != inf and (a == inf or a > b)


def _take_signals(blocked: int, ignored: int) -> None:
    """The client's ignored signals stay ignored, the rest are as a fresh
    interpreter has them (SIGINT raising KeyboardInterrupt, SIGPIPE and
    SIGXFSZ ignored); its signal mask is ours."""
    fresh: dict[int, Any] = {signal.SIGINT: signal.default_int_handler, signal.SIGPIPE: signal.SIG_IGN,
             signal.SIGXFSZ: signal.SIG_IGN}
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        handler = signal.SIG_IGN if ignored & (1 << (sig - 1)) else fresh.get(sig, signal.SIG_DFL)
        if signal.getsignal(sig) is handler:  # as Python set it (None: a handler Python did not set)
            continue
        with contextlib.suppress(OSError, ValueError):
            signal.signal(sig, handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, {s for s in signal.valid_signals() if blocked & (1 << (s - 1))})


# ---------------------------------------------------------------- running the CLI

def _run_cli(conn: socket.socket, peer: Peer, request: wire.Request, ctrl: socket.socket | None, notes: int,
             pending: tuple[int, ...]) -> int:
    """`notes`: the notes' fd (or /dev/null's), never the command's; `pending`: signals relayed so far."""
    # lazy: read when a worker runs: serve_command sets it (sandbox.cli, handed down) after this module is imported
    from . import COMMAND_LINE as cli

    assert cli is not None, "the CLI server runs only as `sandbox serve`, which hands it the command line"

    os.environb.clear()
    for entry in request.environ:
        name, _, value = entry.partition(b"=")
        if name:
            os.environb[name] = value
    argv = [os.fsdecode(a) for a in request.argv]
    sys.argv = argv
    _fresh_stdio()
    frames = _Frames(conn, pending)
    asked = _asks_die_with_parent(argv)
    if asked:  # the client's answer comes while the command line is parsed, not after
        conn.send(wire.frame(wire.DIE_WITH_PARENT))

    def die_with_client() -> bool:
        if not asked:  # in an --args file: asked only now
            conn.send(wire.frame(wire.DIE_WITH_PARENT))
        return frames.ack() == 1

    def parsed(replay: tuple[str, ...]) -> None:
        if ctrl is not None and ctrl.fileno() >= 0:
            with contextlib.suppress(OSError):
                ctrl.send(b"L" + learned(replay))
            ctrl.close()

    cli.HIDDEN_FDS.update(fd.fileno() for fd in (conn, ctrl) if fd is not None)
    cli.HIDDEN_FDS.update((peer.pidfd, notes))
    cli.DIE_WITH_PARENT_HOOK = die_with_client
    cli.PARSED_HOOK = parsed
    cli.WAIT_READERS[conn.fileno()] = frames.read
    code = cli.run_command_line(argv[1:], argv[0], one_shot=True)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    return code


def _asks_die_with_parent(argv: list[str]) -> bool:
    """Whether the options on the command line itself (not in an --args file) hold --die-with-parent,
    read with the grammar's arities; parsing proper comes after and decides everything else."""
    args = argv[1:]
    if os.path.basename(argv[0]) != "bwrap":
        if args[:1] == ["--as-bwrap"]:
            args = args[2:]
        elif args[:1] == ["run"]:
            args = args[1:]
        else:
            return False
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] not in ("--", "--help", "--version"):
        if args[i] == "--die-with-parent":
            return True
        option = BY_NAME.get(args[i])
        if option is None:
            return False
        i += 1 + option.nargs
    return False


def _fresh_stdio() -> None:
    """sys.stdout and sys.stderr on the client's fds 1 and 2, buffered as a new interpreter's would be."""
    import io

    for name, fd in (("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        try:
            tty = os.isatty(fd)
            raw = io.FileIO(fd, "w", closefd=False)
        except OSError:
            setattr(sys, name, None)
            continue
        setattr(sys, name, io.TextIOWrapper(io.BufferedWriter(raw), encoding=old.encoding if old else "utf-8",
                                            errors="backslashreplace" if fd == 2 else old.errors if old else None,
                                            line_buffering=tty or fd == 2, write_through=fd == 2))


class _Frames:
    """The client's frames, read when the kernel says they came (SIGIO on the
    connection, O_ASYNC): a signal the client received is raised here, as it
    would be in the Python CLI. No thread: the CLI joins namespaces with
    setns(CLONE_NEWUSER) (--userns), which a multi-threaded process cannot.
    SIGIO and the signals raised go to the main thread itself (F_SETOWN_EX,
    pthread_kill): a signal another thread (a sandbox's reaper) took would
    leave the main thread asleep in its wait, and Python's handler unrun.
    SIGIO alone is not enough: now and then a frame stayed queued with no
    SIGIO seen (1 run in ~20 of a SIGTERM test), so the CLI's wait for the
    sandbox also watches the connection (cli.WAIT_READERS) and reads it."""

    def __init__(self, conn: socket.socket, pending: tuple[int, ...] = ()) -> None:
        import fcntl
        import struct
        import threading

        self.conn = conn
        self.acks: list[int] = []
        self.gone = False
        self.main = threading.main_thread().ident or 0
        conn.setblocking(False)
        signal.signal(signal.SIGIO, self._on_sigio)
        owner = struct.pack("ii", F_OWNER_TID, threading.get_native_id())
        fcntl.fcntl(conn.fileno(), F_SETOWN_EX, owner)
        fcntl.fcntl(conn.fileno(), fcntl.F_SETFL, fcntl.fcntl(conn.fileno(), fcntl.F_GETFL) | os.O_ASYNC)
        for sig in pending:  # relayed while the worker proved itself: read before any handler was set
            signal.pthread_kill(self.main, sig)
        self.read()  # what came before O_ASYNC was set

    def _on_sigio(self, signum: int, frame: object) -> None:
        self.read()

    def read(self) -> bool:
        """Act on every frame that has come; False once the client is gone."""
        while not self.gone:
            try:
                data = self.conn.recv(wire.FRAME_SIZE + 1)
            except BlockingIOError:
                return True
            except OSError:
                data = b""
            if not data:  # the client is gone: the server ends this process's group
                self.gone = True
                return False
            with contextlib.suppress(wire.WireError):
                kind, value = wire.parse_frame(data)
                if kind == wire.SIGNAL and 0 < value < signal.NSIG:
                    signal.pthread_kill(self.main, value)
                elif kind == wire.ACK:
                    self.acks.append(value)
        return False

    def ack(self) -> int:
        """Wait for the client's ACK; its value (0 if the client is gone)."""
        import select

        while not self.acks and not self.gone:
            # briefly: SIGIO's handler may take the ACK while select waits (it is then retried, PEP 475,
            # with nothing left to read: a 1 s wait for an ACK already there)
            select.select([self.conn], [], [], ACK_POLL)
            self.read()
        return self.acks.pop(0) if self.acks else 0
