"""bwrap's synchronization fds, as a Plan carries them to a backend.

A caller that drives a sandbox from outside (flatpak, a test harness, this
package's CLI) hands over open fds of its own, and the sandbox's setup
stops or reports at fixed points, as bubblewrap 0.8.0 does:

- `started_fd`: the sandbox's first process writes its pid (as the caller's
  pid namespace numbers it, in decimal, then a newline) as soon as it
  exists, before its id maps: what bwrap's `--info-fd` reports then.
- `userns_block_fd` (bwrap `--userns-block-fd`): after its user namespace
  exists, the setup reads one byte (or EOF) from it before going on, and
  writes no id maps: the caller writes them (it learnt the pid from
  `started_fd`), and the sandbox keeps them as they are (no nested user
  namespace).
- `userns2_fd` (bwrap `--userns2`): after setup, the command's process
  joins this user namespace (setns), before the last steps and the exec.
- `block_fd` (bwrap `--block-fd`): once set up, the last read of one byte
  (or EOF) before the exec: the caller decides when the command starts.
- `info_fd`, `json_status_fd`: the caller's status fds (bwrap's --info-fd,
  --json-status-fd), closed by the sandbox's first process as soon as it
  has reported its pid, as bwrap's child closes them: a reader of them sees
  EOF once the caller has written and closed its own.
- `userns_fd`, `pidns_fd` (bwrap `--userns`, `--pidns`): namespaces the
  sandbox starts in. The native backend's caller joins them itself before
  it starts the sandbox (sandbox.bwrap.monitor); the bwrap backend hands
  them to bwrap.

Each is an fd of the calling process, -1 for none; the sandbox's command
never gets them (the caller must not list them in `pass_fds`).

- `lock_files` (bwrap `--lock-file`): paths inside the sandbox on which
  its pid 1 takes a read lock (fcntl F_SETLK, F_RDLCK) before the command
  exists, held until the sandbox ends. It needs that pid 1: a pid
  namespace, not `as_pid_1` (sandbox.plan refuses the others).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from .errors import SpecError


@dataclass(frozen=True)
class Sync:
    """The synchronization fds of one sandbox (see the module's text); -1: none."""

    started_fd: int = -1
    userns_block_fd: int = -1
    userns2_fd: int = -1
    block_fd: int = -1
    info_fd: int = -1
    json_status_fd: int = -1
    userns_fd: int = -1
    pidns_fd: int = -1
    lock_files: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in FD_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < -1:
                raise SpecError(f"sync.{name}", value, "must be an open fd or -1")
        if not isinstance(self.lock_files, tuple) or len(self.lock_files) > MAX_LOCK_FILES:
            raise SpecError("sync.lock_files", self.lock_files, f"must be a tuple of at most {MAX_LOCK_FILES} paths")
        for i, path in enumerate(self.lock_files):
            if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
                raise SpecError(f"sync.lock_files[{i}]", path, "must be an absolute path without NUL")

    @property
    def active(self) -> bool:
        """Whether any fd or lock file is set."""
        return bool(self.lock_files) or any(getattr(self, name) >= 0 for name in FD_FIELDS)

    def fds(self) -> tuple[int, ...]:
        """The fds set, which the command must not get."""
        return tuple(fd for fd in (getattr(self, name) for name in FD_FIELDS) if fd >= 0)


FD_FIELDS = tuple(f.name for f in fields(Sync) if f.name != "lock_files")
MAX_LOCK_FILES = 64  # csrc/core/sandbox.h's SBX_MAX_LOCK_FILES
NO_SYNC = Sync()
