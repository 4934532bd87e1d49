"""The command-line grammar of `python -m sandbox run`, written once.

`OPTIONS` is the one table of every option: bubblewrap 0.8.0's, this
package's own (`--spec`, `--backend`, `--limit-*`, ...), and the bwrap
options refused here, each with why. The parser (`parse.py`) looks options
up in it and runs their handlers, `usage()` prints it, the renderers
(`unparse.py`, the bwrap backend) spell their options from the same names,
and the tests walk it.

A handler applies one option to the `ParseState`: it checks and converts
the values with bwrap's rules and messages, and records what the option
asks for; `parse.py` turns the state into a Spec once all options are read.
Handlers read and close the fds they are given (`--args`, `--file`, ...),
as bwrap does while it parses.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from .. import spec as S
from ..errors import SpecError
from .monitor import Monitor

# ---------------------------------------------------------------- bounds

MAX_ARGS = 9000  # bwrap's limit on the arguments, --args files included
MAX_TMPFS_BYTES = 2**63 - 1  # bwrap: SIZE_MAX / 2
MAX_ID = 2**31 - 1  # bwrap reads fds, --uid and --gid as a signed int (bubblewrap #642)
MAX_PERMS = 0o7777
BACKENDS = ("auto", "native", "bwrap")


class Limit(NamedTuple):
    """One `--limit-*` option of this package and the `Limits` field it sets."""

    option: str
    field: str
    metavar: str
    help: str


LIMITS = (
    Limit("--limit-cpu", "cpu_s", "SECONDS", "Limit CPU time (RLIMIT_CPU)"),
    Limit("--limit-memory", "memory_mb", "MB", "Limit the address space (RLIMIT_AS)"),
    Limit("--limit-file", "file_mb", "MB", "Limit the size of files written (RLIMIT_FSIZE)"),
    Limit("--limit-nofile", "nofile", "N", "Limit open files (RLIMIT_NOFILE)"),
    Limit("--limit-nproc", "nproc", "N", "Limit processes of the user (RLIMIT_NPROC)"),
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

@dataclass
class ParseState:
    """Everything gathered from the options, before the Spec is built."""

    cwd: str
    mounts: list[S.Mount] = field(default_factory=list)
    unshare: set[str] = field(default_factory=set)
    net: bool | None = None  # True: --unshare-net, False: --share-net
    net_pool: bool = False  # --netns-pool: lease the private netns from a pool
    uid: int | None = None
    gid: int | None = None
    hostname: str | None = None
    chdir: str | None = None
    env_ops: list[tuple[str, str, str]] = field(default_factory=list)
    cap_ops: list[tuple[bool, str]] = field(default_factory=list)
    limits: dict[str, int] = field(default_factory=dict)
    flags: set[str] = field(default_factory=set)
    seccomp_fd: str | None = None  # read when the Spec is built (bwrap reads it late too)
    seccomp_programs: list[bytes] = field(default_factory=list)  # --add-seccomp-fd's, in order
    base: S.Spec | None = None
    backend: str = "auto"
    close_fds: bool = False
    verbose: bool = False  # --verbose: say which backend runs and why
    dry_run: bool = False  # --dry-run: describe the sandbox, run nothing
    consumed: list[int] = field(default_factory=list)
    held: list[int] = field(default_factory=list)  # fds used (--bind-fd), not passed to the command
    warnings: list[str] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)
    next_perms: int | None = None
    next_size: int | None = None
    included: list[str] | None = None  # arguments read by --args, parsed next
    total: int = 0
    stop: str | None = None  # "help" or "version"
    monitor: Monitor = field(default_factory=Monitor)  # the status and synchronization options

    def take_perms(self, default: int) -> int:
        """The pending --perms value (consumed), else `default`."""
        perms, self.next_perms = self.next_perms, None
        return default if perms is None else perms

    def take_size(self) -> int | None:
        """The pending --size value (consumed), if any."""
        size, self.next_size = self.next_size, None
        return size


Handler = Callable[[ParseState, str, list[str]], None]


# ---------------------------------------------------------------- number syntax (C strtol rules)

_SPACE = "[ \t\n\v\f\r]*"
_DECIMAL = re.compile(_SPACE + r"([+-]?)([0-9]+)")
_OCTAL = re.compile(_SPACE + r"([+-]?)([0-7]+)")
_SIZE = re.compile(r"0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*")


def _c_number(pattern: re.Pattern[str], text: str, base: int) -> int | None:
    """What strtol/strtoul would read from the whole of `text`, or None."""
    m = pattern.fullmatch(text)
    if m is None:
        return None
    value = int(m.group(2), base)
    return -value if m.group(1) == "-" else value


def parse_int(text: str, what: str, option: str) -> int:
    """A non-negative decimal (an fd, uid or gid), as bwrap reads it."""
    value = _c_number(_DECIMAL, text, 10)
    if value is None or not 0 <= value <= MAX_ID:
        raise BwrapArgsError(f"Invalid {what}: {text}", option, text)
    return value


def _parse_octal(text: str, option: str) -> int:
    value = _c_number(_OCTAL, text, 8)
    if value is None or not 0 <= value <= MAX_PERMS:
        raise BwrapArgsError(f"{option} takes an octal argument <= 07777", option, text)
    return value


def _parse_size(text: str) -> int:
    if not _SIZE.fullmatch(text):
        raise BwrapArgsError("--size takes a non-zero number of bytes", "--size", text)
    value = int(text, 16) if text[:2] in ("0x", "0X") else int(text, 8 if text.startswith("0") else 10)
    if value == 0 or value >= 2**64:
        raise BwrapArgsError("--size takes a non-zero number of bytes", "--size", text)
    if value > MAX_TMPFS_BYTES:
        raise BwrapArgsError(f"--size (for tmpfs) is limited to {MAX_TMPFS_BYTES}", "--size", text)
    return value


def _parse_positive(text: str, option: str) -> int:
    if not re.fullmatch("[0-9]+", text) or int(text) == 0:
        raise BwrapArgsError(f"{option} takes a positive integer", option, text)
    return int(text)


# ---------------------------------------------------------------- file descriptors

def consume_fd(st: ParseState, option: str, text: str, failure: str) -> bytes:
    """Read fd `text` to the end and close it, as bwrap does with the fds it is given.
    An unreadable or already consumed fd raises "<failure>: <strerror>" (bwrap's EBADF)."""
    fd = parse_int(text, "fd", option)
    if fd in st.consumed:
        raise BwrapArgsError(f"{failure}: Bad file descriptor (fd {fd} was already used)", option, fd)
    chunks = []
    try:
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    except OSError as exc:
        raise BwrapArgsError(f"{failure}: {exc.strerror}", option, fd) from None
    _release_fd(fd)
    st.consumed.append(fd)
    return b"".join(chunks)


def _release_fd(fd: int) -> None:
    """Close `fd`; a stdio fd becomes /dev/null so its number is not reused."""
    if fd > 2:
        os.close(fd)
        return
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, fd, inheritable=True)
    os.close(null)


