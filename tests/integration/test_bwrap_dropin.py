"""`python -m sandbox run` as a drop-in for bwrap 0.8.0: the behaviours
bubblewrap's own test suite (tests/test-run.sh and friends) checks, restated
here in our words, on both backends (the CLI's `--backend`), as root and as
the unprivileged user. tools/run-bwrap-suite.sh runs the upstream suite
itself when a copy is at hand. Where real bwrap is installed, some cases
also check that it does the same, so a case states bwrap's behaviour and
not our guess of it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from leakcheck import descendants

pytestmark = pytest.mark.integration

TIMEOUT = 60
BWRAP = shutil.which("bwrap")
BACKENDS = ("native", "bwrap")
PYTHON_M_SANDBOX = [sys.executable, "-P", "-m", "sandbox", "run"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    import sandbox

    found = sandbox.probe()
    ok, reason = (found.native, found.native_reason) if request.param == "native" else (found.bwrap, found.bwrap_reason)
    if not ok:
        pytest.skip(f"{request.param} backend unavailable: {reason}")
    return str(request.param)


def ours(backend: str, *args: str, **kw) -> subprocess.CompletedProcess[str]:
    """`python -m sandbox run --backend BACKEND ARGS`, captured."""
    kw.setdefault("cwd", "/")
    return subprocess.run([*PYTHON_M_SANDBOX, "--backend", backend, *args], capture_output=True, text=True,
                          timeout=TIMEOUT, **kw)


def real(*args: str, **kw) -> subprocess.CompletedProcess[str]:
    """The real bwrap with ARGS, captured (the case is skipped without it)."""
    if BWRAP is None:
        pytest.skip("bwrap is not installed")
    kw.setdefault("cwd", "/")
    return subprocess.run([BWRAP, *args], capture_output=True, text=True, timeout=TIMEOUT, **kw)


@pytest.fixture
def host_tmp_file() -> Iterator[Path]:
    """A file with known content directly in the host's /tmp."""
    fd, name = tempfile.mkstemp(dir="/tmp", prefix="dropin-")
    os.write(fd, b"hello from the host\n")
    os.close(fd)
    os.chmod(name, 0o644)
    yield Path(name)
    os.unlink(name)


# ---------------------------------------------------------------- 1: no scaffolding inside

class TestNoScaffolding:
    """Whatever is bound, the sandbox never shows the directories and
    filesystems its own setup used (the new root is built on a tmpfs on a
    host directory such as /tmp; binding / must still show the host's /tmp)."""

    @pytest.mark.parametrize("bind", ["--bind", "--ro-bind", "--dev-bind"])
    def test_binding_the_root_shows_the_hosts_tmp(self, backend, host_tmp_file, bind):
        result = ours(backend, bind, "/", "/", "cat", str(host_tmp_file))
        assert (result.returncode, result.stdout) == (0, "hello from the host\n"), result.stderr

    def test_binding_tmp_elsewhere_shows_the_hosts_tmp(self, backend, host_tmp_file):
        result = ours(backend, "--bind", "/", "/", "--bind", "/tmp", "/mnt", "cat", f"/mnt/{host_tmp_file.name}")
        assert (result.returncode, result.stdout) == (0, "hello from the host\n"), result.stderr

    def test_binding_over_tmp_shows_what_was_bound(self, backend):
        with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
            Path(d, "input").write_text("bound\n")
            os.chmod(d, 0o755)
            result = ours(backend, "--bind", "/", "/", "--bind", d, "/tmp", "sh", "-c",
                          "cat /tmp/input; ls -A /tmp")
        assert (result.returncode, result.stdout) == (0, "bound\ninput\n"), result.stderr

    @pytest.mark.parametrize("name", ["oldroot", "newroot"])
    def test_no_pivot_directories(self, backend, name):
        result = ours(backend, "--bind", "/", "/", "--tmpfs", "/tmp", "test", "-e", f"/tmp/{name}")
        assert result.returncode == 1, result.stderr


# ---------------------------------------------------------------- 3: nothing outlives its caller

READY_THEN_SLEEP = ["sh", "-c", "echo ready; exec sleep 1000"]


def _pidfds(pids: set[int]) -> dict[int, int]:
    fds = {}
    for pid in pids:
        try:
            fds[pid] = os.pidfd_open(pid)
        except ProcessLookupError:
            pass
    return fds


