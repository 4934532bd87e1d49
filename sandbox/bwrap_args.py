"""Turn a bubblewrap 0.8.0 command line into a Spec.

`parse_bwrap_args(["--ro-bind", "/usr", "/usr", "--unshare-all", "--", "sh"])`
returns the Spec, the command argv and a `CliExtras` with what the CLI needs
beyond the Spec. The grammar is bwrap's: only `--opt value`, options applied
in order, options end at `--` or at the first argument not starting with `-`.
Errors are `BwrapArgsError` (a SpecError) whose message is bwrap's wording.

Unlike the Python API, the defaults here are bwrap's: every namespace shared
unless asked (the user namespace is implied for a non-root caller), the host
network, the caller's environment, no die-with-parent and no new session;
root keeps its effective capabilities. The one default kept from the Spec is
its seccomp policy (`--seccomp FD` replaces it with a raw program; a `--spec`
with "seccomp": null removes it). bwrap options this package does not
implement are refused by name.

Parsing has side effects like bwrap's: the fds given to `--args`, `--file`,
`--bind-data` and `--ro-bind-data` are read to the end and closed (an fd 0-2
is replaced by /dev/null instead, so the stdio numbers stay taken).
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from . import spec as S
from .errors import SpecError
from .host import HostInfo, effective_caps, userns_available
from .plan import resolve_env
from .seccomp import Seccomp

MAX_ARGS = 9000
MAX_TMPFS_BYTES = 2**63 - 1  # bwrap: SIZE_MAX / 2
MAX_INT = 2**31 - 1
BACKENDS = ("auto", "native", "bwrap")

# bwrap 0.8.0 options this package does not implement: refused by name.
UNSUPPORTED = frozenset({
    "--userns", "--userns2", "--pidns", "--lock-file", "--sync-fd", "--block-fd",
    "--userns-block-fd", "--info-fd", "--json-status-fd", "--add-seccomp-fd",
    "--exec-label", "--file-label", "--assert-userns-disabled",
    "--mqueue", "--bind-fd", "--ro-bind-fd",
})

# Single-value options that warn "Only the last X option will take effect".
WARN_REPEATED = frozenset({"--chdir", "--uid", "--gid", "--hostname", "--seccomp", "--spec", "--backend"})

MODIFIERS = frozenset({"--perms", "--size"})

LIMIT_OPTIONS = {
    "--limit-cpu": "cpu_s",
    "--limit-memory": "memory_mb",
    "--limit-file": "file_mb",
    "--limit-nofile": "nofile",
    "--limit-nproc": "nproc",
}


class BwrapArgsError(SpecError):
    """A bad command line. `str()` is the bwrap-style message ("Unknown option --foo");
    `field` names the option, `value` holds the offending argument."""

    def __init__(self, message: str, option: str, value: object = None) -> None:
        super().__init__(option, value, message)
        self.args = (message,)


@dataclass(frozen=True)
class CliExtras:
    """What the CLI needs that is not part of a Spec.

    backend: "auto", "native" or "bwrap" (`--backend`).
    close_fds: True with `--close-fds`: inherited fds other than stdio are not
    passed to the command (bwrap passes every inherited fd through).
    consumed_fds: fds read and closed while parsing (`--args`, `--file`, ...);
    they must not be passed through.
    warnings: bwrap-style warnings ("Only the last --chdir option will take effect").
    show_help / show_version: `--help` / `--version` was given; parsing stopped there.
    """

    backend: str = "auto"
    close_fds: bool = False
    consumed_fds: tuple[int, ...] = ()
    warnings: tuple[str, ...] = ()
    show_help: bool = False
    show_version: bool = False


@dataclass
class _State:
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
    base: S.Spec | None = None
    backend: str = "auto"
    close_fds: bool = False
    consumed: list[int] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)
    next_perms: int | None = None
    next_size: int | None = None
    total: int = 0
    stop: str | None = None  # "help" or "version"

    def take_perms(self, default: int) -> int:
        """The pending --perms value (consumed), else `default`."""
        perms, self.next_perms = self.next_perms, None
        return default if perms is None else perms

    def take_size(self) -> int | None:
        """The pending --size value (consumed), if any."""
        size, self.next_size = self.next_size, None
        return size


Handler = Callable[[_State, str, list[str]], None]


# ---------------------------------------------------------------- public API

def parse_bwrap_args(
    args: Sequence[str],
    *,
    environ: Mapping[str, str] | None = None,
    cwd: str | None = None,
    uid: int | None = None,
    gid: int | None = None,
) -> tuple[S.Spec, list[str], CliExtras]:
    """Parse a bwrap command line (without the leading "bwrap").

    `environ`, `cwd`, `uid` and `gid` describe the caller (default: this
    process); the environment is what the command inherits, the cwd resolves
    relative bind sources and sets PWD, and a non-zero uid implies a user
    namespace as in bwrap. Returns (spec, command argv, extras); the argv is
    empty only when `--help` or `--version` stopped parsing.
    Raises SpecError (BwrapArgsError for grammar errors).
    """
    host = _host(environ, cwd, uid, gid)
    st = _State(cwd=host.cwd or "/", total=len(args))
    if st.total > MAX_ARGS:
        raise BwrapArgsError(f"Exceeded maximum number of arguments {MAX_ARGS}", "args", len(args))
    command = _parse_list(st, list(args), in_file=False)
    if st.stop:
        return S.Spec(), [], _extras(st)
    if not command:
        raise BwrapArgsError("No command given (usage: [OPTIONS...] [--] COMMAND [ARGS...])", "command", [])
    spec = _build(st, host)
    return spec, command, _extras(st)


def from_bwrap_args(
    args: Sequence[str],
    *,
    environ: Mapping[str, str] | None = None,
    cwd: str | None = None,
    uid: int | None = None,
    gid: int | None = None,
) -> tuple[S.Spec, list[str]]:
    """Like `parse_bwrap_args`, returning only (spec, command argv)."""
    spec, argv, _ = parse_bwrap_args(args, environ=environ, cwd=cwd, uid=uid, gid=gid)
    return spec, argv


def _extras(st: _State) -> CliExtras:
    return CliExtras(
        backend=st.backend, close_fds=st.close_fds, consumed_fds=tuple(st.consumed),
        warnings=tuple(st.warnings), show_help=st.stop == "help", show_version=st.stop == "version",
    )


def _host(environ: Mapping[str, str] | None, cwd: str | None, uid: int | None, gid: int | None) -> HostInfo:
    if cwd is None:
        try:
            cwd = os.getcwd()
        except OSError:
            cwd = None
    return HostInfo(
        uid=os.getuid() if uid is None else uid,
        gid=os.getgid() if gid is None else gid,
        cwd=cwd,
        environ=dict(os.environ if environ is None else environ),
    )


# ---------------------------------------------------------------- the grammar

def _parse_list(st: _State, args: list[str], in_file: bool) -> list[str]:
    """Apply the options at the front of `args`; return what follows them."""
    i = 0
    while i < len(args):
        opt = args[i]
        if opt == "--":
            return args[i + 1:]
        if not opt.startswith("-"):
            return args[i:]
        nargs, handler = _lookup(opt)
        if opt == "--args" and in_file:
            raise BwrapArgsError("--args not supported in arguments file", opt)
        values = args[i + 1:i + 1 + nargs]
        if len(values) < nargs:
            raise BwrapArgsError(_takes(opt, nargs), opt)
        _warn_repeated(st, opt)
        handler(st, opt, values)
        if st.stop:
            return []
        i += 1 + nargs
        if opt not in MODIFIERS:
            _check_pending(st)
    return []


def _lookup(opt: str) -> tuple[int, Handler]:
    if opt in UNSUPPORTED:
        raise BwrapArgsError(f"{opt} is not supported by this sandbox", opt)
    try:
        return OPTIONS[opt]
    except KeyError:
        raise BwrapArgsError(f"Unknown option {opt}", opt) from None


def _takes(opt: str, nargs: int) -> str:
    if nargs == 2:
        return f"{opt} takes two arguments"
    if opt in ("--chdir", "--remount-ro"):
        return f"{opt} takes one argument"
    return f"{opt} takes an argument"


def _warn_repeated(st: _State, opt: str) -> None:
    if opt in WARN_REPEATED and opt in st.seen:
        st.warnings.append(f"Only the last {opt} option will take effect")
    st.seen.add(opt)


def _check_pending(st: _State) -> None:
    if st.next_perms is not None:
        raise BwrapArgsError("--perms must be followed by an option that creates a file", "--perms", st.next_perms)
    if st.next_size is not None:
        raise BwrapArgsError("--size must be followed by --tmpfs", "--size", st.next_size)


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


def _parse_int(text: str, what: str, option: str) -> int:
    """A non-negative decimal (an fd, uid or gid), as bwrap reads it."""
    value = _c_number(_DECIMAL, text, 10)
    if value is None or not 0 <= value <= MAX_INT:
        raise BwrapArgsError(f"Invalid {what}: {text}", option, text)
    return value


def _parse_octal(text: str, option: str) -> int:
    value = _c_number(_OCTAL, text, 8)
    if value is None or not 0 <= value <= 0o7777:
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

def _consume_fd(st: _State, option: str, text: str, failure: str) -> bytes:
    """Read fd `text` to the end and close it, as bwrap does with the fds it is given.
    An unreadable or already consumed fd raises "<failure>: <strerror>" (bwrap's EBADF)."""
    fd = _parse_int(text, "fd", option)
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


def _source(st: _State, path: str) -> str:
    """A host source path: relative to the caller's cwd; '..' resolved like realpath."""
    full = path if path.startswith("/") else posixpath.join(st.cwd, path)
    if ".." in full.split("/"):
        full = os.path.realpath(full)
    return full


def _chdir_path(path: str) -> str:
    return S.normalize_path(posixpath.normpath(_dest(path)))


# ---------------------------------------------------------------- handlers: general

def _opt_help(st: _State, opt: str, values: list[str]) -> None:
    st.stop = "help"


def _opt_version(st: _State, opt: str, values: list[str]) -> None:
    st.stop = "version"


def _opt_args(st: _State, opt: str, values: list[str]) -> None:
    items = _split_args(_consume_fd(st, opt, values[0], "Can't read --args data"))
    st.total += len(items)
    if st.total > MAX_ARGS:
        raise BwrapArgsError(f"Exceeded maximum number of arguments {MAX_ARGS}", opt, st.total)
    _parse_list(st, items, in_file=True)


def _opt_spec(st: _State, opt: str, values: list[str]) -> None:
    text = values[0]
    if text.lstrip().startswith("{"):
        st.base = S.Spec.from_json(text)
        return
    path = posixpath.join(st.cwd, text)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise BwrapArgsError(f"Can't read --spec file {text}: {exc.strerror}", opt, text) from None
    st.base = S.Spec.from_json(data)


def _opt_backend(st: _State, opt: str, values: list[str]) -> None:
    if values[0] not in BACKENDS:
        raise BwrapArgsError(f"--backend must be one of {', '.join(BACKENDS)}", opt, values[0])
    st.backend = values[0]


def _opt_close_fds(st: _State, opt: str, values: list[str]) -> None:
    st.close_fds = True


def _opt_netns_pool(st: _State, opt: str, values: list[str]) -> None:
    st.net_pool = True


def _opt_limit(st: _State, opt: str, values: list[str]) -> None:
    st.limits[LIMIT_OPTIONS[opt]] = _parse_positive(values[0], opt)


# ---------------------------------------------------------------- handlers: namespaces and identity

def _unshare(*names: str, net: bool | None = None) -> Handler:
    def handler(st: _State, opt: str, values: list[str]) -> None:
        st.unshare.update(names)
        if net is not None:
            st.net = net
    return handler


def _opt_uid(st: _State, opt: str, values: list[str]) -> None:
    st.uid = _parse_int(values[0], "uid", opt)


def _opt_gid(st: _State, opt: str, values: list[str]) -> None:
    st.gid = _parse_int(values[0], "gid", opt)


def _opt_hostname(st: _State, opt: str, values: list[str]) -> None:
    st.hostname = values[0]


def _opt_seccomp(st: _State, opt: str, values: list[str]) -> None:
    _parse_int(values[0], "fd", opt)
    st.seccomp_fd = values[0]


# ---------------------------------------------------------------- handlers: environment and process

def _opt_chdir(st: _State, opt: str, values: list[str]) -> None:
    st.chdir = _chdir_path(values[0])


def _opt_setenv(st: _State, opt: str, values: list[str]) -> None:
    _check_env_name(opt, values[0])
    st.env_ops.append(("set", values[0], values[1]))


def _opt_unsetenv(st: _State, opt: str, values: list[str]) -> None:
    _check_env_name(opt, values[0])
    st.env_ops.append(("unset", values[0], ""))


def _opt_clearenv(st: _State, opt: str, values: list[str]) -> None:
    st.env_ops.append(("clear", "", ""))


def _check_env_name(opt: str, name: str) -> None:
    if not name or "=" in name:
        raise BwrapArgsError(f"{opt[2:]} failed: invalid variable name {name!r}", opt, name)


def _flag(name: str) -> Handler:
    def handler(st: _State, opt: str, values: list[str]) -> None:
        st.flags.add(name)
    return handler


def _opt_cap(st: _State, opt: str, values: list[str]) -> None:
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
    def handler(st: _State, opt: str, values: list[str]) -> None:
        src, dest = values
        if not src:
            if optional:
                return  # bwrap skips a -try source it cannot find
            raise BwrapArgsError("Can't find source path : No such file or directory", opt, src)
        st.mounts.append(klass(src=_source(st, src), dest=_dest(dest), optional=optional))
    return handler


def _opt_tmpfs(st: _State, opt: str, values: list[str]) -> None:
    perms = st.take_perms(0o755)
    st.mounts.append(S.Tmpfs(dest=_dest(values[0]), size=st.take_size(), perms=perms))


def _opt_dir(st: _State, opt: str, values: list[str]) -> None:
    st.mounts.append(S.Dir(dest=_dest(values[0]), perms=st.take_perms(0o755)))


def _opt_proc(st: _State, opt: str, values: list[str]) -> None:
    st.mounts.append(S.Proc(dest=_dest(values[0])))


def _opt_dev(st: _State, opt: str, values: list[str]) -> None:
    st.mounts.append(S.Dev(dest=_dest(values[0])))


def _opt_symlink(st: _State, opt: str, values: list[str]) -> None:
    st.mounts.append(S.Symlink(target_path=values[0], dest=_dest(values[1])))


def _opt_remount_ro(st: _State, opt: str, values: list[str]) -> None:
    st.mounts.append(S.RemountRo(dest=_dest(values[0])))


def _opt_chmod(st: _State, opt: str, values: list[str]) -> None:
    st.mounts.append(S.Chmod(path=_dest(values[1]), perms=_parse_octal(values[0], opt)))


def _data_file(default_perms: int, readonly: bool) -> Handler:
    def handler(st: _State, opt: str, values: list[str]) -> None:
        data = _consume_fd(st, opt, values[0], f"Can't write data to file {values[1]}")
        perms = st.take_perms(default_perms)
        st.mounts.append(S.File(dest=_dest(values[1]), data=data, perms=perms, readonly=readonly))
    return handler


def _opt_perms(st: _State, opt: str, values: list[str]) -> None:
    if st.next_perms is not None:
        raise BwrapArgsError("--perms given twice for the same action", opt, values[0])
    st.next_perms = _parse_octal(values[0], opt)


def _opt_size(st: _State, opt: str, values: list[str]) -> None:
    if st.next_size is not None:
        raise BwrapArgsError("--size given twice for the same action", opt, values[0])
    st.next_size = _parse_size(values[0])


OPTIONS: dict[str, tuple[int, Handler]] = {
    "--help": (0, _opt_help),
    "--version": (0, _opt_version),
    "--args": (1, _opt_args),
    "--unshare-all": (0, _unshare("user-try", "ipc", "pid", "uts", "cgroup-try", net=True)),
    "--unshare-user": (0, _unshare("user")),
    "--unshare-user-try": (0, _unshare("user-try")),
    "--unshare-ipc": (0, _unshare("ipc")),
    "--unshare-pid": (0, _unshare("pid")),
    "--unshare-net": (0, _unshare(net=True)),
    "--unshare-uts": (0, _unshare("uts")),
    "--unshare-cgroup": (0, _unshare("cgroup")),
    "--unshare-cgroup-try": (0, _unshare("cgroup-try")),
    "--share-net": (0, _unshare(net=False)),
    "--uid": (1, _opt_uid),
    "--gid": (1, _opt_gid),
    "--hostname": (1, _opt_hostname),
    "--chdir": (1, _opt_chdir),
    "--clearenv": (0, _opt_clearenv),
    "--setenv": (2, _opt_setenv),
    "--unsetenv": (1, _opt_unsetenv),
    "--bind": (2, _bind(S.Bind, False)),
    "--bind-try": (2, _bind(S.Bind, True)),
    "--ro-bind": (2, _bind(S.RoBind, False)),
    "--ro-bind-try": (2, _bind(S.RoBind, True)),
    "--dev-bind": (2, _bind(S.DevBind, False)),
    "--dev-bind-try": (2, _bind(S.DevBind, True)),
    "--remount-ro": (1, _opt_remount_ro),
    "--proc": (1, _opt_proc),
    "--dev": (1, _opt_dev),
    "--tmpfs": (1, _opt_tmpfs),
    "--dir": (1, _opt_dir),
    "--file": (2, _data_file(0o666, readonly=False)),
    "--bind-data": (2, _data_file(0o600, readonly=False)),
    "--ro-bind-data": (2, _data_file(0o600, readonly=True)),
    "--symlink": (2, _opt_symlink),
    "--new-session": (0, _flag("new_session")),
    "--die-with-parent": (0, _flag("die_with_parent")),
    "--as-pid-1": (0, _flag("as_pid_1")),
    "--disable-userns": (0, _flag("disable_userns")),
    "--seccomp": (1, _opt_seccomp),
    "--cap-add": (1, _opt_cap),
    "--cap-drop": (1, _opt_cap),
    "--perms": (1, _opt_perms),
    "--size": (1, _opt_size),
    "--chmod": (2, _opt_chmod),
    # options of this package, not bwrap's
    "--spec": (1, _opt_spec),
    "--backend": (1, _opt_backend),
    "--close-fds": (0, _opt_close_fds),
    "--netns-pool": (0, _opt_netns_pool),
    **{name: (1, _opt_limit) for name in LIMIT_OPTIONS},
}


# ---------------------------------------------------------------- building the Spec

def _build(st: _State, host: HostInfo) -> S.Spec:
    """Combine the parsed options with the starting point (bwrap defaults or --spec)."""
    base = st.base
    if "disable_userns" in st.flags and "user" not in st.unshare and not (base and base.namespaces.user):
        raise BwrapArgsError("--disable-userns requires --unshare-user", "--disable-userns", True)
    ns = _namespaces(st, base, host.uid)
    uid, gid = _identity(st, base, ns.user, host)
    hostname = st.hostname if st.hostname is not None else (base.hostname if base else None)
    as_pid_1 = _flag_value(st, base, "as_pid_1")
    _check_needs(ns, hostname, as_pid_1)
    cwd = st.chdir if st.chdir is not None else (base.cwd if base else None)
    return S.Spec(
        mounts=(base.mounts if base else ()) + tuple(st.mounts),
        namespaces=ns,
        network=_network(st, base),
        hostname=hostname,
        uid=uid,
        gid=gid,
        env=_environment(st, base, host, pwd=cwd or host.cwd or "/"),
        env_inherit=(),
        cwd=cwd,
        limits=dataclasses.replace(base.limits if base else S.Limits(), **st.limits),
        die_with_parent=_flag_value(st, base, "die_with_parent"),
        new_session=_flag_value(st, base, "new_session"),
        as_pid_1=as_pid_1,
        cap_add=_capabilities(st, base, host.uid),
        disable_userns=_flag_value(st, base, "disable_userns"),
        seccomp=_seccomp(st, base),
    )


def _check_needs(ns: S.Namespaces, hostname: str | None, as_pid_1: bool) -> None:
    """bwrap's checks after parsing, with its messages."""
    if hostname is not None and not ns.uts:
        raise BwrapArgsError("Specifying --hostname requires --unshare-uts", "--hostname", hostname)
    if as_pid_1 and not ns.pid:
        raise BwrapArgsError("Specifying --as-pid-1 requires --unshare-pid", "--as-pid-1", True)


def _namespaces(st: _State, base: S.Spec | None, uid: int) -> S.Namespaces:
    start = base.namespaces if base else S.Namespaces(user=False, pid=False, ipc=False, uts=False, cgroup=False)
    asked = st.unshare
    user = start.user or "user" in asked or ("user-try" in asked and userns_available()) or uid != 0
    cgroup = start.cgroup or "cgroup" in asked or ("cgroup-try" in asked and os.path.exists("/proc/self/ns/cgroup"))
    return S.Namespaces(
        user=user, mount=True, pid=start.pid or "pid" in asked, ipc=start.ipc or "ipc" in asked,
        uts=start.uts or "uts" in asked, cgroup=cgroup,
    )


def _seccomp(st: _State, base: S.Spec | None) -> Seccomp | None:
    """`--seccomp FD`'s raw program, else the starting Spec's policy (the default policy)."""
    if st.seccomp_fd is None:
        return base.seccomp if base else S.Spec().seccomp
    data = _consume_fd(st, "--seccomp", st.seccomp_fd, "Can't read seccomp data")
    if len(data) % 8:
        raise BwrapArgsError("Invalid seccomp data, must be multiple of 8", "--seccomp", len(data))
    return Seccomp(raw=data)


def _network(st: _State, base: S.Spec | None) -> str:
    if st.net is None:
        network = base.network if base else "host"
    else:
        network = "none" if st.net else "host"
    return "pool" if st.net_pool and network == "none" else network


def _identity(st: _State, base: S.Spec | None, user: bool, host: HostInfo) -> tuple[int | None, int | None]:
    """The uid and gid inside, with bwrap's rule that changing them needs a user namespace."""
    out = []
    for name, value, real in (("uid", st.uid, host.uid), ("gid", st.gid, host.gid)):
        if value is not None and not user and value != real:
            raise BwrapArgsError(f"Specifying --{name} requires --unshare-user or --userns", f"--{name}", value)
        if not user:
            out.append(None)
        elif value is not None:
            out.append(value)
        else:
            out.append(getattr(base, name) if base else None)
    return out[0], out[1]


def _flag_value(st: _State, base: S.Spec | None, name: str) -> bool:
    return name in st.flags or (bool(getattr(base, name)) if base else False)


def _environment(st: _State, base: S.Spec | None, host: HostInfo, pwd: str) -> dict[str, str]:
    """The caller's environment (or the --spec one) edited in order; PWD set last."""
    env = dict(host.environ) if base is None else resolve_env(base, host.environ)
    for op, name, value in st.env_ops:
        if op == "clear":
            env.clear()
        elif op == "set":
            env[name] = value
        else:
            env.pop(name, None)
    env["PWD"] = pwd
    return env


def _capabilities(st: _State, base: S.Spec | None, uid: int) -> tuple[str, ...]:
    """bwrap's rule: root starts from its effective set, others from nothing;
    --cap-add / --cap-drop then apply in order."""
    caps = set(base.cap_add) if base else effective_caps() if uid == 0 else set()
    for add, name in st.cap_ops:
        names = set(S.CAPABILITIES) if name == "ALL" else {name}
        caps = caps | names if add else caps - names
    return tuple(c for c in S.CAPABILITIES if c in caps)