def _split_args(data: bytes) -> list[str]:
    """NUL-separated arguments; a final NUL is optional."""
    if not data:
        return []
    items = data.split(b"\0")
    if items[-1] == b"":
        items.pop()
    return [os.fsdecode(item) for item in items]


# ---------------------------------------------------------------- paths

def _dest(path: str) -> str:
    """A destination inside the sandbox; a relative one counts from '/'."""
    return path if path.startswith("/") else "/" + path


def _source(st: ParseState, path: str) -> str:
    """A host source path: relative to the caller's cwd; '..' resolved like realpath."""
    full = path if path.startswith("/") else posixpath.join(st.cwd, path)
    if ".." in full.split("/"):
        full = os.path.realpath(full)
    return full


# ---------------------------------------------------------------- handlers: general

def _stop(what: str) -> Handler:
    def handler(st: ParseState, opt: str, values: list[str]) -> None:
        st.stop = what
    return handler


def _opt_args(st: ParseState, opt: str, values: list[str]) -> None:
    items = _split_args(consume_fd(st, opt, values[0], "Can't read --args data"))
    st.total += len(items)
    if st.total > MAX_ARGS:
        raise BwrapArgsError(f"Exceeded maximum number of arguments {MAX_ARGS}", opt, st.total)
    st.included = items