def _still_running(pidfds: dict[int, int], timeout: float) -> list[int]:
    """The pids whose process has not exited within `timeout` seconds (each
    pidfd becomes readable when its process exits, reaped or not)."""
    import selectors

    deadline = time.monotonic() + timeout
    alive = dict(pidfds)
    with selectors.DefaultSelector() as sel:
        for pid, fd in alive.items():
            sel.register(fd, selectors.EVENT_READ, pid)
        while alive and time.monotonic() < deadline:
            for key, _ in sel.select(max(0.0, deadline - time.monotonic())):
                sel.unregister(key.fd)
                alive.pop(key.data)
    return sorted(alive)


@contextlib.contextmanager
def tree_of(argv: list[str]) -> Iterator[tuple[subprocess.Popen[str], dict[int, int]]]:
    """Start `argv` (whose command prints "ready"), wait for the line, yield it
    and pidfds of every process under it. Whatever is still alive on the way
    out is SIGKILLed, so a failing case leaves nothing behind."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
    fds: dict[int, int] = {}
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n", proc.communicate(timeout=TIMEOUT)
        fds = _pidfds({proc.pid, *descendants(proc.pid)})
        yield proc, fds
    finally:
        _kill_all(proc, fds)


def _kill_all(proc: subprocess.Popen, fds: dict[int, int]) -> None:
    """SIGKILL `proc` and the processes whose pidfds are `fds` (closed after)."""
    for fd in fds.values():
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(fd, signal.SIGKILL)
    if proc.poll() is None:
        proc.kill()
    proc.communicate()
    for fd in fds.values():
        os.close(fd)


def _via_caller(argv: list[str]) -> list[str]:
    """A caller process that runs `argv` as its child and waits for it."""
    return [sys.executable, "-c", "import subprocess, sys; subprocess.run(sys.argv[1:])", *argv]


class TestDieWithParent:
    """bwrap --die-with-parent sets PR_SET_PDEATHSIG on its own process too:
    killing whoever ran it ends everything it started. Ours likewise for the
    CLI (whatever backend it drives) and for sandbox-launch."""

    def test_killing_the_callers_process_ends_the_cli_and_the_sandbox(self, backend):
        cli = [*PYTHON_M_SANDBOX, "--backend", backend, "--die-with-parent", "--bind", "/", "/", *READY_THEN_SLEEP]
        with tree_of(_via_caller(cli)) as (caller, fds):
            assert len(fds) >= 3  # the caller, the CLI, the command (and whatever stands between)
            caller.kill()
            caller.wait()
            assert _still_running(fds, TIMEOUT) == []

    def test_sandbox_launch_dies_with_its_caller(self):
        import sandbox
        from sandbox import launcher

        if not sandbox.probe().native or not os.access(launcher.launcher_path(), os.X_OK):
            pytest.skip("sandbox-launch needs the native backend")
        spec = sandbox.Spec(mounts=(sandbox.Bind("/", "/"),), die_with_parent=True)
        argv = launcher.launcher_argv(spec, READY_THEN_SLEEP, "/")
        assert argv[0] == launcher.launcher_path()
        with tree_of(_via_caller(argv)) as (caller, fds):
            caller.kill()
            caller.wait()
            assert _still_running(fds, TIMEOUT) == []

    @pytest.mark.parametrize("extra", [[], ["--unshare-pid"]])
    def test_sigterm_to_the_cli_reaches_the_command_and_leaves_nothing(self, backend, extra):
        script = 'trap "echo caught; exit 7" TERM; echo ready; while :; do sleep 0.05; done'
        cli = [*PYTHON_M_SANDBOX, "--backend", backend, *extra, "--bind", "/", "/", "sh", "-c", script]
        with tree_of(cli) as (proc, fds):
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=TIMEOUT)
            assert (proc.returncode, out) == (7, "caught\n")
            assert _still_running(fds, TIMEOUT) == []


# ---------------------------------------------------------------- 6: no seccomp filter unless asked

class TestNoDefaultFilter:
    """bwrap installs no seccomp filter unless given one; so does the CLI
    (the Python API keeps its default policy). `--seccomp-default` asks for it."""

    NESTED = ["--unshare-user", "--bind", "/", "/", "unshare", "-U", "true"]

    def test_a_nested_user_namespace_works_as_under_bwrap(self, backend):
        expected = real(*self.NESTED).returncode
        assert expected == 0
        result = ours(backend, *self.NESTED)
        assert result.returncode == expected, result.stderr

    def test_no_filter_in_the_command(self, backend):
        result = ours(backend, "--bind", "/", "/", "grep", "^Seccomp:", "/proc/self/status")
        assert result.stdout.split() == ["Seccomp:", "0"], result.stderr

    def test_seccomp_default_asks_for_the_policy(self, backend):
        result = ours(backend, "--seccomp-default", *self.NESTED)
        assert result.returncode != 0
        result = ours(backend, "--seccomp-default", "--bind", "/", "/", "grep", "^Seccomp:", "/proc/self/status")
        assert result.stdout.split() == ["Seccomp:", "2"], result.stderr


# ---------------------------------------------------------------- 7: /proc covers as bwrap's

UNSHARE = shutil.which("unshare")


@pytest.mark.skipif(UNSHARE is None, reason="unshare (util-linux) is not installed")
class TestProcCovers:
    """`--proc` covers what bwrap 0.8.0 covers: for a caller other than root,
    nothing, so a user namespace made inside can mount a procfs of its own
    (the kernel refuses one while the visible procfs has anything mounted
    over its entries: "mount too revealing"). For root, bwrap's covers
    already make that nested mount fail (and with --cap-drop ALL its uid map
    too, for want of CAP_SETFCAP): the same outcome as bwrap's. The Python
    API, and `--proc-covers strict`, keep this package's covers."""

    OUTER = ["--ro-bind", "/", "/", "--dev", "/dev", "--unshare-pid", "--unshare-user", "--cap-drop", "ALL",
             "--proc", "/proc", "--"]
    INNER = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc", "true"]

    def test_a_user_namespace_inside_mounts_its_own_proc_as_under_bwrap(self, backend):
        result = ours(backend, *self.OUTER, *self.INNER)
        if os.getuid() != 0:
            assert (result.returncode, result.stderr) == (0, "")
        if BWRAP is not None:
            expected = real(*self.OUTER, *self.INNER)
            assert (result.returncode, result.stderr) == (expected.returncode, expected.stderr)

    def test_as_root_the_nested_proc_fails_as_under_bwrap(self, backend):
        """As root, with the capabilities it keeps (so the inner uid map is allowed), the nested
        mount meets bwrap's covers: the same failure as bwrap's."""
        if os.getuid() != 0:
            pytest.skip("root's covers")
        outer = self.outer_for_the_caller()
        result = ours(backend, *outer, *self.INNER)
        assert (result.returncode, result.stderr) == (1, "unshare: mount /proc failed: Operation not permitted\n")
        if BWRAP is not None:
            expected = real(*outer, *self.INNER)
            assert (result.returncode, result.stderr) == (expected.returncode, expected.stderr)

    def outer_for_the_caller(self) -> list[str]:
        """OUTER, but that root keeps its capabilities (its inner uid map needs CAP_SETFCAP)."""
        return self.OUTER if os.getuid() != 0 else [a for a in self.OUTER if a not in ("--cap-drop", "ALL")]

    def test_strict_covers_are_an_option(self, backend):
        result = ours(backend, "--proc-covers", "strict", *self.outer_for_the_caller(), *self.INNER)
        assert result.returncode != 0
        assert "mount /proc failed: Operation not permitted" in result.stderr
        shown = ours(backend, "--proc-covers", "strict", *self.OUTER, "grep", " /proc/sys ", "/proc/self/mountinfo")
        assert shown.returncode == 0 and " ro," in shown.stdout, shown.stderr

    def test_covers_are_bwraps(self, backend):
        """Nothing below /proc for a caller other than root; for root, bwrap's
        read-only entries (and /proc/sys, which bwrap leaves writable) and its
        root-only files hidden."""
        result = ours(backend, *self.OUTER, "cat", "/proc/self/mountinfo")
        assert result.returncode == 0, result.stderr
        below = {line.split()[4] for line in result.stdout.splitlines() if line.split()[4].startswith("/proc/")}
        if os.getuid() != 0:
            assert below == set()
        else:
            present = {"/proc/" + n for n in ("sys", "sysrq-trigger", "irq", "bus") if os.path.exists("/proc/" + n)}
            assert present <= below and "/proc/slabinfo" in below and "/proc/keys" not in below

    def test_the_python_api_keeps_its_covers(self):
        import sandbox
        from sandbox import Dev, Namespaces, Proc, RoBind, Spec

        found = sandbox.probe()
        if not found.native:
            pytest.skip(f"native backend unavailable: {found.native_reason}")
        spec = Spec(mounts=[RoBind("/"), Dev(), Proc()], namespaces=Namespaces(), network="host", seccomp=None,
                    env={"PATH": "/usr/bin:/bin"}, cap_add=("CAP_SETFCAP",) if os.getuid() == 0 else ())
        shown = sandbox.run(["grep", " /proc/sys ", "/proc/self/mountinfo"], spec, capture_output=True, text=True)
        assert shown.returncode == 0 and " ro," in shown.stdout, shown.stderr
        nested = sandbox.run(self.INNER, spec, capture_output=True, text=True)
        assert nested.returncode != 0 and "mount /proc failed" in nested.stderr


