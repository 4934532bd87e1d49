"""The command-line grammar of `python -m sandbox run`, written once.

`OPTIONS` is the one table of every option: bubblewrap 0.8.0's, this
package's own (`--spec`, `--backend`, `--limit-*`, ...), and the bwrap
options refused here, each with why. The parser (`parse.py`) looks options
up in it and runs their handlers (`handlers.py`), `usage()` prints it, the
renderers (`unparse.py`, the bwrap backend) spell their options from the
same names, and the tests walk it.

What the handlers record is a `ParseState` (`state.py`, with the bounds
and `BwrapArgsError`); `parse.py` turns the state into a Spec once all
options are read. The names of `state.py` that users of the table need
are re-exported here.
"""

from __future__ import annotations

from .. import spec as S
from . import handlers as h
from .record import FrozenRecord
from .state import (
    BACKENDS,
    LIMIT_FIELD,
    LIMIT_OPTION,
    LIMITS,
    MAX_ARGS,
    MAX_ID,
    PROC_COVERS,
    BwrapArgsError,
    Handler,
    Limit,
    ParseState,
)

__all__ = [
    "BY_NAME", "GROUPS", "LIMITS", "LIMIT_FIELD", "LIMIT_OPTION", "MAX_ARGS", "MAX_ID", "OPTIONS",
    "BwrapArgsError", "Handler", "Limit", "Option", "ParseState", "usage",
]

# ---------------------------------------------------------------- the table

GENERAL, NAMESPACES, PROCESS, FILESYSTEM, SECURITY, MONITOR, OURS, REFUSED = (
    "general", "namespaces", "process", "filesystem", "security", "monitor", "ours", "refused")

GROUPS = {  # usage() prints the groups in this order, under these titles
    GENERAL: "General",
    NAMESPACES: "Namespaces",
    PROCESS: "Identity, environment and process",
    FILESYSTEM: "Filesystem (applied in order)",
    SECURITY: "Capabilities, seccomp and labels",
    MONITOR: "Status and synchronization (done by the CLI process, which waits for the sandbox)",
    OURS: "Options of this package (not bubblewrap's)",
    REFUSED: "Refused (bubblewrap 0.8.0 options not supported here, and why)",
}


class Option(FrozenRecord):
    """One command-line option.

    `nargs` values follow it, named by `metavar` (one per value). Exactly one of
    `handler` (applies it while parsing) and `refused` (why it is not
    supported; the parser refuses it by name) is set. `last_wins`: a single
    value that bwrap warns about when repeated. `modifier`: it applies to the
    next option (--perms, --size), which must be one that takes it.
    Read-only (a FrozenRecord: see record.py).
    """

    __slots__ = ("name", "nargs", "metavar", "help", "group", "handler", "refused", "last_wins", "modifier")
    _COMPARED = __slots__
    name: str
    nargs: int
    metavar: tuple[str, ...]
    help: str
    group: str
    handler: Handler | None
    refused: str | None
    last_wins: bool
    modifier: bool

    def __init__(self, name: str, nargs: int, metavar: tuple[str, ...], help: str, group: str,
                 handler: Handler | None = None, refused: str | None = None, last_wins: bool = False,
                 modifier: bool = False) -> None:
        self._init(name=name, nargs=nargs, metavar=metavar, help=help, group=group, handler=handler,
                   refused=refused, last_wins=last_wins, modifier=modifier)


def _refuse(name: str, metavar: tuple[str, ...], help: str, reason: str) -> Option:
    return Option(name, len(metavar), metavar, help, REFUSED, refused=reason)



