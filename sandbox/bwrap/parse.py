"""Turn a bubblewrap 0.8.0 command line into a Spec.

`parse_bwrap_args(["--ro-bind", "/usr", "/usr", "--unshare-all", "--", "sh"])`
returns the Spec, the command argv and a `CliExtras` with what the CLI needs
beyond the Spec. The grammar is bwrap's: only `--opt value`, options applied
in order, options end at `--` or at the first argument not starting with `-`.
Each option is looked up in `grammar.OPTIONS`, whose handlers collect it;
this module then combines what they collected into the Spec. Errors are
`BwrapArgsError` (a SpecError) whose message is bwrap's wording.

Unlike the Python API, the defaults here are bwrap's: every namespace shared
unless asked (the user namespace is implied for a non-root caller), the host
network, the caller's environment, no die-with-parent and no new session;
root keeps its effective capabilities, no seccomp filter unless asked
(`--seccomp FD`'s raw program, `--seccomp-default` for the Spec's default
policy, or a `--spec`'s own policy), and a `--proc` covers what bwrap's
covers (`S.Proc(covers="bwrap")`; `--proc-covers strict` for the Python
API's covers; a `--spec`'s own Procs keep theirs). bwrap options this
package does not implement are refused by name.

Parsing has side effects like bwrap's: the fds given to `--args`, `--file`,
`--bind-data` and `--ro-bind-data` are read to the end and closed (an fd 0-2
is replaced by /dev/null instead, so the stdio numbers stay taken).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
from collections.abc import Mapping, Sequence

from .. import spec as S
from ..capabilities import Traits
from ..errors import SpecError
from ..host import HostInfo, effective_caps, userns_available
from ..validate import check_items, check_mapping, check_text
from . import memo
from .grammar import BY_NAME, Option
from .monitor import Monitor
from .record import FrozenRecord
from .state import MAX_ARGS, BwrapArgsError, ParseState
from .values import consume_fd

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (type checkers read the name)
if TYPE_CHECKING:
    from ..seccomp import Seccomp


class CliExtras(FrozenRecord):
    """What the CLI needs that is not part of a Spec.

    backend: "auto", "native" or "bwrap" (`--backend`).
    close_fds: True with `--close-fds`: inherited fds other than stdio are not
    passed to the command (bwrap passes every inherited fd through).
    consumed_fds: fds read and closed while parsing (`--args`, `--file`, ...),
    or used by the sandbox (`--bind-fd`); they must not be passed through.
    warnings: bwrap-style warnings ("Only the last --chdir option will take effect").
    verbose: `--verbose`: say on stderr which backend runs the command and why.
    dry_run: `--dry-run`: describe the sandbox and its bwrap command line, run nothing.
    show_secrets: `--show-secrets`: the description shows key-like environment values.
    monitor: the status and synchronization options (`--info-fd`, `--lock-file`, ...).
    show_help / show_version: `--help` / `--version` was given; parsing stopped there.
    replay: the options applied, `--args` files expanded, when all are pure (bwrap/memo.py); else None.

    Read-only; equal when every field but `replay` is (a FrozenRecord: see record.py).
    """

    __slots__ = ("backend", "close_fds", "consumed_fds", "warnings", "verbose", "dry_run", "show_secrets",
                 "show_help", "show_version", "monitor", "replay")
    _COMPARED = __slots__[:-1]
    backend: str
    close_fds: bool
    consumed_fds: tuple[int, ...]
    warnings: tuple[str, ...]
    verbose: bool
    dry_run: bool
    show_secrets: bool
    show_help: bool
    show_version: bool
    monitor: Monitor
    replay: tuple[str, ...] | None

    def __init__(self, backend: str = "auto", close_fds: bool = False, consumed_fds: tuple[int, ...] = (),
                 warnings: tuple[str, ...] = (), verbose: bool = False, dry_run: bool = False,
                 show_secrets: bool = False, show_help: bool = False, show_version: bool = False,
                 monitor: Monitor | None = None, replay: tuple[str, ...] | None = None) -> None:
        self._init(backend=backend, close_fds=close_fds, consumed_fds=consumed_fds, warnings=warnings,
                   verbose=verbose, dry_run=dry_run, show_secrets=show_secrets, show_help=show_help,
                   show_version=show_version, monitor=Monitor() if monitor is None else monitor, replay=replay)


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
    for i, arg in enumerate(check_items("args", args, "strings")):
        if not isinstance(arg, str):
            raise SpecError(f"args[{i}]", arg, "must be a string")
    host = _host(environ, cwd, uid, gid)
    st = ParseState(cwd=host.cwd or "/", total=len(args))
    if st.total > MAX_ARGS:
        raise BwrapArgsError(f"Exceeded maximum number of arguments {MAX_ARGS}", "args", len(args))
    command = _parse_list(st, list(args), in_file=False)
    if st.stop:
        return S.Spec(), [], _extras(st)
    if not command:
        raise BwrapArgsError("No command given (usage: [OPTIONS...] [--] COMMAND [ARGS...])", "command", [])
    spec = memo.built(st, host, _build)
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


def _extras(st: ParseState) -> CliExtras:
    return CliExtras(
        backend=st.backend, close_fds=st.close_fds, consumed_fds=tuple(st.consumed + st.held),
        warnings=tuple(st.warnings), verbose=st.verbose, dry_run=st.dry_run, show_secrets=st.show_secrets,
        show_help=st.stop == "help", show_version=st.stop == "version", monitor=st.monitor,
        replay=None if st.replay is None else tuple(st.replay),
    )


# Parsing reads only the caller's facts (ids, cwd, environment); no executor is involved yet.
PARSING = Traits("none", "no executor (a command line being parsed)", frozenset())


def _host(environ: Mapping[str, str] | None, cwd: str | None, uid: int | None, gid: int | None) -> HostInfo:
    """This process's ids, cwd and environment, with what the caller gave in
    their place (parsing needs no pool: reading its state would start it)."""
    check_mapping("environ", environ)
    if cwd is not None:
        check_text("cwd", cwd)
    for name, value in (("uid", uid), ("gid", gid)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise SpecError(name, value, "must be a non-negative integer or None")
    host = HostInfo.current(PARSING)
    return dataclasses.replace(
        host,
        uid=host.uid if uid is None else uid,
        gid=host.gid if gid is None else gid,
        cwd=host.cwd if cwd is None else cwd,
        environ=dict(host.environ if environ is None else environ),
    )


# ---------------------------------------------------------------- reading the options

def _parse_list(st: ParseState, args: list[str], in_file: bool) -> list[str]:
    """Apply the options at the front of `args`; return what follows them."""
    i = 0
    while i < len(args):
        name = args[i]
        if name == "--":
            return args[i + 1:]
        if not name.startswith("-"):
            return args[i:]
        option = _lookup(name)
        if name == "--args" and in_file:
            raise BwrapArgsError("--args not supported in arguments file", name)
        values = args[i + 1:i + 1 + option.nargs]
        if len(values) < option.nargs:
            raise BwrapArgsError(_takes(name, option.nargs), name)
        _warn_repeated(st, option)
        assert option.handler is not None  # _lookup refused the others
        option.handler(st, name, values)
        memo.note(st, name, values)
        if st.included is not None:  # --args FD: its arguments apply here
            included, st.included = st.included, None
            _parse_list(st, included, in_file=True)
        if st.stop:
            return []
        i += 1 + option.nargs
        if not option.modifier:
            _check_pending(st)
    return []


def _lookup(name: str) -> Option:
    option = BY_NAME.get(name)
    if option is None:
        raise BwrapArgsError(f"Unknown option {name}", name)
    if option.refused is not None:
        raise BwrapArgsError(f"{name} is not supported by this sandbox", name)
    return option


def _takes(name: str, nargs: int) -> str:
    if nargs == 2:
        return f"{name} takes two arguments"
    if name in ("--chdir", "--remount-ro"):
        return f"{name} takes one argument"
    return f"{name} takes an argument"


def _warn_repeated(st: ParseState, option: Option) -> None:
    if option.last_wins and option.name in st.seen:
        st.warnings.append(f"Only the last {option.name} option will take effect")
    st.seen.add(option.name)


def _check_pending(st: ParseState) -> None:
    if st.next_perms is not None:
        raise BwrapArgsError("--perms must be followed by an option that creates a file", "--perms", st.next_perms)
    if st.next_size is not None:
        raise BwrapArgsError("--size must be followed by --tmpfs", "--size", st.next_size)


# ---------------------------------------------------------------- building the Spec

def _build(st: ParseState, host: HostInfo) -> S.Spec:
    """Combine the parsed options with the starting point (bwrap defaults or --spec)."""
    base = st.base
    _check_userns_options(st, base)
    ns = _namespaces(st, base, host.uid)
    uid, gid = _identity(st, base, ns.user, host)
    hostname = st.hostname if st.hostname is not None else (base.hostname if base else None)
    as_pid_1 = _flag_value(st, base, "as_pid_1")
    _check_needs(ns, hostname, as_pid_1)
    cwd = st.chdir if st.chdir is not None else (base.cwd if base else None)
    mounts = tuple(dataclasses.replace(m, covers=st.proc_covers) if isinstance(m, S.Proc) else m for m in st.mounts)
    return S.Spec(
        mounts=(base.mounts if base else ()) + mounts,
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


def _check_userns_options(st: ParseState, base: S.Spec | None) -> None:
    """bwrap's checks of the user-namespace options, in its order and words
    (an implied user namespace, for a caller that is not root, does not count)."""
    user = "user" in st.unshare or bool(base and base.namespaces.user)
    block = st.monitor.userns_block_fd
    if block is not None and not user:
        raise BwrapArgsError("--userns-block-fd requires --unshare-user", "--userns-block-fd", block)
    if block is not None and st.monitor.info_fd is None:
        raise BwrapArgsError("--userns-block-fd requires --info-fd", "--userns-block-fd", block)
    if "disable_userns" in st.flags and not user:
        raise BwrapArgsError("--disable-userns requires --unshare-user", "--disable-userns", True)
    if "disable_userns" in st.flags and block is not None:
        raise BwrapArgsError("--disable-userns is not compatible with  --userns-block-fd", "--disable-userns", True)


def _check_needs(ns: S.Namespaces, hostname: str | None, as_pid_1: bool) -> None:
    """bwrap's checks after parsing, with its messages."""
    if hostname is not None and not ns.uts:
        raise BwrapArgsError("Specifying --hostname requires --unshare-uts", "--hostname", hostname)
    if as_pid_1 and not ns.pid:
        raise BwrapArgsError("Specifying --as-pid-1 requires --unshare-pid", "--as-pid-1", True)