def _opt_spec(st: ParseState, opt: str, values: list[str]) -> None:
    text = values[0]
    if text.lstrip().startswith("{"):
        st.base = S.Spec.from_json(text)
        return
    if "\0" in text:  # only the Python API can pass one (argv strings end at NUL)
        raise BwrapArgsError("Can't read --spec file: the path contains a NUL byte", opt, text)
    path = posixpath.join(st.cwd, text)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise BwrapArgsError(f"Can't read --spec file {text}: {exc.strerror}", opt, text) from None
    st.base = S.Spec.from_json(data)


def _opt_backend(st: ParseState, opt: str, values: list[str]) -> None:
    if values[0] not in BACKENDS:
        raise BwrapArgsError(f"--backend must be one of {', '.join(BACKENDS)}", opt, values[0])
    st.backend = values[0]


def _opt_close_fds(st: ParseState, opt: str, values: list[str]) -> None:
    st.close_fds = True


def _opt_verbose(st: ParseState, opt: str, values: list[str]) -> None:
    st.verbose = True


def _opt_dry_run(st: ParseState, opt: str, values: list[str]) -> None:
    st.dry_run = True


def _opt_netns_pool(st: ParseState, opt: str, values: list[str]) -> None:
    st.net_pool = True


def _opt_limit(st: ParseState, opt: str, values: list[str]) -> None:
    st.limits[LIMIT_FIELD[opt]] = _parse_positive(values[0], opt)


# ---------------------------------------------------------------- handlers: namespaces and identity

def _unshare(*names: str, net: bool | None = None) -> Handler:
    def handler(st: ParseState, opt: str, values: list[str]) -> None:
        st.unshare.update(names)
        if net is not None:
            st.net = net
    return handler


def _opt_uid(st: ParseState, opt: str, values: list[str]) -> None:
    st.uid = parse_int(values[0], "uid", opt)


def _opt_gid(st: ParseState, opt: str, values: list[str]) -> None:
    st.gid = parse_int(values[0], "gid", opt)


def _opt_hostname(st: ParseState, opt: str, values: list[str]) -> None:
    st.hostname = values[0]


def _opt_seccomp(st: ParseState, opt: str, values: list[str]) -> None:
    parse_int(values[0], "fd", opt)
    if st.seccomp_programs:
        raise BwrapArgsError("--seccomp cannot be combined with --add-seccomp-fd", opt, values[0])
    st.seccomp_fd = values[0]


def _opt_add_seccomp_fd(st: ParseState, opt: str, values: list[str]) -> None:
    parse_int(values[0], "fd", opt)
    if st.seccomp_fd is not None:
        raise BwrapArgsError("--add-seccomp-fd cannot be combined with --seccomp", opt, values[0])
    data = consume_fd(st, opt, values[0], "Can't read seccomp data")  # read now, as bwrap does
    if len(data) % 8:
        raise BwrapArgsError("Invalid seccomp data, must be multiple of 8", opt, len(data))
    st.seccomp_programs.append(data)


# ---------------------------------------------------------------- handlers: environment and process

def _opt_chdir(st: ParseState, opt: str, values: list[str]) -> None:
    st.chdir = S.normalize_path(posixpath.normpath(_dest(values[0])))


def _opt_setenv(st: ParseState, opt: str, values: list[str]) -> None:
    _check_env_name(opt, values[0])
    st.env_ops.append(("set", values[0], values[1]))


def _opt_unsetenv(st: ParseState, opt: str, values: list[str]) -> None:
    _check_env_name(opt, values[0])
    st.env_ops.append(("unset", values[0], ""))


def _opt_clearenv(st: ParseState, opt: str, values: list[str]) -> None:
    st.env_ops.append(("clear", "", ""))


def _check_env_name(opt: str, name: str) -> None:
    if not name or "=" in name:
        raise BwrapArgsError(f"{opt[2:]} failed: invalid variable name {name!r}", opt, name)


