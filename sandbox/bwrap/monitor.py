"""bwrap's status and synchronization options, done by the CLI process.

bwrap's monitor process (outside the sandbox) and its pid-1 reaper do these;
ours is the CLI process that waits for the sandbox, so it does them there:

- `--info-fd FD`: once the sandbox runs, `{"child-pid": N, "<ns>-namespace":
  inode, ...}` (multi-line), then FD is closed. `child-pid` is the sandbox's
  first process, as a host pid; the namespaces listed are those the sandbox
  does not share with the CLI, plus `mnt`, never `user` (as bwrap).
- `--json-status-fd FD`: the same on one line, then `{ "exit-code": N }`
  once the command has ended, only if it was executed.
- `--sync-fd FD`: held open (and not passed to the command, unless
  `--as-pid-1`) until the sandbox ends.
- `--lock-file DEST`: a read lock (F_SETLK, F_RDLCK) on DEST, a path inside
  the sandbox, held until the sandbox ends: by the sandbox's pid 1 (as
  bwrap's), which takes it before the command exists (sandbox.sync's
  lock_files); without a pid namespace, by the CLI process once the sandbox
  runs, through /proc/PID/root.
- `--assert-userns-disabled`: fail unless no user namespace can be created
  in the sandbox (`--disable-userns` makes it so; otherwise the caller's
  own inability to create one is checked).
- `--userns FD`, `--pidns FD`: natively, the CLI process joins the user
  namespace (setns: it then holds every capability there), then the pid
  namespace (for its children only), before it starts the sandbox, which so
  begins inside them (bwrap's monitor does the same). Under the bwrap
  backend, bwrap is handed them (a bwrap started in a joined user namespace
  would make one of its own).
- `--block-fd FD`, `--userns-block-fd FD`, `--userns2 FD`: the sandbox's
  setup waits or joins at bwrap's points (sandbox.sync). The --info-fd and
  --json-status-fd records are written as soon as the sandbox's first
  process exists (it reports its pid on a pipe, read by a thread here while
  the setup goes on), as bwrap's monitor writes them, so a caller can read
  them before it unblocks the sandbox (or writes its id maps).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import struct
import threading
from typing import Any

from ..sync import Sync
from .record import Record

NAMESPACES = ("cgroup", "ipc", "mnt", "net", "pid", "uts")  # bwrap's order; never "user"
CLONE_NEWUSER = 0x10000000


class Monitor(Record):
    """What the status and synchronization options asked for (the option
    handlers set each field; a Record: see record.py)."""

    __slots__ = ("info_fd", "json_status_fd", "sync_fd", "lock_files", "assert_userns_disabled", "userns_fd",
                 "pidns_fd", "block_fd", "userns_block_fd", "userns2_fd", "reported")
    _COMPARED = __slots__

    def __init__(self) -> None:
        self.info_fd: int | None = None
        self.json_status_fd: int | None = None
        self.sync_fd: int | None = None
        self.lock_files: list[str] = []
        self.assert_userns_disabled = False
        self.userns_fd: int | None = None  # --userns: a user namespace to start in
        self.pidns_fd: int | None = None  # --pidns: a pid namespace for the sandbox's processes
        self.block_fd: int | None = None  # --block-fd: read before the exec
        self.userns_block_fd: int | None = None  # --userns-block-fd: read before the id maps (the caller writes them)
        self.userns2_fd: int | None = None  # --userns2: joined after setup
        self.reported = False  # --info-fd and --json-status-fd's first record are written

    def fds(self) -> tuple[int, ...]:
        """The fds these options hold, never passed to the command as such."""
        return tuple(fd for fd in (self.info_fd, self.json_status_fd, self.userns_fd, self.pidns_fd,
                                   self.block_fd, self.userns_block_fd, self.userns2_fd) if fd is not None)

    def sync(self, started_fd: int, joined: bool, pid1: bool = False) -> Sync:
        """The Sync for these options; `joined`: the CLI joined --userns and --pidns itself;
        `pid1`: the sandbox has a pid 1 of ours, which takes the lock files (else the CLI does)."""
        def fd(value: int | None) -> int:
            return -1 if value is None else value
        locks = tuple(self.lock_files) if pid1 else ()
        return Sync(started_fd=started_fd, lock_files=locks, block_fd=fd(self.block_fd),
                    userns_block_fd=fd(self.userns_block_fd), userns2_fd=fd(self.userns2_fd),
                    info_fd=fd(self.info_fd), json_status_fd=fd(self.json_status_fd),
                    userns_fd=-1 if joined else fd(self.userns_fd),
                    pidns_fd=-1 if joined else fd(self.pidns_fd))

    @property
    def reports(self) -> bool:
        """Whether the sandbox's start is reported (--info-fd, --json-status-fd)."""
        return self.info_fd is not None or self.json_status_fd is not None