# ---------------------------------------------------------------- 4: capabilities as bwrap leaves them

CAP_CASES = [
    [],
    ["--unshare-pid"],
    ["--cap-drop", "CAP_KILL"],
    ["--cap-drop", "ALL"],
    ["--cap-drop", "ALL", "--cap-add", "CAP_NET_BIND_SERVICE"],
    ["--unshare-user"],
    ["--unshare-user", "--cap-drop", "CAP_KILL"],
    ["--unshare-user", "--uid", "1000", "--cap-drop", "CAP_KILL"],
]


@pytest.mark.parametrize("args", CAP_CASES, ids=lambda a: " ".join(a) or "no-options")
def test_capability_sets_are_bwraps(backend, args):
    """The command's capability sets are what bwrap leaves: as root without
    options nothing changes (inheritable and ambient stay empty); the kept
    caps are inheritable and ambient only when asked; in a new user namespace
    the bounding set is what is kept (without one, see the comment below)."""
    probe = [*args, "--bind", "/", "/", "grep", "^Cap", "/proc/self/status"]
    expected = real(*probe)
    assert expected.returncode == 0, expected.stderr
    result = ours(backend, *probe)
    assert result.returncode == 0, result.stderr
    if backend == "native" and os.getuid() == 0 and "--unshare-user" not in args:
        # A documented difference: without a user namespace the native backend also shrinks the
        # bounding set to what is kept (bwrap leaves it; NO_NEW_PRIVS stops any gain at exec).
        sets = dict(line.split(":\t") for line in result.stdout.splitlines())
        assert sets["CapBnd"] == sets["CapPrm"]
        result.stdout = "".join(ln + "\n" for ln in result.stdout.splitlines() if not ln.startswith("CapBnd"))
        expected.stdout = "".join(ln + "\n" for ln in expected.stdout.splitlines() if not ln.startswith("CapBnd"))
    assert result.stdout == expected.stdout