def _flag(name: str) -> Handler:
    def handler(st: ParseState, opt: str, values: list[str]) -> None:
        st.flags.add(name)
    return handler


def _opt_cap(st: ParseState, opt: str, values: list[str]) -> None:
    st.cap_ops.append((opt == "--cap-add", _cap_name(opt, values[0])))


def _cap_name(opt: str, text: str) -> str:
    """"ALL", or a capability's kernel name; accepts cap_kill, CAP_KILL or a number, like libcap."""
    if text.upper() == "ALL":
        return "ALL"
    if text.isdigit() and int(text) < len(S.CAPABILITIES):
        return S.CAPABILITIES[int(text)]
    if text.upper() in S.CAPABILITIES:
        return text.upper()
    raise BwrapArgsError(f"unknown cap: {text}", opt, text)


# ---------------------------------------------------------------- handlers: filesystem

def _bind(klass: type[S.Bind], optional: bool) -> Handler:
    def handler(st: ParseState, opt: str, values: list[str]) -> None:
        src, dest = values
        if not src:
            if optional:
                return  # bwrap skips a -try source it cannot find
            raise BwrapArgsError("Can't find source path : No such file or directory", opt, src)
        st.mounts.append(klass(src=_source(st, src), dest=_dest(dest), optional=optional))
    return handler


def _bind_fd(klass: type[S.Bind]) -> Handler:
    """bwrap 0.10's --bind-fd: the source is what the open fd names, as
    /proc/self/fd/FD names it (the backends resolve it in the sandbox's
    mount namespace and check that the same file was bound; see plan.FD_SOURCE);
    the fd is not passed to the command."""
    def handler(st: ParseState, opt: str, values: list[str]) -> None:
        fd = parse_int(values[0], "fd", opt)
        st.mounts.append(klass(src=f"/proc/self/fd/{fd}", dest=_dest(values[1])))
        st.held.append(fd)
    return handler


def _opt_tmpfs(st: ParseState, opt: str, values: list[str]) -> None:
    perms = st.take_perms(0o755)
    st.mounts.append(S.Tmpfs(dest=_dest(values[0]), size=st.take_size(), perms=perms))


def _opt_dir(st: ParseState, opt: str, values: list[str]) -> None:
    st.mounts.append(S.Dir(dest=_dest(values[0]), perms=st.take_perms(0o755)))


def _opt_proc(st: ParseState, opt: str, values: list[str]) -> None:
    st.mounts.append(S.Proc(dest=_dest(values[0])))


def _opt_dev(st: ParseState, opt: str, values: list[str]) -> None:
    st.mounts.append(S.Dev(dest=_dest(values[0])))


def _opt_mqueue(st: ParseState, opt: str, values: list[str]) -> None:
    st.mounts.append(S.Mqueue(dest=_dest(values[0])))


def _opt_symlink(st: ParseState, opt: str, values: list[str]) -> None:
    st.mounts.append(S.Symlink(target_path=values[0], dest=_dest(values[1])))


def _opt_remount_ro(st: ParseState, opt: str, values: list[str]) -> None:
    st.mounts.append(S.RemountRo(dest=_dest(values[0])))


def _opt_chmod(st: ParseState, opt: str, values: list[str]) -> None:
    st.mounts.append(S.Chmod(path=_dest(values[1]), perms=_parse_octal(values[0], opt)))


def _data_file(default_perms: int, readonly: bool) -> Handler:
    def handler(st: ParseState, opt: str, values: list[str]) -> None:
        data = consume_fd(st, opt, values[0], f"Can't write data to file {values[1]}")
        perms = st.take_perms(default_perms)
        st.mounts.append(S.File(dest=_dest(values[1]), data=data, perms=perms, readonly=readonly))
    return handler


def _opt_perms(st: ParseState, opt: str, values: list[str]) -> None:
    if st.next_perms is not None:
        raise BwrapArgsError("--perms given twice for the same action", opt, values[0])
    st.next_perms = _parse_octal(values[0], opt)


