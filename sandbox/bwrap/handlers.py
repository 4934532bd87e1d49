"""The option handlers: each applies one option to the `ParseState`.

A handler is called as `handler(state, option_name, values)`: it checks and
converts the values with bwrap's rules and messages (`values.py`) and
records what the option asks for. `opt_*` handle one option each; the
other functions make a handler for a family of options (`bind(S.RoBind,
optional=True)` is `--ro-bind-try`). The table in `grammar.py` names them.
"""

from __future__ import annotations

import os
import posixpath

from .. import spec as S
from ..validate import valid_env_name
from .state import BACKENDS, LIMIT_FIELD, MAX_ARGS, PROC_COVERS, BwrapArgsError, Handler, ParseState
from .values import (
    consume_fd,
    dest_path,
    parse_cpus,
    parse_int,
    parse_octal,
    parse_positive,
    parse_size,
    source_path,
    split_args,
)

# ---------------------------------------------------------------- handlers: general

def stop(what: str) -> Handler:
    """--help / --version: parsing stops there; the CLI prints the help or the version."""
    def handler(st: ParseState, opt: str, values: list[str]) -> None:
        st.stop = what
    return handler


def opt_args(st: ParseState, opt: str, values: list[str]) -> None:
    items = split_args(consume_fd(st, opt, values[0], "Can't read --args data"))
    st.total += len(items)
    if st.total > MAX_ARGS:
        raise BwrapArgsError(f"Exceeded maximum number of arguments {MAX_ARGS}", opt, st.total)
    st.included = items


def opt_spec(st: ParseState, opt: str, values: list[str]) -> None:
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


def opt_image(st: ParseState, opt: str, values: list[str]) -> None:
    """--image REF: the Spec of sandbox.presets.image(REF), from the default store, as the base."""
    # lazy: the image store only for --image: 83 ms (import timed, median of 7), never on a plain run
    from ..images import ImageError
    from ..presets import image

    try:
        st.base = image(values[0])
    except ImageError as exc:
        raise BwrapArgsError(f"Can't use --image {values[0]}: {exc}", opt, values[0]) from None


def opt_backend(st: ParseState, opt: str, values: list[str]) -> None:
    if values[0] not in BACKENDS:
        raise BwrapArgsError(f"--backend must be one of {', '.join(BACKENDS)}", opt, values[0])
    st.backend = values[0]


def opt_proc_covers(st: ParseState, opt: str, values: list[str]) -> None:
    if values[0] not in PROC_COVERS:
        raise BwrapArgsError(f"--proc-covers must be one of {', '.join(PROC_COVERS)}", opt, values[0])
    st.proc_covers = values[0]


def opt_close_fds(st: ParseState, opt: str, values: list[str]) -> None:
    st.close_fds = True


def opt_verbose(st: ParseState, opt: str, values: list[str]) -> None:
    st.verbose = True


def opt_dry_run(st: ParseState, opt: str, values: list[str]) -> None:
    st.dry_run = True


def flag_of_state(name: str) -> Handler:
    """An option that only sets a flag of the parse state (`--show-secrets`), not of the Spec."""
    def handler(st: ParseState, opt: str, values: list[str]) -> None:
        setattr(st, name, True)
    return handler


def opt_netns_pool(st: ParseState, opt: str, values: list[str]) -> None:
    st.net_pool = True


def opt_limit(st: ParseState, opt: str, values: list[str]) -> None:
    field = LIMIT_FIELD[opt]
    st.limits[field] = parse_cpus(values[0], opt) if field == "cpu_cores" else parse_positive(values[0], opt)


# ---------------------------------------------------------------- handlers: namespaces and identity

def unshare(*names: str, net: bool | None = None) -> Handler:
    """An --unshare-* option: the namespaces `names`; `net` True/False for the network."""
    def handler(st: ParseState, opt: str, values: list[str]) -> None:
        st.unshare.update(names)
        if net is not None:
            st.net = net
    return handler


def opt_uid(st: ParseState, opt: str, values: list[str]) -> None:
    st.uid = parse_int(values[0], "uid", opt)


def opt_gid(st: ParseState, opt: str, values: list[str]) -> None:
    st.gid = parse_int(values[0], "gid", opt)


def opt_hostname(st: ParseState, opt: str, values: list[str]) -> None:
    st.hostname = values[0]


def opt_seccomp(st: ParseState, opt: str, values: list[str]) -> None:
    parse_int(values[0], "fd", opt)
    if st.seccomp_programs:
        raise BwrapArgsError("--seccomp cannot be combined with --add-seccomp-fd", opt, values[0])
    st.seccomp_fd = values[0]


def opt_add_seccomp_fd(st: ParseState, opt: str, values: list[str]) -> None:
    parse_int(values[0], "fd", opt)
    if st.seccomp_fd is not None:
        raise BwrapArgsError("--add-seccomp-fd cannot be combined with --seccomp", opt, values[0])
    data = consume_fd(st, opt, values[0], "Can't read seccomp data")  # read now, as bwrap does
    if len(data) % 8:
        raise BwrapArgsError("Invalid seccomp data, must be multiple of 8", opt, len(data))
    st.seccomp_programs.append(data)


# ---------------------------------------------------------------- handlers: environment and process

def opt_chdir(st: ParseState, opt: str, values: list[str]) -> None:
    st.chdir = S.normalize_path(posixpath.normpath(dest_path(values[0])))


