"""The drop-in's remaining bwrap 0.8.0 options, in our words: --mqueue, the
synchronization fds (--block-fd, --userns-block-fd, --userns2), bwrap 0.10's
--bind-fd, --userns/--pidns under both backends, and the CLI speaking as
bwrap when it is invoked under that name. Each case runs on both backends
(the CLI's --backend), as root and unprivileged, and where real bwrap is
installed (and has the option) it does the same, so the case states bwrap's
behaviour and not our guess of it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_bwrap_dropin import BWRAP, PYTHON_M_SANDBOX, TIMEOUT, backend, ours, real  # noqa: F401 (a fixture)

pytestmark = pytest.mark.integration

ROOT = os.getuid() == 0


def runner(who: str):
    """ours("native"/"bwrap", ...) or the real bwrap ("real": skipped without it)."""
    if who == "real":
        return real
    return lambda *args, **kw: ours(who, *args, **kw)


@pytest.fixture(params=["ours", "real"])
def who(request: pytest.FixtureRequest, backend: str) -> str:  # noqa: F811 (the fixture imported above)
    """Our CLI on `backend`, then real bwrap (once: with the native backend's parameter only)."""
    if request.param == "real":
        if backend != "native":
            pytest.skip("real bwrap runs once")
        if BWRAP is None:
            pytest.skip("bwrap is not installed")
        return "real"
    return backend


def popen(who: str, *args: str, pass_fds: tuple[int, ...]) -> subprocess.Popen[str]:
    head = [BWRAP] if who == "real" else [*PYTHON_M_SANDBOX, "--backend", who]
    return subprocess.Popen([*head, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/",
                            pass_fds=pass_fds)


def read_to_eof(fd: int) -> bytes:
    data = b""
    while chunk := os.read(fd, 4096):
        data += chunk
    return data


@contextlib.contextmanager
def reaped(proc: subprocess.Popen[str]) -> Iterator[None]:
    """Kill and reap `proc` if the block ends (a failed assertion) while it runs."""
    try:
        yield
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@contextlib.contextmanager
def pipe() -> Iterator[tuple[int, int]]:
    """A pipe; on the way out, whichever of its ends are still open are closed.
    The body may close one itself, and a thread of this process (the netns
    pool's refill) may since have been given that fd number: closing it again
    closed the pool's namespace fd or sandbox-init's, and later tests of the
    process failed (join netns: EBADF; exec init: EACCES)."""
    r, w = os.pipe()
    made = {fd: _identity(fd) for fd in (r, w)}
    try:
        yield r, w
    finally:
        for fd, identity in made.items():
            if _identity(fd) == identity:
                os.close(fd)


def _identity(fd: int) -> tuple[int, int] | None:
    """What `fd` is open on (device, inode), None if it is not open."""
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


# ---------------------------------------------------------------- --mqueue

def test_mqueue_mounts_the_ipc_namespaces_queues(who):
    """A fresh mqueue filesystem: a queue made there (creating a file makes
    one) is the sandbox's own, and reads back as a queue's attributes."""
    result = runner(who)("--unshare-ipc", "--bind", "/", "/", "--tmpfs", "/tmp", "--mqueue", "/tmp/mq",
                         "sh", "-c", "stat -f -c %T /tmp/mq; : > /tmp/mq/q && cat /tmp/mq/q")
    assert result.returncode == 0, result.stderr
    fstype, attrs = result.stdout.splitlines()[:2]
    assert fstype == "mqueue" and attrs.startswith("QSIZE:0"), result.stdout
    assert not os.path.exists("/dev/mqueue/q")


@pytest.mark.skipif(ROOT, reason="root may mount the host's queues without a user namespace")
def test_mqueue_needs_its_own_ipc_namespace_in_a_user_namespace(who):
    result = runner(who)("--bind", "/", "/", "--tmpfs", "/tmp", "--mqueue", "/tmp/mq", "true")
    assert result.returncode != 0
    assert "Can't mount mqueue on " in result.stderr and "Operation not permitted" in result.stderr


def test_each_warm_sandbox_has_its_own_queues():
    """A Template mounts an Mqueue afresh in each sandbox (each its own IPC
    namespace): a queue one makes is not there for the next."""
    from conftest import SYSTEM_MOUNTS

    import sandbox
    from sandbox import Mqueue, Spec, Tmpfs

    ok, why = sandbox.backends.availability("template")
    if not ok:
        pytest.skip(f"no Template here: {why}")
    spec = Spec(mounts=(*SYSTEM_MOUNTS, Tmpfs("/tmp"), Mqueue("/tmp/mq")), env={"PATH": "/usr/bin:/bin"})
    with sandbox.Template(spec) as template:
        seen = [template.run(["sh", "-c", f"ls /tmp/mq; : > /tmp/mq/q{i}; stat -f -c %T /tmp/mq"],
                             capture_output=True, text=True, timeout=TIMEOUT) for i in range(2)]
    assert [(r.returncode, r.stdout) for r in seen] == [(0, "mqueue\n")] * 2, [r.stderr for r in seen]


def test_mqueue_round_trips_in_a_spec():
    from sandbox import Mqueue, Spec

    spec = Spec(mounts=(Mqueue("/dev/mqueue"),))
    assert Spec.from_json(spec.to_json()) == spec


# ---------------------------------------------------------------- --block-fd

def test_block_fd_holds_the_command_until_the_caller_writes(who):
    """--info-fd is written (and closed by every holder, so it reads to EOF)
    while the sandbox waits on --block-fd; the command runs once a byte comes."""
    with pipe() as (info_r, info_w), pipe() as (block_r, block_w):
        proc = popen(who, "--bind", "/", "/", "--info-fd", str(info_w), "--block-fd", str(block_r),
                     "sh", "-c", f"echo ran; readlink /proc/self/fd/{block_r} || echo closed",
                     pass_fds=(info_w, block_r))
        os.close(info_w)
        os.close(block_r)
        with reaped(proc):
            info = json.loads(read_to_eof(info_r))
            assert info["child-pid"] > 0
            time.sleep(0.3)
            assert proc.poll() is None  # still blocked
            os.write(block_w, b"x")
            out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, err
    assert out == "ran\nclosed\n"  # the fd is not the command's


def test_block_fd_at_eof_goes_on(who):
    with pipe() as (block_r, block_w):
        os.close(block_w)
        result = runner(who)("--bind", "/", "/", "--block-fd", str(block_r), "echo", "ran", pass_fds=(block_r,))
    assert (result.returncode, result.stdout) == (0, "ran\n"), result.stderr


# ---------------------------------------------------------------- --userns-block-fd

def test_userns_block_fd_lets_the_caller_write_the_id_maps(who):
    """The sandbox's user namespace exists, unmapped, when --info-fd names its
    first process; the caller maps uid 4242 there itself, then unblocks it."""
    with pipe() as (info_r, info_w), pipe() as (block_r, block_w):
        proc = popen(who, "--unshare-user", "--bind", "/", "/", "--info-fd", str(info_w),
                     "--userns-block-fd", str(block_r), "sh", "-c", "id -u; id -g", pass_fds=(info_w, block_r))
        os.close(info_w)
        os.close(block_r)
        with reaped(proc):
            pid = json.loads(read_to_eof(info_r))["child-pid"]
            Path(f"/proc/{pid}/setgroups").write_text("deny")
            Path(f"/proc/{pid}/uid_map").write_text(f"4242 {os.getuid()} 1\n")
            Path(f"/proc/{pid}/gid_map").write_text(f"4343 {os.getgid()} 1\n")
            os.write(block_w, b"x")
            out, err = proc.communicate(timeout=TIMEOUT)
    assert (proc.returncode, out) == (0, "4242\n4343\n"), err


@pytest.mark.parametrize(("args", "message"), [
    (["--userns-block-fd", "5", "--info-fd", "1"], "--userns-block-fd requires --unshare-user"),
    (["--unshare-user", "--userns-block-fd", "5"], "--userns-block-fd requires --info-fd"),
    (["--unshare-user", "--disable-userns", "--userns-block-fd", "5", "--info-fd", "1"],
     "--disable-userns is not compatible with  --userns-block-fd"),
])
def test_userns_block_fd_checks_are_bwraps(who, args, message):
    result = runner(who)(*args, "--bind", "/", "/", "true")
    assert result.returncode != 0 and message in result.stderr


# ---------------------------------------------------------------- --userns2, --userns, --pidns

@contextlib.contextmanager
def nested_user_namespaces() -> Iterator[tuple[int, int]]:
    """An outer user namespace (made by `unshare -Ur`: the caller's ids are
    mapped there, as making a nested one needs) and one nested in it, each
    held by a process; yields their pids, which are killed after."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("unshare(1) is not installed")
    inner = f"{unshare} -U sh -c 'echo $$; exec sleep 1000'"
    proc = subprocess.Popen([unshare, "-Ur", "sh", "-c", f"echo $$; {inner}"], stdout=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        assert proc.stdout is not None
        pids = [int(proc.stdout.readline()) for _ in range(2)]
        yield pids[0], pids[1]
    finally:
        for pid in pids[1:]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        proc.kill()
        proc.communicate()


def test_userns2_switches_after_setup(who):
    """--userns A --userns2 B (B nested in A): set up in A, run in B."""
    with nested_user_namespaces() as (outer, nested):
        with open(f"/proc/{outer}/ns/user") as a, open(f"/proc/{nested}/ns/user") as b:
            result = runner(who)("--userns", str(a.fileno()), "--userns2", str(b.fileno()), "--bind", "/", "/",
                                 "readlink", "/proc/self/ns/user", pass_fds=(a.fileno(), b.fileno()))
        wanted = os.readlink(f"/proc/{nested}/ns/user")
    assert (result.returncode, result.stdout) == (0, wanted + "\n"), result.stderr


def test_userns2_that_cannot_be_joined_fails_as_bwraps(who):
    """Without privilege over it (a sibling of the sandbox's own user
    namespace, even for root), bwrap's message."""
    with nested_user_namespaces() as (outer, _):
        with open(f"/proc/{outer}/ns/user") as a:
            result = runner(who)("--unshare-user", "--bind", "/", "/", "--userns2", str(a.fileno()), "true",
                                 pass_fds=(a.fileno(),))
    assert result.returncode != 0
    assert "Setting userns2 failed: Operation not permitted" in result.stderr


def test_userns_with_a_new_pid_namespace(backend):  # noqa: F811
    """--userns with --unshare-pid: the sandbox's namespaces are made in the one given."""
    with nested_user_namespaces() as (outer, _):
        with open(f"/proc/{outer}/ns/user") as a:
            result = ours(backend, "--userns", str(a.fileno()), "--unshare-pid", "--bind", "/", "/",
                          "readlink", "/proc/self/ns/user", pass_fds=(a.fileno(),))
        wanted = os.readlink(f"/proc/{outer}/ns/user")
    assert (result.returncode, result.stdout) == (0, wanted + "\n"), result.stderr


# ---------------------------------------------------------------- --bind-fd (bubblewrap 0.10)

@pytest.mark.parametrize("option", ["--bind-fd", "--ro-bind-fd"])
def test_bind_fd_binds_what_the_fd_names(backend, tmp_path, option):  # noqa: F811
    """An O_PATH fd of a directory in the host's /tmp (below the directory
    the native root is built on): bound at DEST, read-only with
    --ro-bind-fd, and not passed to the command."""
    (tmp_path / "f").write_text("from the fd\n")
    tmp_path.chmod(0o755)
    fd = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
    try:
        script = f"cat /mnt/f; readlink /proc/self/fd/{fd} || echo closed; if touch /mnt/new; then echo writable; fi"
        result = ours(backend, "--bind", "/", "/", option, str(fd), "/mnt", "sh", "-c", script, pass_fds=(fd,))
    finally:
        os.close(fd)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:2] == ["from the fd", "closed"]
    assert ("writable" in lines) == (option == "--bind-fd")


def test_bind_fd_refuses_a_bad_fd(backend):  # noqa: F811
    result = ours(backend, "--bind-fd", "x", "/mnt", "true")
    assert result.returncode == 125 and result.stderr == "sandbox: Invalid fd: x\n"


# ---------------------------------------------------------------- status records and errors

def test_a_failed_exec_reports_the_start_but_no_exit_code(who, tmp_path):
    """bwrap writes --json-status-fd's child-pid once its sandbox exists; a
    command that cannot be executed then adds no exit-code."""
    status = tmp_path / "status.json"
    with open(status, "w") as s:
        result = runner(who)("--bind", "/", "/", "--json-status-fd", str(s.fileno()), "/nonexistent",
                             pass_fds=(s.fileno(),))
    assert result.returncode != 0
    records = [json.loads(line) for line in status.read_text().splitlines()]
    assert [list(r)[0] for r in records] == ["child-pid"]


def test_a_failed_setup_reports_no_exit_code(who, tmp_path):
    """What upstream's strace point checks (a failure before the exec, there
    made by failing bwrap's 39th prctl): no exit-code in --json-status-fd."""
    status = tmp_path / "status.json"
    with open(status, "w") as s:
        result = runner(who)("--bind", "/", "/", "--bind", str(tmp_path / "missing"), "/mnt",
                             "--json-status-fd", str(s.fileno()), "true", pass_fds=(s.fileno(),))
    assert result.returncode != 0
    records = [json.loads(line) for line in status.read_text().splitlines()]
    assert all("exit-code" not in r for r in records), records


@pytest.fixture
def as_bwrap(tmp_path) -> str:
    """A program named bwrap that is our CLI (as a drop-in is installed)."""
    path = tmp_path / "bwrap"
    path.write_text(f"#!{sys.executable} -P\nimport sys\nfrom sandbox.cli import main\nsys.exit(main())\n")
    path.chmod(0o755)
    tmp_path.chmod(0o755)
    return str(path)


def test_invoked_as_bwrap_it_speaks_as_bwrap(as_bwrap):
    """Named bwrap: `bwrap: ` messages, its own failures exit 1 (the
    command's own status is unchanged), and the help names it."""
    failed = subprocess.run([as_bwrap, "--bind", "/nonexistent", "/x", "true"], capture_output=True, text=True,
                            timeout=TIMEOUT)
    assert failed.returncode == 1
    assert failed.stderr == "bwrap: Can't find source path /nonexistent: No such file or directory\n"
    own = subprocess.run([as_bwrap, "--bind", "/", "/", "sh", "-c", "exit 125"], timeout=TIMEOUT)
    assert own.returncode == 125
    helped = subprocess.run([as_bwrap, "--help"], capture_output=True, text=True, timeout=TIMEOUT)
    assert helped.returncode == 0 and helped.stdout.startswith(f"usage: {as_bwrap} [OPTIONS...]")
    if BWRAP is not None:
        expected = real("--bind", "/nonexistent", "/x", "true")
        assert (expected.returncode, expected.stderr) == (failed.returncode, failed.stderr)


def test_the_bwrap_backend_refuses_a_bind_fd_that_shows_another_file():
    """bwrap 0.8.0 is given the path an fd names; after its setup the
    destination must be that fd's file (a path swapped meanwhile binds
    another). Checked here against a process whose /mnt is not the fd's."""
    from sandbox.backends.bwrap import dests
    from sandbox.errors import SetupError

    fd = os.open("/usr", os.O_PATH | os.O_DIRECTORY)
    try:
        spec = ro_bind_spec(f"/proc/self/fd/{fd}", "/etc")
        plan = plan_for(spec)
        with pytest.raises(SetupError, match="another file than the fd's was bound"):
            dests.verify_fd_sources(plan, os.getpid())
        dests.verify_fd_sources(plan_for(ro_bind_spec(f"/proc/self/fd/{fd}", "/usr")), os.getpid())  # the same: fine
    finally:
        os.close(fd)


def ro_bind_spec(src: str, dest: str):  # -> Spec
    from sandbox import RoBind, Spec

    return Spec(mounts=(RoBind(src, dest),))


def plan_for(spec):  # -> Plan, for the bwrap backend
    from sandbox.backends.bwrap import TRAITS
    from sandbox.host import HostInfo
    from sandbox.plan import compile_plan

    return compile_plan(spec, HostInfo.current(TRAITS))


@pytest.mark.parametrize("unshare", ["--unshare-user", "--unshare-user-try", "--unshare-all"])
def test_userns_with_a_new_user_namespace_is_refused_as_bwraps(who, unshare):
    result = runner(who)("--userns", "0", unshare, "--bind", "/", "/", "true")
    assert result.returncode != 0
    assert f"--userns not compatible {unshare.replace('-all', '-user-try')}" in result.stderr