def _opt_size(st: ParseState, opt: str, values: list[str]) -> None:
    if st.next_size is not None:
        raise BwrapArgsError("--size given twice for the same action", opt, values[0])
    st.next_size = _parse_size(values[0])


def _monitor_fd(name: str) -> Handler:
    def handler(st: ParseState, opt: str, values: list[str]) -> None:
        setattr(st.monitor, name, parse_int(values[0], "fd", opt))
    return handler


def _opt_lock_file(st: ParseState, opt: str, values: list[str]) -> None:
    st.monitor.lock_files.append(_dest(values[0]))


def _opt_assert_userns_disabled(st: ParseState, opt: str, values: list[str]) -> None:
    st.monitor.assert_userns_disabled = True


def _opt_label(st: ParseState, opt: str, values: list[str]) -> None:
    if not os.path.exists("/sys/fs/selinux/enforce"):  # as bwrap built without SELinux, or on a host without it
        raise BwrapArgsError("labeling not supported on this system", opt, values[0])
    raise BwrapArgsError("SELinux labels are not supported by this sandbox", opt, values[0])


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


@dataclass(frozen=True)
class Option:
    """One command-line option.

    `nargs` values follow it, named by `metavar` (one per value). Exactly one of
    `handler` (applies it while parsing) and `refused` (why it is not
    supported; the parser refuses it by name) is set. `last_wins`: a single
    value that bwrap warns about when repeated. `modifier`: it applies to the
    next option (--perms, --size), which must be one that takes it.
    """

    name: str
    nargs: int
    metavar: tuple[str, ...]
    help: str
    group: str
    handler: Handler | None = None
    refused: str | None = None
    last_wins: bool = False
    modifier: bool = False


def _refuse(name: str, metavar: tuple[str, ...], help: str, reason: str) -> Option:
    return Option(name, len(metavar), metavar, help, REFUSED, refused=reason)



