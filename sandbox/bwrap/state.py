"""What parsing a `python -m sandbox run` command line gathers, and its bounds.

The option handlers (`handlers.py`) record each option in a `ParseState`;
`parse.py` builds the Spec from it once every option is read. The bounds
are bwrap's, the `--limit-*` table is this package's, and every bad value
raises `BwrapArgsError` with bwrap's wording.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import spec as S
from ..errors import SpecError
from .monitor import Monitor

# ---------------------------------------------------------------- bounds

MAX_ARGS = 9000  # bwrap's limit on the arguments, --args files included
MAX_TMPFS_BYTES = 2**63 - 1  # bwrap: SIZE_MAX / 2
MAX_ID = 2**31 - 1  # bwrap reads fds, --uid and --gid as a signed int (bubblewrap #642)
MAX_PERMS = 0o7777
BACKENDS = ("auto", "native", "bwrap")
PROC_COVERS = ("bwrap", "strict")  # --proc-covers: the choices (S.Proc.covers), the CLI's default first


class Limit:
    """One `--limit-*` option of this package and the `Limits` field it sets."""

    __slots__ = ("field", "help", "metavar", "option")

    def __init__(self, option: str, field: str, metavar: str, help: str) -> None:
        self.option, self.field, self.metavar, self.help = option, field, metavar, help


LIMITS = (
    Limit("--limit-cpu", "cpu_s", "SECONDS", "Limit CPU time (RLIMIT_CPU)"),
    Limit("--limit-memory", "memory_mb", "MB", "Limit the sandbox's memory (a cgroup; see `sandbox probe`)"),
    Limit("--limit-file", "file_mb", "MB", "Limit the size of files written (RLIMIT_FSIZE)"),
    Limit("--limit-nofile", "nofile", "N", "Limit open files (RLIMIT_NOFILE)"),
    Limit("--limit-nproc", "nproc", "N", "Limit the sandbox's processes (a cgroup; see `sandbox probe`)"),
    Limit("--limit-cpu-cores", "cpu_cores", "CPUS", "Cap the sandbox's CPU bandwidth, e.g. 0.5 (a cgroup; see "
          "`sandbox probe`)"),
)
LIMIT_FIELD = {limit.option: limit.field for limit in LIMITS}  # parsing: option -> Limits field
LIMIT_OPTION = {limit.field: limit.option for limit in LIMITS}  # rendering: Limits field -> option


class BwrapArgsError(SpecError):
    """A bad command line. `str()` is the bwrap-style message ("Unknown option --foo");
    `field` names the option, `value` holds the offending argument."""

    def __init__(self, message: str, option: str, value: object = None) -> None:
        super().__init__(option, value, message)
        self.args = (message,)


# ---------------------------------------------------------------- parse state

class ParseState:
    """Everything gathered from the options, before the Spec is built.

    A plain class, not a dataclass: one is made per command line and never
    compared or printed, and a dataclass of this many fields costs a direct
    run ~0.5 ms to create at import (its methods are compiled then)."""

    def __init__(self, cwd: str, total: int = 0) -> None:
        self.cwd = cwd
        self.mounts: list[S.Mount] = []
        self.unshare: set[str] = set()
        self.net: bool | None = None  # True: --unshare-net, False: --share-net
        self.net_pool = False  # --netns-pool: lease the private netns from a pool
        self.uid: int | None = None
        self.gid: int | None = None
        self.hostname: str | None = None
        self.chdir: str | None = None
        self.env_ops: list[tuple[str, str, str]] = []
        self.cap_ops: list[tuple[bool, str]] = []
        self.limits: dict[str, Any] = {}  # Limits fields (numbers from the options above)
        self.flags: set[str] = set()
        self.seccomp_fd: str | None = None  # read when the Spec is built (bwrap reads it late too)
        self.seccomp_programs: list[bytes] = []  # --add-seccomp-fd's, in order
        self.base: S.Spec | None = None
        self.backend = "auto"
        self.proc_covers = PROC_COVERS[0]  # --proc-covers: what every --proc of the command line covers
        self.close_fds = False
        self.verbose = False  # --verbose: say which backend runs and why
        self.dry_run = False  # --dry-run: describe the sandbox, run nothing
        self.show_secrets = False  # --show-secrets: --dry-run prints key-like values as they are
        self.consumed: list[int] = []
        self.held: list[int] = []  # fds used (--bind-fd), not passed to the command
        self.warnings: list[str] = []
        self.seen: set[str] = set()
        self.next_perms: int | None = None
        self.next_size: int | None = None
        self.included: list[str] | None = None  # arguments read by --args, parsed next
        self.total = total
        self.stop: str | None = None  # "help" or "version"
        self.monitor = Monitor()  # the status and synchronization options
        # The options applied, in order, --args files expanded: what the Spec was built from (parse.py's
        # cache key); None once an option whose meaning is not in its words alone (it reads an fd or a
        # file) came.
        self.replay: list[str] | None = []

    def take_perms(self, default: int) -> int:
        """The pending --perms value (consumed), else `default`."""
        perms, self.next_perms = self.next_perms, None
        return default if perms is None else perms

    def take_size(self) -> int | None:
        """The pending --size value (consumed), if any."""
        size, self.next_size = self.next_size, None
        return size


Handler = Callable[[ParseState, str, list[str]], None]