# ---------------------------------------------------------------- 2: a bind onto a symlink follows it

@pytest.mark.parametrize("kind", ["--bind", "--ro-bind", "--tmpfs"])
def test_a_mount_onto_a_symlink_lands_on_its_target(backend, kind):
    """bwrap resolves a destination inside the new root, following links:
    `--dir /d --symlink d /l --bind SRC /l` mounts on /d, /l stays a link."""
    source = ["/etc"] if kind != "--tmpfs" else []
    script = "readlink /tmp/link; test -e /tmp/dir/passwd && echo bound; grep -c ' /tmp/dir ' /proc/self/mountinfo"
    args = ["--bind", "/", "/", "--tmpfs", "/tmp", "--dir", "/tmp/dir", "--symlink", "dir", "/tmp/link",
            kind, *source, "/tmp/link", "sh", "-c", script]
    expected = real(*args)
    result = ours(backend, *args)
    assert (result.returncode, result.stdout) == (expected.returncode, expected.stdout), result.stderr
    assert result.stdout.startswith("dir\n") and result.stdout.endswith("1\n")


# ---------------------------------------------------------------- 7: bwrap's words for its errors

def _words(stderr: str, prefix: str) -> str:
    """The last line's message after `prefix` (under --backend bwrap, bwrap's
    own line comes first: it writes to the stderr the command shares)."""
    lines = stderr.splitlines()
    assert lines and lines[-1].startswith(prefix), stderr
    return lines[-1][len(prefix):]