class StartReport:
    """--info-fd and --json-status-fd's first record, written as soon as the
    sandbox's first process reports its pid on a pipe (`started_fd`, its
    write end, for sandbox.sync), from a thread: the caller's thread may be
    waiting for the setup then. `done()` after the sandbox started (or
    failed): the pid if it was reported (the records are written then)."""

    def __init__(self, mon: Monitor) -> None:
        self.mon = mon
        self.pid: int | None = None
        self.error: BaseException | None = None
        self._r, self.started_fd = os.pipe2(os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._wait, name="sandbox-start-report", daemon=True)
        self._thread.start()

    def _wait(self) -> None:
        data = b""
        while chunk := os.read(self._r, 64):
            data += chunk
            if data.endswith(b"\n"):
                break
        if not data.strip().isdigit():
            return
        try:
            self.pid = int(data)
            write_start(self.mon, namespace_info(self.pid))
        except OSError as exc:
            self.error = exc

    def done(self) -> int | None:
        """Close our end of the pipe, wait for the thread; the pid reported, or None."""
        if self.started_fd >= 0:
            os.close(self.started_fd)
            self.started_fd = -1
        self._thread.join()
        os.close(self._r)
        if self.error is not None:
            raise self.error
        return self.pid


def write_start(mon: Monitor, info: dict[str, int]) -> None:
    """--info-fd's record (then closed) and --json-status-fd's first line."""
    if mon.info_fd is not None:
        write_info(mon.info_fd, info)
    if mon.json_status_fd is not None:
        write_json_line(mon.json_status_fd, info)


def namespace_info(pid: int) -> dict[str, int]:
    """`child-pid` and the inodes of the namespaces `pid` does not share with
    this process (its mount namespace always)."""
    info: dict[str, int] = {"child-pid": pid}
    for ns in NAMESPACES:
        try:
            theirs = os.stat(f"/proc/{pid}/ns/{ns}").st_ino
            ours = os.stat(f"/proc/self/ns/{ns}").st_ino
        except OSError:
            continue
        if ns == "mnt" or theirs != ours:
            info[f"{ns}-namespace"] = theirs
    return info


def write_info(fd: int, info: dict[str, Any]) -> None:
    """bwrap's --info-fd text, then close FD."""
    body = ",\n".join(f'    "{key}": {value}' for key, value in info.items())
    _write_all(fd, f"{{\n{body}\n}}\n".encode())
    os.close(fd)


def write_json_line(fd: int, record: dict[str, Any]) -> None:
    """One line of bwrap's --json-status-fd."""
    body = ", ".join(f'"{key}": {value}' for key, value in record.items())
    _write_all(fd, f"{{ {body} }}\n".encode())


def _write_all(fd: int, data: bytes) -> None:
    with contextlib.suppress(BrokenPipeError):
        while data:
            data = data[os.write(fd, data):]


def lock_files(pid: int, paths: list[str]) -> list[int]:
    """Read locks on each path as the sandbox of `pid` sees it (through its
    /proc/PID/root); the fds that hold them."""
    held = []
    lock = struct.pack("hhqqhh", fcntl.F_RDLCK, 0, 0, 0, 0, 0)
    for path in paths:
        fd = os.open(f"/proc/{pid}/root/{path.lstrip('/')}", os.O_RDONLY | os.O_CLOEXEC)
        held.append(fd)
        fcntl.fcntl(fd, fcntl.F_SETLK, lock)
    return held


def userns_creation_disabled() -> bool:
    """Whether a child of this process cannot create a user namespace."""
    # Called before any sandbox or pool thread exists: this CLI process is
    # single-threaded here. libc is loaded before the fork, so the child
    # makes one call and exits (no dlopen, no Python cleanup).
    unshare = ctypes.CDLL(None, use_errno=True).unshare
    pid = os.fork()
    if pid == 0:
        os._exit(1 if unshare(CLONE_NEWUSER) == 0 else 0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


CLONE_NEWPID = 0x20000000


def join_namespaces(mon: Monitor) -> None:
    """setns() into --userns, then --pidns (the order bwrap uses: joining a
    pid namespace needs CAP_SYS_ADMIN over its owner). setns(CLONE_NEWUSER)
    needs a single-threaded process: the network pool (a thread) is closed
    first, and it could not serve a sandbox in another user namespace."""
    # lazy: only for --userns/--pidns: the pool and the probe, 38 + 75 ms, never on a plain run (test_cold_path)
    from .. import netpool
    from ..probe import probe

    probe()  # what this host supports, known (and cached) before: its test clones fail once joined
    netpool.disable()
    libc = ctypes.CDLL(None, use_errno=True)
    for fd, flag, what in ((mon.userns_fd, CLONE_NEWUSER, "user"), (mon.pidns_fd, CLONE_NEWPID, "pid")):
        if fd is not None and libc.setns(fd, flag) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"Can't join the {what} namespace of fd {fd}: {os.strerror(err)}")
        if fd is not None:
            os.close(fd)