OPTIONS: tuple[Option, ...] = (
    Option("--help", 0, (), "Print this help", GENERAL, h.stop("help")),
    Option("--version", 0, (), "Print version", GENERAL, h.stop("version")),
    Option("--args", 1, ("FD",), "Parse NUL-separated args from FD", GENERAL, h.opt_args),

    Option("--unshare-all", 0, (), "Unshare every namespace we support by default", NAMESPACES,
           h.unshare("user-try", "ipc", "pid", "uts", "cgroup-try", net=True)),
    Option("--share-net", 0, (), "Retain the network namespace", NAMESPACES, h.unshare(net=False)),
    Option("--unshare-user", 0, (), "Create new user namespace (implied when not root)", NAMESPACES,
           h.unshare("user")),
    Option("--unshare-user-try", 0, (), "Create new user namespace if possible", NAMESPACES, h.unshare("user-try")),
    Option("--unshare-ipc", 0, (), "Create new ipc namespace", NAMESPACES, h.unshare("ipc")),
    Option("--unshare-pid", 0, (), "Create new pid namespace", NAMESPACES, h.unshare("pid")),
    Option("--unshare-net", 0, (), "Create new network namespace (loopback only)", NAMESPACES, h.unshare(net=True)),
    Option("--unshare-uts", 0, (), "Create new uts namespace", NAMESPACES, h.unshare("uts")),
    Option("--unshare-cgroup", 0, (), "Create new cgroup namespace", NAMESPACES, h.unshare("cgroup")),
    Option("--unshare-cgroup-try", 0, (), "Create new cgroup namespace if possible", NAMESPACES,
           h.unshare("cgroup-try")),
    Option("--disable-userns", 0, (), "Disable further use of user namespaces (requires --unshare-user)",
           NAMESPACES, h.flag("disable_userns")),

    Option("--uid", 1, ("UID",), "Custom uid in the sandbox (requires a user namespace)", PROCESS, h.opt_uid,
           last_wins=True),
    Option("--gid", 1, ("GID",), "Custom gid in the sandbox (requires a user namespace)", PROCESS, h.opt_gid,
           last_wins=True),
    Option("--hostname", 1, ("NAME",), "Custom hostname in the sandbox (requires --unshare-uts)", PROCESS,
           h.opt_hostname, last_wins=True),
    Option("--chdir", 1, ("DIR",), "Change directory to DIR", PROCESS, h.opt_chdir, last_wins=True),
    Option("--clearenv", 0, (), "Unset all environment variables", PROCESS, h.opt_clearenv),
    Option("--setenv", 2, ("VAR", "VALUE"), "Set an environment variable", PROCESS, h.opt_setenv),
    Option("--unsetenv", 1, ("VAR",), "Unset an environment variable", PROCESS, h.opt_unsetenv),
    Option("--new-session", 0, (), "Create a new terminal session", PROCESS, h.flag("new_session")),
    Option("--die-with-parent", 0, (), "Kill COMMAND with SIGKILL when the sandbox's parent dies", PROCESS,
           h.flag("die_with_parent")),
    Option("--as-pid-1", 0, (), "Do not install a reaper process with PID=1", PROCESS, h.flag("as_pid_1")),

    Option("--bind", 2, ("SRC", "DEST"), "Bind mount the host path SRC on DEST", FILESYSTEM,
           h.bind(S.Bind, False)),
    Option("--bind-try", 2, ("SRC", "DEST"), "Equal to --bind but ignores non-existent SRC", FILESYSTEM,
           h.bind(S.Bind, True)),
    Option("--dev-bind", 2, ("SRC", "DEST"), "Bind mount the host path SRC on DEST, allowing device access",
           FILESYSTEM, h.bind(S.DevBind, False)),
    Option("--dev-bind-try", 2, ("SRC", "DEST"), "Equal to --dev-bind but ignores non-existent SRC", FILESYSTEM,
           h.bind(S.DevBind, True)),
    Option("--ro-bind", 2, ("SRC", "DEST"), "Bind mount the host path SRC readonly on DEST", FILESYSTEM,
           h.bind(S.RoBind, False)),
    Option("--ro-bind-try", 2, ("SRC", "DEST"), "Equal to --ro-bind but ignores non-existent SRC", FILESYSTEM,
           h.bind(S.RoBind, True)),
    Option("--remount-ro", 1, ("DEST",), "Remount DEST as readonly; does not recursively remount", FILESYSTEM,
           h.opt_remount_ro),
    Option("--proc", 1, ("DEST",), "Mount new procfs on DEST", FILESYSTEM, h.opt_proc),
    Option("--dev", 1, ("DEST",), "Mount new dev on DEST", FILESYSTEM, h.opt_dev),
    Option("--tmpfs", 1, ("DEST",), "Mount new tmpfs on DEST", FILESYSTEM, h.opt_tmpfs),
    Option("--mqueue", 1, ("DEST",), "Mount new mqueue on DEST", FILESYSTEM, h.opt_mqueue),
    Option("--dir", 1, ("DEST",), "Create dir at DEST", FILESYSTEM, h.opt_dir),
    Option("--file", 2, ("FD", "DEST"), "Copy from FD to destination DEST", FILESYSTEM,
           h.data_file(0o666, readonly=False)),
    Option("--bind-data", 2, ("FD", "DEST"), "Copy from FD to file which is bind-mounted on DEST", FILESYSTEM,
           h.data_file(0o600, readonly=False)),
    Option("--ro-bind-data", 2, ("FD", "DEST"), "Copy from FD to file which is readonly bind-mounted on DEST",
           FILESYSTEM, h.data_file(0o600, readonly=True)),
    Option("--symlink", 2, ("SRC", "DEST"), "Create symlink at DEST with target SRC", FILESYSTEM, h.opt_symlink),
    Option("--perms", 1, ("OCTAL",), "Set permissions of next argument (--dir, --file, --tmpfs, ...)",
           FILESYSTEM, h.opt_perms, modifier=True),
    Option("--size", 1, ("BYTES",), "Set size of next argument (only for --tmpfs)", FILESYSTEM, h.opt_size,
           modifier=True),
    Option("--chmod", 2, ("OCTAL", "PATH"), "Change permissions of PATH (must already exist)", FILESYSTEM,
           h.opt_chmod),

    Option("--cap-add", 1, ("CAP",), "Add cap CAP (or ALL)", SECURITY, h.opt_cap),
    Option("--cap-drop", 1, ("CAP",), "Drop cap CAP (or ALL)", SECURITY, h.opt_cap),
    Option("--seccomp", 1, ("FD",), "Load and use seccomp rules from FD (a raw BPF program)",
           SECURITY, h.opt_seccomp, last_wins=True),

    Option("--spec", 1, ("FILE_OR_JSON",), "Start from this Spec (JSON text or a file); other options apply on top",
           OURS, h.opt_spec, last_wins=True),
    Option("--image", 1, ("REF",), "Start from this image's root (sandbox.presets.image, the default image "
           "store); other options apply on top", OURS, h.opt_image, last_wins=True),
    Option("--backend", 1, ("|".join(BACKENDS),), "Choose the backend (default auto)", OURS,
           h.opt_backend, last_wins=True),
    Option("--proc-covers", 1, ("|".join(PROC_COVERS),),
           "What each --proc covers: bubblewrap's entries (default), or this package's stricter set "
           "(the Python API's default; a user namespace inside then cannot mount a procfs)", OURS,
           h.opt_proc_covers, last_wins=True),
    Option("--close-fds", 0, (), "Do not pass inherited fds other than stdin/stdout/stderr", OURS,
           h.opt_close_fds),
    Option("--netns-pool", 0, (), "With --unshare-net: lease the network namespace from a pool", OURS,
           h.opt_netns_pool),
    Option("--seccomp-default", 0, (), "Apply this package's default seccomp policy (bubblewrap applies none)",
           OURS, h.flag("seccomp_default")),
    Option("--verbose", 0, (), "Say on stderr which backend runs COMMAND, and why", OURS, h.opt_verbose),
    Option("--dry-run", 0, (), "Print the sandbox in words and as a bwrap command line; run nothing", OURS,
           h.opt_dry_run),
    Option("--show-secrets", 0, (), "With --dry-run, print key-like environment values (else <NAME>)", OURS,
           h.flag_of_state("show_secrets")),
    *(Option(limit.option, 1, (limit.metavar,), limit.help, OURS, h.opt_limit) for limit in LIMITS),

    Option("--info-fd", 1, ("FD",), "Write information about the running container to FD", MONITOR,
           h.monitor_fd("info_fd"), last_wins=True),
    Option("--json-status-fd", 1, ("FD",), "Write container status to FD as multiple JSON documents", MONITOR,
           h.monitor_fd("json_status_fd"), last_wins=True),
    Option("--sync-fd", 1, ("FD",), "Keep this fd open while sandbox is running", MONITOR,
           h.monitor_fd("sync_fd"), last_wins=True),
    Option("--lock-file", 1, ("DEST",), "Take a lock on DEST while sandbox is running", MONITOR, h.opt_lock_file),
    Option("--assert-userns-disabled", 0, (), "Fail unless further use of user namespaces is inhibited",
           MONITOR, h.opt_assert_userns_disabled),
    Option("--add-seccomp-fd", 1, ("FD",), "Load and use seccomp rules from FD (repeatable: stacked in order)",
           SECURITY, h.opt_add_seccomp_fd),
    Option("--exec-label", 1, ("LABEL",), "Exec label for the sandbox", SECURITY, h.opt_label, last_wins=True),
    Option("--file-label", 1, ("LABEL",), "File label for temporary sandbox content", SECURITY, h.opt_label,
           last_wins=True),

    Option("--userns", 1, ("FD",), "Use this user namespace (cannot combine with --unshare-user)", NAMESPACES,
           h.monitor_fd("userns_fd"), last_wins=True),
    Option("--pidns", 1, ("FD",), "Use this pid namespace (as parent namespace if using --unshare-pid)",
           NAMESPACES, h.monitor_fd("pidns_fd"), last_wins=True),
    Option("--userns2", 1, ("FD",), "After setup switch to this user namespace, only useful with --userns",
           NAMESPACES, h.monitor_fd("userns2_fd"), last_wins=True),
    Option("--block-fd", 1, ("FD",), "Block on FD until some data to read is available", MONITOR,
           h.monitor_fd("block_fd"), last_wins=True),
    Option("--userns-block-fd", 1, ("FD",), "Block on FD until the user namespace is ready", MONITOR,
           h.monitor_fd("userns_block_fd"), last_wins=True),
    Option("--bind-fd", 2, ("FD", "DEST"), "Bind open directory or path fd on DEST (bubblewrap 0.10)", FILESYSTEM,
           h.bind_fd(S.Bind)),
    Option("--ro-bind-fd", 2, ("FD", "DEST"), "Bind open directory or path fd read-only on DEST (bubblewrap 0.10)",
           FILESYSTEM, h.bind_fd(S.RoBind)),
)