def opt_setenv(st: ParseState, opt: str, values: list[str]) -> None:
    _check_env_name(opt, values[0])
    st.env_ops.append(("set", values[0], values[1]))


def opt_unsetenv(st: ParseState, opt: str, values: list[str]) -> None:
    _check_env_name(opt, values[0])
    st.env_ops.append(("unset", values[0], ""))


def opt_clearenv(st: ParseState, opt: str, values: list[str]) -> None:
    st.env_ops.append(("clear", "", ""))


def _check_env_name(opt: str, name: str) -> None:
    if not valid_env_name(name):
        raise BwrapArgsError(f"{opt[2:]} failed: invalid variable name {name!r}", opt, name)


def flag(name: str) -> Handler:
    """An option that only sets a flag of the Spec (`--new-session`, ...)."""
    def handler(st: ParseState, opt: str, values: list[str]) -> None:
        st.flags.add(name)
    return handler


def opt_cap(st: ParseState, opt: str, values: list[str]) -> None:
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

def bind(klass: type[S.Bind], optional: bool) -> Handler:
    """--bind and its kinds: `klass` is the Spec mount; `optional` the -try variant."""
    def handler(st: ParseState, opt: str, values: list[str]) -> None:
        src, dest = values
        if not src:
            if optional:
                return  # bwrap skips a -try source it cannot find
            raise BwrapArgsError("Can't find source path : No such file or directory", opt, src)
        st.mounts.append(klass(src=source_path(st, src), dest=dest_path(dest), optional=optional))
    return handler


def bind_fd(klass: type[S.Bind]) -> Handler:
    """bwrap 0.10's --bind-fd: the source is what the open fd names, as
    /proc/self/fd/FD names it (the backends resolve it in the sandbox's
    mount namespace and check that the same file was bound; see plan.FD_SOURCE);
    the fd is not passed to the command."""
    def handler(st: ParseState, opt: str, values: list[str]) -> None:
        fd = parse_int(values[0], "fd", opt)
        st.mounts.append(klass(src=f"/proc/self/fd/{fd}", dest=dest_path(values[1])))
        st.held.append(fd)
    return handler


def opt_tmpfs(st: ParseState, opt: str, values: list[str]) -> None:
    perms = st.take_perms(0o755)
    st.mounts.append(S.Tmpfs(dest=dest_path(values[0]), size=st.take_size(), perms=perms))


def opt_dir(st: ParseState, opt: str, values: list[str]) -> None:
    st.mounts.append(S.Dir(dest=dest_path(values[0]), perms=st.take_perms(0o755)))


def opt_proc(st: ParseState, opt: str, values: list[str]) -> None:
    st.mounts.append(S.Proc(dest=dest_path(values[0])))


def opt_dev(st: ParseState, opt: str, values: list[str]) -> None:
    st.mounts.append(S.Dev(dest=dest_path(values[0])))


def opt_mqueue(st: ParseState, opt: str, values: list[str]) -> None:
    st.mounts.append(S.Mqueue(dest=dest_path(values[0])))


def opt_symlink(st: ParseState, opt: str, values: list[str]) -> None:
    st.mounts.append(S.Symlink(target_path=values[0], dest=dest_path(values[1])))


def opt_remount_ro(st: ParseState, opt: str, values: list[str]) -> None:
    st.mounts.append(S.RemountRo(dest=dest_path(values[0])))


def opt_chmod(st: ParseState, opt: str, values: list[str]) -> None:
    st.mounts.append(S.Chmod(path=dest_path(values[1]), perms=parse_octal(values[0], opt)))


def data_file(default_perms: int, readonly: bool) -> Handler:
    """--file, --bind-data, --ro-bind-data: the fd's content becomes a file."""
    def handler(st: ParseState, opt: str, values: list[str]) -> None:
        data = consume_fd(st, opt, values[0], f"Can't write data to file {values[1]}")
        perms = st.take_perms(default_perms)
        st.mounts.append(S.File(dest=dest_path(values[1]), data=data, perms=perms, readonly=readonly))
    return handler


def opt_perms(st: ParseState, opt: str, values: list[str]) -> None:
    if st.next_perms is not None:
        raise BwrapArgsError("--perms given twice for the same action", opt, values[0])
    st.next_perms = parse_octal(values[0], opt)


def opt_size(st: ParseState, opt: str, values: list[str]) -> None:
    if st.next_size is not None:
        raise BwrapArgsError("--size given twice for the same action", opt, values[0])
    st.next_size = parse_size(values[0])


def monitor_fd(name: str) -> Handler:
    """An fd option the CLI process acts on (`--info-fd`, `--block-fd`, ...)."""
    def handler(st: ParseState, opt: str, values: list[str]) -> None:
        setattr(st.monitor, name, parse_int(values[0], "fd", opt))
    return handler


def opt_lock_file(st: ParseState, opt: str, values: list[str]) -> None:
    st.monitor.lock_files.append(dest_path(values[0]))


def opt_assert_userns_disabled(st: ParseState, opt: str, values: list[str]) -> None:
    st.monitor.assert_userns_disabled = True


def opt_label(st: ParseState, opt: str, values: list[str]) -> None:
    if not os.path.exists("/sys/fs/selinux/enforce"):  # as bwrap built without SELinux, or on a host without it
        raise BwrapArgsError("labeling not supported on this system", opt, values[0])
    raise BwrapArgsError("SELinux labels are not supported by this sandbox", opt, values[0])