@pytest.mark.parametrize("args", [
    ["/"],
    ["/nonexistent"],
    ["/etc/passwd"],
    ["--seccomp", "{empty}", "true"],
], ids=["a directory", "missing", "not executable", "empty seccomp program"])
def test_error_messages_are_bwraps(backend, args):
    """The message after the program's prefix is bwrap's (the exit status is
    ours: 126/127 for a command that cannot run, 125 for a failed setup)."""
    with open(os.devnull) as empty:
        argv = [a.format(empty=empty.fileno()) for a in args]
        expected = real("--bind", "/", "/", *argv, pass_fds=(empty.fileno(),))
        result = ours(backend, "--bind", "/", "/", *argv, pass_fds=(empty.fileno(),))
    assert _words(result.stderr, "sandbox: ") == _words(expected.stderr, "bwrap: ")
    assert expected.returncode == 1 and result.returncode in (125, 126, 127)


# ---------------------------------------------------------------- 5: bwrap 0.8.0's other options

def test_info_and_json_status_fds(backend, tmp_path):
    """--info-fd: the sandbox's first process and its namespaces (mnt always,
    never user); --json-status-fd: the same on one line, then the exit code."""
    info, status = tmp_path / "info.json", tmp_path / "status.json"
    script = "stat -L --format '%n %i' /proc/self/ns/*; exit 42"
    with open(info, "w") as i, open(status, "w") as s:
        fds = {"info": i.fileno(), "status": s.fileno()}
        result = ours(backend, "--unshare-all", "--bind", "/", "/", "--proc", "/proc",
                      "--info-fd", str(fds["info"]), "--json-status-fd", str(fds["status"]), "sh", "-c", script,
                      pass_fds=tuple(fds.values()))
    assert result.returncode == 42, result.stderr
    seen = dict(line.split() for line in result.stdout.splitlines())
    first = json.loads(info.read_text())
    lines = [json.loads(line) for line in status.read_text().splitlines()]
    assert lines == [first, {"exit-code": 42}]
    assert first["child-pid"] > 0 and "user-namespace" not in first
    for ns in ("ipc", "mnt", "net", "pid", "uts"):
        assert first[f"{ns}-namespace"] == int(seen[f"/proc/self/ns/{ns}"])


def test_json_status_has_no_exit_code_when_exec_fails(backend, tmp_path):
    status = tmp_path / "status.json"
    with open(status, "w") as s:
        result = ours(backend, "--bind", "/", "/", "--json-status-fd", str(s.fileno()), "/", pass_fds=(s.fileno(),))
    assert result.returncode == 126
    records = [json.loads(line) for line in status.read_text().splitlines()]
    assert [list(r)[0] for r in records] == ["child-pid"]  # the sandbox existed; the command never ran


def test_lock_file_is_held_while_the_sandbox_runs(backend, tmp_path):
    import fcntl
    import struct

    lock = tmp_path / "lock"
    lock.touch()
    write_lock = struct.pack("hhqqhh", fcntl.F_WRLCK, 0, 0, 0, 0, 0)
    cli = [*PYTHON_M_SANDBOX, "--backend", backend, "--bind", "/", "/", "--lock-file", str(lock), *READY_THEN_SLEEP]
    with tree_of(cli) as (proc, _), open(lock, "a") as f:
        deadline = time.monotonic() + TIMEOUT  # the command may print before the lock is taken
        while time.monotonic() < deadline:
            try:
                fcntl.fcntl(f.fileno(), fcntl.F_SETLK, write_lock)
            except BlockingIOError:
                break
            fcntl.fcntl(f.fileno(), fcntl.F_SETLK, struct.pack("hhqqhh", fcntl.F_UNLCK, 0, 0, 0, 0, 0))
            time.sleep(0.05)
        else:
            pytest.fail("the lock was never taken")
        proc.kill()
        proc.wait()
        fcntl.fcntl(f.fileno(), fcntl.F_SETLKW, write_lock)  # released with the sandbox's end


def test_sync_fd_is_held_and_not_passed_to_the_command(backend):
    r, w = os.pipe()
    try:
        result = ours(backend, "--bind", "/", "/", "--sync-fd", str(w), "sh", "-c", f"test -e /proc/self/fd/{w}",
                      pass_fds=(w,))
        assert result.returncode == 1, result.stderr
    finally:
        os.close(r)
        os.close(w)


