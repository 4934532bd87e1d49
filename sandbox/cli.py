"""The command line: `python -m sandbox run [OPTIONS...] [--] COMMAND [ARGS...]`
(bubblewrap 0.8.0's options), `python -m sandbox probe` and `--version`.
The `sandbox` console script is the same.

Exit status of `run`: the command's own; 128+N if signal N killed it; 125 for
a bad option, a failed setup or no usable backend; 126 if the command cannot
be executed; 127 if it does not exist. Errors are one `sandbox: ...` line on
stderr. SIGINT, SIGTERM and SIGHUP received while the command runs are
forwarded to it.

Invoked under the name `bwrap` (a link or script named so, whose argv[0]
ends in "bwrap"), the program is `run` with bwrap's own conventions for what
it says itself: messages start with `bwrap: `, every failure of its own
exits 1, the help names argv[0], and `--version` prints bwrap's line for
the release whose command line this is (`bubblewrap 0.8.0`; see
`version_text`). Code that runs `bwrap` and reads its messages, exit status
or version can then use this package unchanged.
"""

from __future__ import annotations

import os
import sys

from . import __version__

# lazy imports: only what every invocation needs is imported here; the rest when it is used, so that each
# command line loads only what its command uses (tests/unit/test_cold_path.py asserts which): `sandbox --version`
# loads this module alone (20 ms against the interpreter's 15), where the parser would add 48 ms, the registry of
# executors 55, the probe 208, explain 129 (each import timed alone after this module, median of 7).
TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (type checkers read the name)
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import NoReturn

    from .bwrap import monitor
    from .process import SandboxProcess
    from .spec import Spec

EXIT_SETUP = 125  # bad option, failed setup, no backend
EXIT_NOEXEC = 126  # command found but not executable
EXIT_NOTFOUND = 127  # command not found

USAGE = """\
usage: sandbox run [OPTIONS...] [--] COMMAND [ARGS...]
       sandbox probe
       sandbox serve [--socket PATH] [--client DEV:INO:MTIME] [--idle SECONDS]
       sandbox session start --spec FILE [--name NAME] [--idle-timeout SECONDS]
       sandbox session list | sandbox session stop ID
       sandbox exec [--cwd DIR] [--env NAME=VALUE]... [--user USER] ID [--] COMMAND [ARGS...]
       sandbox --version
       sandbox --help

commands:
    run      Run COMMAND in a sandbox described by bubblewrap-style OPTIONS
             (see `sandbox run --help`; `--dry-run` shows the
             sandbox without running it, `--verbose` says which backend ran)
    probe    Report what this host supports: which backends can run and why
    serve    The per-user CLI server the installed `sandbox` command starts
             on first use (docs/cli.md); it exits when idle
    session  Start, list or stop a sandbox that outlives the command line
             (sandbox.Session, docs/session.md); `sandbox session --help`
    exec     Run COMMAND inside a session started so, with this terminal
"""

PROBE_HELP = """\
usage: sandbox probe

Report what this host supports: the kernel, the caller's uid, whether the
native backend (the compiled core in this package, in-process namespaces) and
the bwrap backend (bubblewrap on PATH or $SANDBOX_BWRAP) can run, and if not
why, the user-namespace sysctls, and which package was imported. Exit status 0.
"""

EXIT_HELP = """\
Exit status: COMMAND's own; 128+N if signal N killed it; 125 for a bad option,
a failed setup or no usable backend; 126 if COMMAND cannot be executed; 127 if
it does not exist."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line `argv` (default: sys.argv[1:]); return the exit status.
    Without `argv`, a program named `bwrap` (sys.argv[0]) is `run` as bwrap (see above)."""
    if argv is None:
        return run_command_line(sys.argv[1:], sys.argv[0], one_shot=True)
    return run_command_line(argv, "", one_shot=False)