OPTIONS: tuple[Option, ...] = (
    Option("--help", 0, (), "Print this help", GENERAL, _stop("help")),
    Option("--version", 0, (), "Print version", GENERAL, _stop("version")),
    Option("--args", 1, ("FD",), "Parse NUL-separated args from FD", GENERAL, _opt_args),

    Option("--unshare-all", 0, (), "Unshare every namespace we support by default", NAMESPACES,
           _unshare("user-try", "ipc", "pid", "uts", "cgroup-try", net=True)),
    Option("--share-net", 0, (), "Retain the network namespace", NAMESPACES, _unshare(net=False)),
    Option("--unshare-user", 0, (), "Create new user namespace (implied when not root)", NAMESPACES,
           _unshare("user")),
    Option("--unshare-user-try", 0, (), "Create new user namespace if possible", NAMESPACES, _unshare("user-try")),
    Option("--unshare-ipc", 0, (), "Create new ipc namespace", NAMESPACES, _unshare("ipc")),
    Option("--unshare-pid", 0, (), "Create new pid namespace", NAMESPACES, _unshare("pid")),
    Option("--unshare-net", 0, (), "Create new network namespace (loopback only)", NAMESPACES, _unshare(net=True)),
    Option("--unshare-uts", 0, (), "Create new uts namespace", NAMESPACES, _unshare("uts")),
    Option("--unshare-cgroup", 0, (), "Create new cgroup namespace", NAMESPACES, _unshare("cgroup")),
    Option("--unshare-cgroup-try", 0, (), "Create new cgroup namespace if possible", NAMESPACES,
           _unshare("cgroup-try")),
    Option("--disable-userns", 0, (), "Disable further use of user namespaces (requires --unshare-user)",
           NAMESPACES, _flag("disable_userns")),

    Option("--uid", 1, ("UID",), "Custom uid in the sandbox (requires a user namespace)", PROCESS, _opt_uid,
           last_wins=True),
    Option("--gid", 1, ("GID",), "Custom gid in the sandbox (requires a user namespace)", PROCESS, _opt_gid,
           last_wins=True),
    Option("--hostname", 1, ("NAME",), "Custom hostname in the sandbox (requires --unshare-uts)", PROCESS,
           _opt_hostname, last_wins=True),
    Option("--chdir", 1, ("DIR",), "Change directory to DIR", PROCESS, _opt_chdir, last_wins=True),
    Option("--clearenv", 0, (), "Unset all environment variables", PROCESS, _opt_clearenv),
    Option("--setenv", 2, ("VAR", "VALUE"), "Set an environment variable", PROCESS, _opt_setenv),
    Option("--unsetenv", 1, ("VAR",), "Unset an environment variable", PROCESS, _opt_unsetenv),
    Option("--new-session", 0, (), "Create a new terminal session", PROCESS, _flag("new_session")),
    Option("--die-with-parent", 0, (), "Kill COMMAND with SIGKILL when the sandbox's parent dies", PROCESS,
           _flag("die_with_parent")),
    Option("--as-pid-1", 0, (), "Do not install a reaper process with PID=1", PROCESS, _flag("as_pid_1")),

    Option("--bind", 2, ("SRC", "DEST"), "Bind mount the host path SRC on DEST", FILESYSTEM,
           _bind(S.Bind, False)),
    Option("--bind-try", 2, ("SRC", "DEST"), "Equal to --bind but ignores non-existent SRC", FILESYSTEM,
           _bind(S.Bind, True)),
    Option("--dev-bind", 2, ("SRC", "DEST"), "Bind mount the host path SRC on DEST, allowing device access",
           FILESYSTEM, _bind(S.DevBind, False)),
    Option("--dev-bind-try", 2, ("SRC", "DEST"), "Equal to --dev-bind but ignores non-existent SRC", FILESYSTEM,
           _bind(S.DevBind, True)),
    Option("--ro-bind", 2, ("SRC", "DEST"), "Bind mount the host path SRC readonly on DEST", FILESYSTEM,
           _bind(S.RoBind, False)),
    Option("--ro-bind-try", 2, ("SRC", "DEST"), "Equal to --ro-bind but ignores non-existent SRC", FILESYSTEM,
           _bind(S.RoBind, True)),
    Option("--remount-ro", 1, ("DEST",), "Remount DEST as readonly; does not recursively remount", FILESYSTEM,
           _opt_remount_ro),
    Option("--proc", 1, ("DEST",), "Mount new procfs on DEST", FILESYSTEM, _opt_proc),
    Option("--dev", 1, ("DEST",), "Mount new dev on DEST", FILESYSTEM, _opt_dev),
    Option("--tmpfs", 1, ("DEST",), "Mount new tmpfs on DEST", FILESYSTEM, _opt_tmpfs),
    Option("--mqueue", 1, ("DEST",), "Mount new mqueue on DEST", FILESYSTEM, _opt_mqueue),
    Option("--dir", 1, ("DEST",), "Create dir at DEST", FILESYSTEM, _opt_dir),
    Option("--file", 2, ("FD", "DEST"), "Copy from FD to destination DEST", FILESYSTEM,
           _data_file(0o666, readonly=False)),
    Option("--bind-data", 2, ("FD", "DEST"), "Copy from FD to file which is bind-mounted on DEST", FILESYSTEM,
           _data_file(0o600, readonly=False)),
    Option("--ro-bind-data", 2, ("FD", "DEST"), "Copy from FD to file which is readonly bind-mounted on DEST",
           FILESYSTEM, _data_file(0o600, readonly=True)),
    Option("--symlink", 2, ("SRC", "DEST"), "Create symlink at DEST with target SRC", FILESYSTEM, _opt_symlink),
    Option("--perms", 1, ("OCTAL",), "Set permissions of next argument (--dir, --file, --tmpfs, ...)",
           FILESYSTEM, _opt_perms, modifier=True),
    Option("--size", 1, ("BYTES",), "Set size of next argument (only for --tmpfs)", FILESYSTEM, _opt_size,
           modifier=True),
    Option("--chmod", 2, ("OCTAL", "PATH"), "Change permissions of PATH (must already exist)", FILESYSTEM,
           _opt_chmod),

    Option("--cap-add", 1, ("CAP",), "Add cap CAP (or ALL)", SECURITY, _opt_cap),
    Option("--cap-drop", 1, ("CAP",), "Drop cap CAP (or ALL)", SECURITY, _opt_cap),
    Option("--seccomp", 1, ("FD",), "Load and use seccomp rules from FD (a raw BPF program)",
           SECURITY, _opt_seccomp, last_wins=True),

    Option("--spec", 1, ("FILE_OR_JSON",), "Start from this Spec (JSON text or a file); other options apply on top",
           OURS, _opt_spec, last_wins=True),
    Option("--backend", 1, ("|".join(BACKENDS),), "Choose the backend (default auto)", OURS,
           _opt_backend, last_wins=True),
    Option("--close-fds", 0, (), "Do not pass inherited fds other than stdin/stdout/stderr", OURS,
           _opt_close_fds),
    Option("--netns-pool", 0, (), "With --unshare-net: lease the network namespace from a pool", OURS,
           _opt_netns_pool),
    Option("--seccomp-default", 0, (), "Apply this package's default seccomp policy (bubblewrap applies none)",
           OURS, _flag("seccomp_default")),
    Option("--verbose", 0, (), "Say on stderr which backend runs COMMAND, and why", OURS, _opt_verbose),
    Option("--dry-run", 0, (), "Print the sandbox in words and as a bwrap command line; run nothing", OURS,
           _opt_dry_run),
    *(Option(limit.option, 1, (limit.metavar,), limit.help, OURS, _opt_limit) for limit in LIMITS),

    Option("--info-fd", 1, ("FD",), "Write information about the running container to FD", MONITOR,
           _monitor_fd("info_fd"), last_wins=True),
    Option("--json-status-fd", 1, ("FD",), "Write container status to FD as multiple JSON documents", MONITOR,
           _monitor_fd("json_status_fd"), last_wins=True),
    Option("--sync-fd", 1, ("FD",), "Keep this fd open while sandbox is running", MONITOR,
           _monitor_fd("sync_fd"), last_wins=True),
    Option("--lock-file", 1, ("DEST",), "Take a lock on DEST while sandbox is running", MONITOR, _opt_lock_file),
    Option("--assert-userns-disabled", 0, (), "Fail unless further use of user namespaces is inhibited",
           MONITOR, _opt_assert_userns_disabled),
    Option("--add-seccomp-fd", 1, ("FD",), "Load and use seccomp rules from FD (repeatable: stacked in order)",
           SECURITY, _opt_add_seccomp_fd),
    Option("--exec-label", 1, ("LABEL",), "Exec label for the sandbox", SECURITY, _opt_label, last_wins=True),
    Option("--file-label", 1, ("LABEL",), "File label for temporary sandbox content", SECURITY, _opt_label,
           last_wins=True),

    Option("--userns", 1, ("FD",), "Use this user namespace (cannot combine with --unshare-user)", NAMESPACES,
           _monitor_fd("userns_fd"), last_wins=True),
    Option("--pidns", 1, ("FD",), "Use this pid namespace (as parent namespace if using --unshare-pid)",
           NAMESPACES, _monitor_fd("pidns_fd"), last_wins=True),
    Option("--userns2", 1, ("FD",), "After setup switch to this user namespace, only useful with --userns",
           NAMESPACES, _monitor_fd("userns2_fd"), last_wins=True),
    Option("--block-fd", 1, ("FD",), "Block on FD until some data to read is available", MONITOR,
           _monitor_fd("block_fd"), last_wins=True),
    Option("--userns-block-fd", 1, ("FD",), "Block on FD until the user namespace is ready", MONITOR,
           _monitor_fd("userns_block_fd"), last_wins=True),
    Option("--bind-fd", 2, ("FD", "DEST"), "Bind open directory or path fd on DEST (bubblewrap 0.10)", FILESYSTEM,
           _bind_fd(S.Bind)),
    Option("--ro-bind-fd", 2, ("FD", "DEST"), "Bind open directory or path fd read-only on DEST (bubblewrap 0.10)",
           FILESYSTEM, _bind_fd(S.RoBind)),
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
(`--seccomp FD`, `--seccomp-default`, or a `--spec` with a "seccomp" policy).
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