BY_NAME: dict[str, Option] = {option.name: option for option in OPTIONS}


# ---------------------------------------------------------------- help

_INTRO = """\
usage: {prog} [OPTIONS...] [--] COMMAND [ARGS...]

Options follow bubblewrap 0.8.0: `--opt value` only, applied in order, ending
at `--` or at the first argument that does not start with `-`.
"""

_OUTRO = """\
As with bubblewrap, no seccomp filter is installed unless asked for
(`--seccomp FD`, `--seccomp-default`, or a `--spec` with a "seccomp" policy),
and `--proc` covers only bubblewrap's entries, so that a user namespace made
inside can mount a procfs of its own (`--proc-covers strict` for more).
"""

_COLUMN = 33  # where the help text starts, as in bwrap --help


def usage(prog: str = "python -m sandbox run") -> str:
    """The help of `run`: every option of the table, grouped, the refused ones with why.
    `prog` is how the first line names the program (bwrap's names its argv[0])."""
    parts = [_INTRO.format(prog=prog)]
    for group, title in GROUPS.items():
        lines = [f"{title}:"]
        for option in OPTIONS:
            if option.group == group:
                lines.append(_usage_line(option))
        if len(lines) > 1:  # a group may be empty (no bwrap 0.8.0 option is refused now)
            parts.append("\n".join(lines) + "\n")
    parts.append(_OUTRO)
    return "\n".join(parts)


def _usage_line(option: Option) -> str:
    """`    --name METAVAR...   help`, the help in its column (a refused option's reason after it)."""
    head = "    " + " ".join((option.name, *option.metavar))
    text = option.help if option.refused is None else f"{option.help} ({option.refused})"
    return f"{head.ljust(_COLUMN - 1)} {text}"