def _namespaces(st: ParseState, base: S.Spec | None, uid: int) -> S.Namespaces:
    start = base.namespaces if base else S.Namespaces(user=False, pid=False, ipc=False, uts=False, cgroup=False)
    asked = st.unshare
    if st.monitor.userns_fd is not None and ("user" in asked or start.user):  # bwrap's words
        raise BwrapArgsError("--userns not compatible --unshare-user", "--userns", st.monitor.userns_fd)
    if st.monitor.userns_fd is not None and "user-try" in asked:
        raise BwrapArgsError("--userns not compatible --unshare-user-try", "--userns", st.monitor.userns_fd)
    implied = uid != 0 and st.monitor.userns_fd is None  # bwrap's, for a caller that is not root
    user = start.user or "user" in asked or ("user-try" in asked and userns_available()) or implied
    cgroup = start.cgroup or "cgroup" in asked or ("cgroup-try" in asked and os.path.exists("/proc/self/ns/cgroup"))
    return S.Namespaces(
        user=user, mount=True, pid=start.pid or "pid" in asked, ipc=start.ipc or "ipc" in asked,
        uts=start.uts or "uts" in asked, cgroup=cgroup,
    )


def _seccomp(st: ParseState, base: S.Spec | None) -> Seccomp | None:
    """`--seccomp FD`'s raw program, else the default policy with
    `--seccomp-default`, else the starting Spec's, else none (as bwrap).
    The seccomp package is imported only here, for a command line that asks for a filter (test_cold_path's
    plain run loads no seccomp module)."""
    if st.seccomp_programs:
        programs = [p for p in st.seccomp_programs if p]
        if len(programs) < len(st.seccomp_programs) or any(len(p) // 8 > BPF_MAXINSNS for p in programs):
            raise BwrapArgsError(SECCOMP_EINVAL, "--add-seccomp-fd", 0)
        # lazy: seccomp only for a command line asking for a filter (test_cold_path): 2.6 ms, 4.7 with the default
        from ..seccomp import Seccomp
        from ..seccomp.stack import stack

        return Seccomp(raw=stack(programs))
    if st.seccomp_fd is None:
        if "seccomp_default" in st.flags:
            # lazy: seccomp only for a command line asking for a filter (test_cold_path): 2.6 ms, 4.7 with the default
            from ..seccomp import DEFAULT_POLICY

            return DEFAULT_POLICY
        return base.seccomp if base else None
    data = consume_fd(st, "--seccomp", st.seccomp_fd, "Can't read seccomp data")
    if len(data) % 8:
        raise BwrapArgsError("Invalid seccomp data, must be multiple of 8", "--seccomp", len(data))
    if not 0 < len(data) // 8 <= BPF_MAXINSNS:  # what the kernel refuses, in bwrap's words
        raise BwrapArgsError(SECCOMP_EINVAL, "--seccomp", len(data))
    # lazy: seccomp only for a command line asking for a filter (test_cold_path): 2.6 ms, 4.7 with the default
    from ..seccomp import Seccomp

    return Seccomp(raw=data)


BPF_MAXINSNS = 4096  # the kernel's limit on one classic BPF program
SECCOMP_EINVAL = ("Unable to set up system call filtering as requested: prctl(PR_SET_SECCOMP) reported EINVAL. "
                  "(Hint: this requires a kernel configured with CONFIG_SECCOMP and CONFIG_SECCOMP_FILTER.)")


def _network(st: ParseState, base: S.Spec | None) -> str:
    if st.net is None:
        network = base.network if base else "host"
    else:
        network = "none" if st.net else "host"
    return "pool" if st.net_pool and network == "none" else network


def _identity(st: ParseState, base: S.Spec | None, user: bool, host: HostInfo) -> tuple[int | None, int | None]:
    """The uid and gid inside, with bwrap's rule that changing them needs a user namespace."""
    out: list[int | None] = []
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


def _flag_value(st: ParseState, base: S.Spec | None, name: str) -> bool:
    return name in st.flags or (bool(getattr(base, name)) if base else False)


def _environment(st: ParseState, base: S.Spec | None, host: HostInfo, pwd: str) -> dict[str, str]:
    """The caller's environment, or a --spec's (`env_inherit` taken from the caller's,
    then `env`), edited by the options in order; PWD set last."""
    env = dict(host.environ) if base is None else spec_environment(base, host.environ)
    for op, name, value in st.env_ops:
        if op == "clear":
            env.clear()
        elif op == "set":
            env[name] = value
        else:
            env.pop(name, None)
    env["PWD"] = pwd
    return env


def spec_environment(spec: S.Spec, environ: Mapping[str, str]) -> dict[str, str]:
    """A Spec's environment made explicit, as the Spec documents it: the names of
    `environ` that match an `env_inherit` pattern, overridden by `env`."""
    env = {name: value for name, value in environ.items()
           if any(fnmatch.fnmatchcase(name, pattern) for pattern in spec.env_inherit)}
    env.update(spec.env)
    return env


def _capabilities(st: ParseState, base: S.Spec | None, uid: int) -> tuple[str, ...]:
    """bwrap's rule: root starts from its effective set, others from nothing;
    --cap-add / --cap-drop then apply in order."""
    caps = set(base.cap_add) if base else effective_caps() if uid == 0 else set()
    for add, name in st.cap_ops:
        names = set(S.CAPABILITIES) if name == "ALL" else {name}
        caps = caps | names if add else caps - names
    return tuple(c for c in S.CAPABILITIES if c in caps)