def program() -> NoReturn:
    """The `sandbox-py` console script and `python -m sandbox`: `main()`, and
    the process ends without tearing the interpreter down (sandbox.coldstart)."""
    from .exec_environ import undo_locale_coercion

    undo_locale_coercion()  # the command's environment is the caller's, as bwrap passes it on
    status = main()
    from .coldstart import exit_now

    exit_now(status)


def run_command_line(args: Sequence[str], argv0: str, one_shot: bool) -> int:
    """The command line `args` of a program invoked as `argv0` (named `bwrap`:
    bwrap's conventions; "": none); `one_shot`: this process runs one
    command and ends (the console script, the CLI server's worker)."""
    global _PARENT, _ONE_SHOT
    _PARENT = os.getppid()
    _ONE_SHOT = one_shot
    args = list(args)
    if args[:1] == ["--as-bwrap"] and len(args) >= 2:  # how the client (csrc/client/cliclient.c) says its name
        args, argv0 = args[2:], args[1]
    if os.path.basename(argv0) == BWRAP_NAME:
        return run_as_bwrap(args, argv0)
    prog = "python -m sandbox" if os.path.basename(argv0) == "__main__.py" else "sandbox"
    _CONVENTIONS.usage_name = f"{prog} run"
    if not args:
        sys.stderr.write(_named(USAGE, prog))
        return EXIT_SETUP
    command, rest = args[0], args[1:]
    if command in ("-h", "--help", "help"):
        sys.stdout.write(_named(USAGE, prog))
        return 0
    if command in ("-V", "--version"):
        print(f"sandbox {_version()}")
        return 0
    if command == "run":
        return run(rest)
    if command == "probe":
        return probe(rest)
    if command == "serve":
        from . import cli  # this module itself, typed as a module the CommandLine protocol matches
        from .cliserver import serve_command

        return serve_command(rest, cli)
    if command in ("session", "exec"):
        from .session import climain

        return climain.session_command(rest) if command == "session" else climain.exec_command(rest)
    return _fail(EXIT_SETUP, f"unknown command {command!r} (try --help)")


def _named(text: str, prog: str) -> str:
    """A help text as the program was invoked: `sandbox` (the installed command), or `python -m sandbox`."""
    return text.replace("sandbox ", f"{prog} ") if prog != "sandbox" else text


BWRAP_NAME = "bwrap"
BWRAP_EXIT_FAILURE = 1  # bwrap's die(): every failure of its own


class Conventions:
    """How the program speaks for itself: its message prefix, the exit status
    of its own failures (None: 125/126/127 as documented), its help's name,
    and whether `--version` is bwrap's (see `version_text`)."""

    def __init__(self, prefix: str = "sandbox", failure: int | None = None,
                 usage_name: str = "sandbox run", bwrap_version: bool = False) -> None:
        self.prefix = prefix
        self.failure = failure
        self.usage_name = usage_name
        self.bwrap_version = bwrap_version


_CONVENTIONS = Conventions()
_ONE_SHOT = False  # main() runs as the process's program: this process starts one sandbox


def run_as_bwrap(args: Sequence[str], argv0: str) -> int:
    """`run` with bwrap's conventions (`bwrap: ` messages, failures exit 1,
    the help naming `argv0`, bwrap's `--version`); the command's own exit
    status is unchanged."""
    global _CONVENTIONS
    _CONVENTIONS = Conventions(prefix=BWRAP_NAME, failure=BWRAP_EXIT_FAILURE, usage_name=argv0, bwrap_version=True)
    return run(args)