def test_assert_userns_disabled(backend):
    assert ours(backend, "--unshare-user", "--disable-userns", "--assert-userns-disabled", "--bind", "/", "/",
                "true").returncode == 0
    if real("--bind", "/", "/", "unshare", "-U", "true").returncode == 0:  # this host lets us make one
        result = ours(backend, "--assert-userns-disabled", "--bind", "/", "/", "true")
        assert result.stderr == "sandbox: creation of new user namespaces was not disabled as requested\n"


@pytest.mark.parametrize("option", ["--exec-label", "--file-label"])
def test_labels_fail_as_bwraps_without_selinux(backend, option):
    if os.path.exists("/sys/fs/selinux/enforce"):
        pytest.skip("SELinux is enabled here")
    expected = real(option, "x", "--bind", "/", "/", "true")
    result = ours(backend, option, "x", "--bind", "/", "/", "true")
    assert _words(result.stderr, "sandbox: ") == _words(expected.stderr, "bwrap: ")


def test_add_seccomp_fd_stacks_programs_as_the_kernel_does(backend):
    """Programs given with --add-seccomp-fd apply in order (the newest runs
    first and wins a tie): the same errors as under bwrap, which installs
    them one by one."""
    import errno

    from sandbox.seccomp import Seccomp, compile_policy

    programs = [compile_policy(Seccomp(deny=("chmod", "fchmodat"), errno=errno.EPERM)),
                compile_policy(Seccomp(deny=("chmod", "fchmodat", "mkdir", "mkdirat"), errno=errno.EACCES))]
    # only in a tmpfs of the sandbox's own, under a read-only host: nothing here may touch the host
    script = "touch /tmp/f; chmod 600 /tmp/f; mkdir /tmp/d; true"

    def run(runner) -> subprocess.CompletedProcess[str]:
        fds = []
        for program in programs:
            r, w = os.pipe()
            os.write(w, program)
            os.close(w)
            fds.append(r)
        try:
            opts = [arg for fd in fds for arg in ("--add-seccomp-fd", str(fd))]
            return runner(*opts, "--ro-bind", "/", "/", "--tmpfs", "/tmp", "sh", "-c", script, pass_fds=tuple(fds))
        finally:
            for fd in fds:
                os.close(fd)

    expected = run(real)
    result = run(lambda *a, **kw: ours(backend, *a, **kw))
    assert expected.stderr.count("Permission denied") == 2
    assert (result.returncode, result.stderr.replace("sandbox", "bwrap")) == (expected.returncode, expected.stderr)


@pytest.mark.parametrize("kind", ["user", "pid"])
def test_joining_another_sandboxs_namespaces(backend, kind):
    """--userns FD (and --pidns FD): the sandbox starts in the user (and pid)
    namespace of another one, here a first sandbox of ours (its first
    process, named by its --info-fd, is inside both)."""
    first = [*PYTHON_M_SANDBOX, "--backend", "native", "--bind", "/", "/", "--unshare-user", "--unshare-pid",
             "--info-fd", "1", "sh", "-c", "exec sleep 1000 >&2"]
    with tree_of_info(first) as sandbox_pid:
        with open(f"/proc/{sandbox_pid}/ns/user") as userns, open(f"/proc/{sandbox_pid}/ns/pid") as pidns:
            opts = ["--userns", str(userns.fileno())]
            if kind == "pid":
                opts += ["--pidns", str(pidns.fileno())]
            result = ours(backend, *opts, "--bind", "/", "/", "readlink", f"/proc/self/ns/{kind}",
                          pass_fds=(userns.fileno(), pidns.fileno()))
            wanted = os.readlink(f"/proc/{sandbox_pid}/ns/{kind}")
    assert (result.returncode, result.stdout) == (0, wanted + "\n"), result.stderr


@contextlib.contextmanager
def tree_of_info(argv: list[str]) -> Iterator[int]:
    """Start `argv` (which gives `--info-fd 1`), yield the child-pid its info
    names; on the way out it and everything under it are SIGKILLed."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
    fds: dict[int, int] = {}
    try:
        assert proc.stdout is not None
        text = proc.stdout.read()  # the CLI closes its fd 1 once the info is written
        fds = _pidfds({proc.pid, *descendants(proc.pid)})
        yield json.loads(text)["child-pid"]
    finally:
        _kill_all(proc, fds)