def version_text(tty: bool = False) -> str:
    """What `--version` prints: `sandbox X.Y.Z`; under bwrap's conventions,
    bwrap's own line naming the bubblewrap release whose command line this
    is (`bubblewrap 0.8.0`), alone, as programs that check bwrap's version
    read it (they take everything after `bubblewrap `, or the second field
    of each line). On a terminal (`tty`) a second line says what answered."""
    from . import bwrap

    if not _CONVENTIONS.bwrap_version:
        return f"sandbox {_version()}"
    text = f"bubblewrap {bwrap.BWRAP_RELEASE}"
    if tty:
        text += (f"\n(sandbox {_version()}: bubblewrap {bwrap.BWRAP_RELEASE}'s command line, "
                 "run by the sandbox package, not by bubblewrap)")
    return text


def _print_version() -> int:
    print(version_text(tty=sys.stdout.isatty()))
    return 0


def run(args: Sequence[str]) -> int:
    """`run [OPTIONS...] [--] COMMAND [ARGS...]`: run COMMAND, return its exit status."""
    if args[:1] == ["--version"]:  # what parsing would stop at, without loading the parser
        return _print_version()
    inherited = inherited_fds()  # before this process opens anything of its own
    if not _ONE_SHOT:
        return _run(args, inherited)
    # This process is ours: the garbage collector waits until the sandbox runs (_execute turns it on again).
    from .coldstart import pause_gc

    global _GC_PAUSED
    _GC_PAUSED = pause_gc()
    try:
        return _run(args, inherited)
    finally:
        _resume_gc()


_GC_PAUSED = False  # run() turned the garbage collector off


def _resume_gc() -> None:
    global _GC_PAUSED
    if _GC_PAUSED:
        import gc

        _GC_PAUSED = False
        gc.enable()


def _run(args: Sequence[str], inherited: list[int]) -> int:
    from .bwrap.parse import parse_bwrap_args
    from .errors import SpecError

    try:
        spec, command, extras = parse_bwrap_args(args)
    except SpecError as exc:
        return _fail(EXIT_SETUP, exc)
    for warning in extras.warnings:
        _say(warning)
    if PARSED_HOOK is not None and extras.replay is not None:
        PARSED_HOOK(extras.replay)
    if extras.show_help:
        from .bwrap.grammar import usage

        print(usage(_CONVENTIONS.usage_name))
        if _CONVENTIONS.failure is None:
            print(EXIT_HELP)
        return 0
    if extras.show_version:
        return _print_version()
    if extras.dry_run:
        return _dry_run(command, spec, extras.backend, extras.show_secrets)
    if spec.die_with_parent and not (DIE_WITH_PARENT_HOOK or _die_with_parent)():
        return _fail(EXIT_SETUP, "the caller is gone (--die-with-parent)")
    from .bwrap import monitor

    mon = extras.monitor
    if mon.assert_userns_disabled and not spec.disable_userns and not monitor.userns_creation_disabled():
        return _fail(EXIT_SETUP, "creation of new user namespaces was not disabled as requested")
    backend = extras.backend
    joined = False
    if (mon.userns_fd is not None or mon.pidns_fd is not None) and not _is_handed_namespaces(backend):
        backend = "native"  # natively this process joins them first
        try:
            monitor.join_namespaces(mon)
        except OSError as exc:
            return _fail(EXIT_SETUP, exc.strerror)
        joined = True
    held = {*extras.consumed_fds, *mon.fds()}
    if mon.sync_fd is not None and not spec.as_pid_1:  # bwrap leaks it into an --as-pid-1 command only
        held.add(mon.sync_fd)
    pass_fds: tuple[int, ...] = ()
    if not extras.close_fds:
        pass_fds = tuple(fd for fd in inherited if fd not in held and _is_open(fd))
    if _ONE_SHOT:
        _no_pool_for_network_none()
    return _execute(command, spec, pass_fds, backend, extras.verbose, mon, joined)


def _is_handed_namespaces(backend: str) -> bool:
    """Whether `backend` creates its namespaces inside the ones --userns/--pidns
    hand it (bwrap does); another backend needs this process to join them first."""
    from . import backends
    from .capabilities import Capability

    return backend != "auto" and backends.get(backend).traits.can(Capability.HANDED_NAMESPACES)


def _no_pool_for_network_none() -> None:
    """This process starts one sandbox: the network namespace pool pays off
    from a process's later spawns (it fills in the background after the
    first), so here it would only cost its start and stop. A sandbox without
    the host's network gets a fresh namespace, as under bwrap; `--netns-pool`
    still leases one from the pool."""
    from . import netpool

    netpool.disable()


def probe(args: Sequence[str]) -> int:
    """`probe`: print what this host supports."""
    if args[:1] in (["-h"], ["--help"]):
        sys.stdout.write(_named(PROBE_HELP, _CONVENTIONS.usage_name.removesuffix(" run")))
        return 0
    if args:
        return _fail(EXIT_SETUP, f"probe takes no arguments (got {args[0]!r}; try --help)")
    from .errors import SandboxError
    from .probe import probe as probe_host

    try:
        report = probe_host()
    except SandboxError as exc:
        return _fail(EXIT_SETUP, exc)
    print(str(report))
    return 0


# ---------------------------------------------------------------- running

def _dry_run(command: list[str], spec: Spec, backend: str, show_secrets: bool) -> int:
    """`--dry-run`: print the sandbox in words and as a bwrap command line
    (key-like values as <NAME> unless --show-secrets or $SANDBOX_SHOW_SECRETS=1)."""
    from .errors import SandboxError
    from .explain import explain
    from .redact import SHOW_SECRETS_ENV

    reveal = show_secrets or os.environ.get(SHOW_SECRETS_ENV) == "1"
    try:
        print(explain(spec, command, backend, reveal=reveal))
    except SandboxError as exc:
        return _fail(EXIT_SETUP, exc)
    return 0


def _execute(command: list[str], spec: Spec, pass_fds: tuple[int, ...], backend: str, verbose: bool = False,
             mon: monitor.Monitor | None = None, joined: bool = False) -> int:
    """Spawn the sandbox, forward signals while waiting, map the outcome to an exit status.
    `joined`: this process joined --userns and --pidns already."""
    from .bwrap import monitor
    from .errors import ExecError, ExecNotFoundError, SandboxError
    from .signal_relay import SignalForwarder

    mon = mon or monitor.Monitor()
    with SignalForwarder() as forwarder:
        try:
            proc = _spawn_reported(command, spec, pass_fds, backend, mon, joined)
            if verbose:
                _say(f"{proc.backend} backend ({proc.backend_reason}), network {proc.network}")
            locks = _report_start(proc, mon, [] if _has_pid1(spec) else mon.lock_files)
            _resume_gc()  # the sandbox runs: this process may wait for it for long
            returncode = forwarder.wait(proc, WAIT_READERS)
        except ExecNotFoundError as exc:
            return _fail(EXIT_NOTFOUND, exc)
        except ExecError as exc:
            return _fail(EXIT_NOEXEC, exc)
        except (SandboxError, OSError) as exc:
            return _fail(EXIT_SETUP, exc)
    status = returncode if returncode >= 0 else 128 - returncode
    if mon.json_status_fd is not None:
        monitor.write_json_line(mon.json_status_fd, {"exit-code": status})
    for fd in locks:
        os.close(fd)
    return status


def _spawn_reported(command: list[str], spec: Spec, pass_fds: tuple[int, ...], backend: str,
                    mon: monitor.Monitor, joined: bool) -> SandboxProcess:
    """Spawn with the sync options; --info-fd and --json-status-fd are written
    as soon as the sandbox's first process exists (even if its setup fails
    then, as bwrap's), by a thread that reads the pid it reports."""
    import contextlib

    from .api import spawn
    from .bwrap import monitor
    from .sync import NO_SYNC

    report = monitor.StartReport(mon) if mon.reports else None
    sync = mon.sync(report.started_fd if report else -1, joined, pid1=_has_pid1(spec))
    try:
        proc = spawn(command, spec, pass_fds=pass_fds, backend=backend, sync=sync if sync.active else NO_SYNC)
    except BaseException:
        if report:
            with contextlib.suppress(OSError):
                report.done()
        raise
    try:
        mon.reported = report is not None and report.done() is not None
    except BaseException:  # the records could not be written: the sandbox ends, as in _report_start
        proc.kill()
        proc.wait()
        raise
    return proc


def _has_pid1(spec: Spec) -> bool:
    """Whether the sandbox has a pid 1 of ours (which takes --lock-file's locks, as bwrap's)."""
    return spec.namespaces.pid and not spec.as_pid_1


def _report_start(proc: SandboxProcess, mon: monitor.Monitor, lock_files: list[str]) -> list[int]:
    """The sandbox runs: --info-fd and --json-status-fd's first record (if not
    written yet), the `lock_files` its pid 1 does not take. Returns the fds
    holding the locks. A failure here ends the sandbox."""
    from .bwrap import monitor

    try:
        if mon.reports and not mon.reported:
            monitor.write_start(mon, monitor.namespace_info(proc.sandbox_pid))
        return monitor.lock_files(proc.sandbox_pid, lock_files)
    except BaseException:
        proc.kill()
        proc.wait()
        raise


_PARENT = os.getppid()  # the caller, read again as early as main() runs
# The CLI server's worker (sandbox/cliserver/worker.py) stands in for the
# client process: --die-with-parent is the client's, and the fds it holds of
# its own are not the command's.
DIE_WITH_PARENT_HOOK: Callable[[], bool] | None = None
HIDDEN_FDS: set[int] = set()
# ... and it tells the server the pure options of a command line parsed (bwrap/memo.py), so that the next
# worker has their Spec and plan ready.
PARSED_HOOK: Callable[[tuple[str, ...]], None] | None = None
# ... and it reads its client's frames (a signal to forward) whenever they come: SIGIO says so, and
# so does the wait for the sandbox, which watches these fds too (fd -> read(): False once it is done).
WAIT_READERS: dict[int, Callable[[], bool]] = {}


def _die_with_parent() -> bool:
    """PR_SET_PDEATHSIG(SIGKILL) on this process too, as bwrap sets it on its
    own: the sandbox dies with us (its own death signal) and we with our
    caller, so nothing is left running when the caller is killed. The kernel
    sends it only for a parent that dies after the prctl; if ours died
    before, we were re-parented: False."""
    import ctypes
    import signal

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    return os.getppid() == _PARENT


PR_SET_PDEATHSIG = 1


# ---------------------------------------------------------------- file descriptors

def inherited_fds() -> list[int]:
    """The fds above 2 open in this process now (not the one used to list them)."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return []
    fds = sorted(int(name) for name in names if name.isdigit() and int(name) > 2)
    return [fd for fd in fds if fd not in HIDDEN_FDS and _is_open(fd)]


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


# ---------------------------------------------------------------- messages

def _fail(status: int, error: object) -> int:
    _say(_message(error))
    return status if _CONVENTIONS.failure is None else _CONVENTIONS.failure


def _say(text: str) -> None:
    sys.stderr.write(f"{_CONVENTIONS.prefix}: {' '.join(text.splitlines())}\n")
    sys.stderr.flush()


def _message(error: object) -> str:
    from .errors import ExecError, SandboxError

    if isinstance(error, ExecError) and error.errno:  # bwrap's words
        return f"execvp {error.filename}: {os.strerror(error.errno)}"
    if isinstance(error, ExecError) and error.strerror:
        return error.strerror
    if isinstance(error, OSError) and not isinstance(error, SandboxError) and error.strerror:
        where = f": {error.filename}" if error.filename is not None else ""
        return f"{error.strerror}{where}"
    return str(error)


def _version() -> str:
    """The version of the code running (not of whatever is installed elsewhere)."""
    return __version__
