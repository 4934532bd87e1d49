"""sandbox.Template on the real kernel: results, per-call options, privacy
between sandboxes, kill, timeouts, and the end of everything with the caller."""

from __future__ import annotations

import errno as E
import fcntl
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import make_base_spec, pids_with_marker, sleep_cmd, sleepers, wait_until  # tests/, on sys.path (rootdir)

import sandbox
from sandbox import Bind, File, Limits, Namespaces, RoBind, Tmpfs, netpool

pytestmark = pytest.mark.integration


@pytest.fixture
def template(require_native: None) -> Iterator[sandbox.Template]:
    with sandbox.Template(make_base_spec(File("/etc/conf", b"x=1\n", perms=0o644))) as t:
        yield t


def sh(t: sandbox.Template, script: str, **kw: object) -> sandbox.CompletedProcess:
    return t.run(["sh", "-c", script], capture_output=True, text=True, timeout=60, **kw)  # type: ignore[arg-type]


def test_run_reports_like_spawn(template: sandbox.Template) -> None:
    done = sh(template, "echo out; echo err >&2; exit 3")
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
    assert done.backend == "template" and done.network in ("none", "pool")  # "pool" once the shared pool is filled
    assert {"start", "child", "ready", "exec"} <= set(done.timings)
    assert sh(template, "kill -TERM $$").returncode == -signal.SIGTERM


def test_each_sandbox_has_its_own_namespaces(template: sandbox.Template) -> None:
    script = "readlink /proc/self/ns/mnt /proc/self/ns/pid /proc/self/ns/ipc /proc/self/ns/user /proc/self/ns/net"
    # the first stays alive while the second runs: a namespace's number is freed with it, and reused
    first = template.spawn(["sh", "-c", script + "; read x"], stdin=sandbox.PIPE, stdout=sandbox.PIPE)
    try:
        assert first.stdout is not None
        a = [first.stdout.readline().decode().strip() for _ in range(5)]
        b = sh(template, script).stdout.split()
    finally:
        first.communicate(b"", timeout=60)
    assert len(b) == 5 and all(x != y for x, y in zip(a[:4], b[:4], strict=True)), (a, b)
    if first.network != "pool":  # a leased one is checked clean and leased again: the next may get it
        assert a[4] != b[4]
    assert a[4] != os.readlink("/proc/self/ns/net")


def test_nothing_written_is_shared(template: sandbox.Template) -> None:
    first = sh(template, "echo a > /tmp/f && echo a > /dev/shm/f && echo a > /etc/conf && cat /etc/conf")
    assert first.returncode == 0 and first.stdout == "a\n", first.stderr
    second = sh(template, "ls -A /tmp /dev/shm; cat /etc/conf")
    assert second.stdout == "/dev/shm:\n\n/tmp:\nx=1\n", second.stdout
    for path in ("/x", "/dev/x", "/etc/x"):  # the template's root and /dev are shared: read-only
        assert "Read-only file system" in sh(template, f"touch {path}").stderr


def test_per_call_env_cwd_limits(template: sandbox.Template) -> None:
    done = sh(template, "echo $A && ulimit -n && pwd", env={"A": "1", "PATH": "/usr/bin"}, cwd="/usr",
              limits=Limits(nofile=50))
    assert done.stdout == "1\n50\n/usr\n", done.stderr


def test_per_call_binds(template: sandbox.Template, tmp_path: Path) -> None:
    # as root and unprivileged: the template clones them from the copy of the host tree it keeps
    work = tmp_path / "work"
    work.mkdir()
    (work / "in").write_text("task\n")
    os.chmod(tmp_path, 0o755)
    os.chmod(work, 0o777)
    done = sh(template, "cat in && echo out > out && echo $A && ulimit -n && pwd", env={"A": "1", "PATH": "/usr/bin"},
              cwd="/tmp/work", limits=Limits(nofile=50), binds=[Bind(str(work), "/tmp/work")])
    assert done.stdout == "task\n1\n50\n/tmp/work\n", done.stderr
    assert (work / "out").read_text() == "out\n"
    ro = sh(template, "echo x > /tmp/w/y", binds=[RoBind(str(work), "/tmp/w")])
    assert "Read-only file system" in ro.stderr
    assert not sh(template, "ls /tmp").stdout  # the bind was that sandbox's alone


def test_a_per_call_bind_reaches_only_its_tree(template: sandbox.Template, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "secret").write_text("host\n")
    (work / "abs").symlink_to(tmp_path / "secret")
    (work / "rel").symlink_to("../secret")
    os.chmod(tmp_path, 0o755)
    script = ("ls -A /tmp/work/..; cat /tmp/work/abs /tmp/work/rel; "
              "umount /tmp/work; umount -l /tmp/work; ls -A /tmp/work | wc -l")
    done = sh(template, script, binds=[RoBind(str(work), "/tmp/work")])
    out = done.stdout.split()
    assert out[0] == "work", done.stdout  # '..' is the sandbox's /tmp, not the host directory
    assert "host" not in done.stdout and done.stderr.count("cat: ") == 2, done.stderr  # links resolve inside
    assert out[-1] == "2"  # the bind cannot be unmounted to reveal anything


def test_per_call_bind_sources(template: sandbox.Template, tmp_path: Path) -> None:
    missing = str(tmp_path / "missing")
    with pytest.raises(sandbox.SetupError) as info:
        template.run(["true"], binds=[Bind(missing, "/tmp/work")])
    assert (info.value.step, info.value.errno, info.value.path) == ("source", E.ENOENT, missing)
    assert missing in str(info.value)
    target = tmp_path / "target"
    target.mkdir()
    (target / "f").write_text("via link\n")
    (tmp_path / "link").symlink_to(target)
    os.chmod(tmp_path, 0o755)
    done = sh(template, "cat /tmp/work/f", binds=[RoBind(str(tmp_path / "link"), "/tmp/work")])
    assert done.stdout == "via link\n", done.stderr  # a symlinked source binds its target, as spawn's binds


def test_standby_sandboxes_take_the_requests(template: sandbox.Template) -> None:
    assert template._server.standby, template._server.standby_reason
    done = sh(template, "echo $$; cat /proc/self/uid_map")
    assert done.stdout.split()[0] == "2"  # pid 1 is the standby that took the request, the command its child
    assert "clone" in done.timings and "mounts" not in done.timings  # its world was built before the request


def test_a_sandbox_killed_at_once_leaves_the_standbys(template: sandbox.Template) -> None:
    # A standby tells the template that its command runs only after it has told the caller, so a caller that
    # kills at once often gets there first. The standby marked itself taken when the request came (memory it
    # shares with the template): its death must not be taken for a standby that crashed, which would turn the
    # standbys off and leave every later request to the template's own, slower path.
    assert template._server.standby, template._server.standby_reason
    for _ in range(50):
        proc = template.spawn(["sleep", "60"])
        proc.kill()
        assert proc.wait(60) == -signal.SIGKILL
    done = sh(template, "echo $$")
    assert "mounts" not in done.timings, done.timings  # a standby took it: its world was built ahead


def test_a_command_that_keeps_a_capability(require_native: None) -> None:
    # checked against the namespace's owner: the sandbox makes its namespaces with its own user namespace
    spec = make_base_spec(cap_add=("CAP_NET_BIND_SERVICE",))
    argv = ["python3", "-c", "import socket; socket.socket().bind(('127.0.0.1', 80)); print('bound')"]
    with sandbox.Template(spec) as t:
        assert not t._server.standby
        done = t.run(argv, capture_output=True, text=True, timeout=60)
    # as sandbox.spawn: bound as root; unprivileged, the command's ids live in a nested user namespace
    # (devpts needs uid 0 during setup), whose capabilities do not reach the sandbox's network namespace
    native = sandbox.run(argv, spec, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (native.returncode, native.stdout), done.stderr
    assert done.stdout == ("bound\n" if os.geteuid() == 0 else "")


@pytest.mark.parametrize(("policy", "pid_1"), [(None, "2"), (sandbox.Seccomp(deny=("pidfd_open",)), "0")],
                         ids=["default-early", "denies-pidfd_open"])
def test_the_command_has_the_filter_wherever_it_is_installed(require_native: None, policy: object,
                                                             pid_1: str) -> None:
    """pid 1 takes the filter before the request when it allows what pid 1
    still does (seccomp.resident), else the command alone installs it."""
    fields = {} if policy is None else {"seccomp": policy}
    with sandbox.Template(make_base_spec(**fields)) as t:
        done = sh(t, "grep ^Seccomp: /proc/self/status /proc/1/status | tr -d ' \\t'")
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["/proc/self/status:Seccomp:2", f"/proc/1/status:Seccomp:{pid_1}"]
        assert sh(t, "exit 7").returncode == 7  # pid 1 still reaps and reports


def test_pass_fds_keep_their_numbers(template: sandbox.Template) -> None:
    r, w = os.pipe()
    try:
        # a free number well above the pool's background fds (dup2 onto one in use would close it)
        fd = fcntl.fcntl(w, fcntl.F_DUPFD, 500)
        done = sh(template, f"echo via > /proc/self/fd/{fd}; ls /proc/self/fd", pass_fds=[fd])
        os.close(fd)
        os.close(w)
        assert os.read(r, 100) == b"via\n"
        assert done.stdout.split() == ["0", "1", "2", "3", str(fd)]  # 3: ls's own directory fd
    finally:
        os.close(r)


def test_errors(template: sandbox.Template) -> None:
    with pytest.raises(sandbox.ExecNotFoundError):
        template.run(["no-such-command-anywhere"])
    with pytest.raises(sandbox.SetupError) as info:
        template.run(["true"], cwd="/nonexistent")
    assert (info.value.step, info.value.errno) == ("cwd", E.ENOENT)
    with pytest.raises(sandbox.UnavailableError, match="pid namespace"):
        sandbox.Template(make_base_spec(namespaces=Namespaces(pid=False)))
    with pytest.raises(sandbox.SetupError) as info:
        sandbox.Template(make_base_spec(RoBind("/nonexistent-template-source", "/x")))
    assert info.value.step == "source"


def test_kill_takes_the_whole_sandbox_down(template: sandbox.Template, no_leftovers: str) -> None:
    proc = template.spawn(["sh", "-c", f"{sleep_cmd(no_leftovers)} & {sleep_cmd(no_leftovers)}"])
    assert wait_until(lambda: len(sleepers(no_leftovers)) == 2)
    proc.kill()
    assert proc.wait(10) == -signal.SIGKILL
    assert wait_until(lambda: not pids_with_marker(no_leftovers))


def test_the_wait_ends_with_every_process_gone(template: sandbox.Template, no_leftovers: str) -> None:
    done = sh(template, f"{sleep_cmd(no_leftovers)} & {sleep_cmd(no_leftovers)} & exit 3")
    assert done.returncode == 3
    assert not pids_with_marker(no_leftovers)  # at once: the status comes once they are gone


def test_timeout_kills(template: sandbox.Template, no_leftovers: str) -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        template.run(["sh", "-c", sleep_cmd(no_leftovers)], timeout=0.5)
    assert wait_until(lambda: not pids_with_marker(no_leftovers))


def test_as_pid_1_status(require_native: None) -> None:
    with sandbox.Template(make_base_spec(as_pid_1=True)) as t:
        assert sh(t, "exit 9").returncode == 9
        assert sh(t, "echo $$").stdout == "1\n"


def test_close_ends_every_sandbox(require_native: None, no_leftovers: str) -> None:
    t = sandbox.Template(make_base_spec())
    procs = [t.spawn(["sh", "-c", sleep_cmd(no_leftovers)]) for _ in range(3)]
    assert wait_until(lambda: len(sleepers(no_leftovers)) == 3)
    t.close()
    assert [p.wait(10) for p in procs] == [-signal.SIGKILL] * 3
    assert wait_until(lambda: not pids_with_marker(no_leftovers))


def test_pooled_network(require_native: None) -> None:
    with sandbox.Template(make_base_spec(network="pool")) as t:
        done = sh(t, "cat /proc/net/dev | tail -n +3 | cut -d: -f1")
        assert done.network == "pool" and done.stdout.split() == ["lo"], done.stderr


def test_pooled_sandboxes_alive_together_never_share_a_namespace(require_native: None) -> None:
    """Each standby waits in a lease of its own; the lease a request brings goes to the next standby."""
    with sandbox.Template(make_base_spec(network="pool")) as t:
        procs = [t.spawn(["sh", "-c", "readlink /proc/self/ns/net; read x"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE) for _ in range(6)]
        try:
            seen = [p.stdout.readline().decode().strip() for p in procs]  # type: ignore[union-attr]
            assert len(set(seen)) == 6 and all(x.startswith("net:[") for x in seen), seen
        finally:
            for p in procs:
                p.kill()
                p.wait()
                p.stdin.close()  # type: ignore[union-attr]
                p.stdout.close()  # type: ignore[union-attr]


def _netns_fds(pid: int) -> set[str]:
    """The network namespaces process `pid` holds an fd of."""
    out = set()
    for n in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{n}")
        except FileNotFoundError:
            continue
        if target.startswith("net:["):
            out.add(target)
    return out


def test_a_pooled_sandbox_holds_no_fd_of_another_sandboxs_lease(require_native: None) -> None:
    """A standby's pid 1 is a fork of the template server, which holds the leases waiting for the
    standbys to come: each sandbox (standbys, and the one serving a call) drops them, keeping no
    other sandbox's network namespace."""
    with sandbox.Template(make_base_spec(network="pool")) as t:
        with t.spawn(["sh", "-c", "read x"], stdin=subprocess.PIPE) as p:
            assert wait_until(lambda: len(_children(t.pid)) == 3)  # this call's sandbox and two standbys
            try:
                for pid1 in _children(t.pid):
                    own = os.readlink(f"/proc/{pid1}/ns/net")
                    assert _netns_fds(pid1) <= {own}, (pid1, own, _netns_fds(pid1))
                assert _netns_fds(t.pid)  # the server does hold leases: the check sees such fds
            except PermissionError:
                pytest.skip("the sandboxes' pid 1 are not readable from here")
            p.kill()


def _children(pid: int) -> list[int]:
    return [int(c) for c in open(f"/proc/{pid}/task/{pid}/children").read().split()]


def test_failed_pooled_spawns_give_their_leases_back(require_native: None) -> None:
    """A request that fails (no such command, a bad cwd) returns the lease that
    came back with its report: the pool is not drained by failures. (Servers
    an earlier test kept for sandbox.spawn(backend="template") may hold
    leases of the same pool: counted before.)"""
    pool = netpool.pool_for("pool")
    held = pool.stats()
    with sandbox.Template(make_base_spec(network="pool")) as t:
        assert t._server.pool is pool
        for k in range(30):
            with pytest.raises((sandbox.ExecNotFoundError, sandbox.SetupError)):
                if k % 2:
                    t.run(["no-such-command-anywhere"])
                else:
                    t.run(["true"], cwd="/nonexistent")
        assert sh(t, "true").returncode == 0
        # leased now: the template's two standbys alone (the template's own count is exact; the pool's
        # may also fall while the test runs, as a kept server of an earlier test gives one back)
        assert wait_until(lambda: len(t._server._leases) == 2
                          and pool.stats()["in_use"] - held["in_use"] <= 2
                          and pool.stats()["reserved"] - held["reserved"] == 2), (held, pool.stats())


def test_a_pooled_template_outlived_by_its_pool(require_native: None) -> None:
    with sandbox.Template(make_base_spec(network="pool")) as t:
        assert sh(t, "true").returncode == 0
        netpool.disable()
        try:
            with pytest.raises(sandbox.SandboxError, match="pool this Template leases from was closed"):
                sh(t, "true")
        finally:
            netpool.restore_default()


CALLER = textwrap.dedent("""
    import sys, sandbox
    sys.path.insert(0, sys.argv[2])
    from conftest import make_base_spec
    t = sandbox.Template(make_base_spec())
    procs = [t.spawn(["sleep", "1000", sys.argv[1]]) for _ in range(3)]
    print(t.pid, flush=True)
    sys.stdin.read()
""")


def test_caller_death_ends_template_and_sandboxes(require_native: None, no_leftovers: str) -> None:
    root = str(Path(__file__).resolve().parents[1])
    caller = subprocess.Popen([sys.executable, "-c", CALLER, no_leftovers, root], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        template_pid = int(caller.stdout.readline())  # type: ignore[union-attr]
        assert wait_until(lambda: len(sleepers(no_leftovers)) == 3)
    finally:
        caller.kill()
        caller.wait()
        caller.stdout.close()  # type: ignore[union-attr]
        caller.stdin.close()  # type: ignore[union-attr]
    assert wait_until(lambda: not pids_with_marker(no_leftovers), timeout=10)
    assert wait_until(lambda: not os.path.exists(f"/proc/{template_pid}"), timeout=10)


def test_tmpfs_size_is_per_sandbox(require_native: None) -> None:
    with sandbox.Template(make_base_spec(Tmpfs("/scratch", size=1 << 20))) as t:
        for _ in range(2):  # each sandbox gets the whole MiB: the first one's data is not there
            done = sh(t, "head -c 900000 /dev/zero > /scratch/f && echo ok")
            assert done.stdout == "ok\n", done.stderr


def test_a_recycled_template_serves_while_every_standby_runs(require_native: None) -> None:
    """Every recycled standby runs a command: the next request is the server's (it must have been told
    that they took theirs: a recycled standby is never replaced, so nothing else would wake it)."""
    import threading

    with sandbox.Template(make_base_spec(), recycle=True) as t:
        standbys = len(_children(t.pid))
        assert standbys == 3, standbys  # csrc/template/template.h, N_RECYCLED: one ready while two callers' reset
        running = [t.spawn(["sleep", "1000"]) for _ in range(standbys)]
        third: list[sandbox.SandboxProcess] = []
        starter = threading.Thread(target=lambda: third.append(t.spawn(["sleep", "1000"])), daemon=True)
        starter.start()
        starter.join(10)
        started = not starter.is_alive()
        for proc in running + third:
            proc.kill()
            proc.wait()
    assert started, "the third request was never served"
    assert len(third) == 1


def _template_servers() -> list[int]:
    """This process's children that are template servers."""
    out = []
    for task in os.listdir("/proc/self/task"):
        for pid in open(f"/proc/self/task/{task}/children").read().split():
            try:
                if open(f"/proc/{pid}/comm").read().strip() == "sandbox-templat":  # comm keeps 15 characters
                    out.append(int(pid))
            except FileNotFoundError:
                continue
    return out


def test_spawn_on_the_template_backend_keeps_a_bounded_number_of_servers(require_native: None) -> None:
    """backend="template" keeps a server per Spec it has seen, but at most MAX_KEPT idle ones: a caller
    running many Specs does not accumulate processes and fds; a server with a sandbox running is never
    the one closed."""
    from sandbox.backends.template import BACKEND, MAX_KEPT

    BACKEND.close()
    assert wait_until(lambda: not _template_servers())
    env = dict(make_base_spec().env)
    long = sandbox.spawn(["sh", "-c", "read x; echo done"], make_base_spec(env={**env, "KEEP": "running"}),
                         backend="template", stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        fds = []
        for i in range(3 * MAX_KEPT):
            done = sandbox.run(["true"], make_base_spec(env={**env, "N": str(i)}), backend="template", timeout=60)
            assert done.returncode == 0
            assert len(_template_servers()) <= MAX_KEPT + 1  # the running one's server may be kept beyond
            fds.append(len(os.listdir("/proc/self/fd")))
        assert max(fds[2 * MAX_KEPT:]) <= max(fds[MAX_KEPT:2 * MAX_KEPT]) + 40, fds  # flat once bounded
        out, _ = long.communicate(b"\n", timeout=30)
        assert (long.returncode, out) == (0, b"done\n")  # its server was kept while it ran
    finally:
        if long.poll() is None:
            long.kill()
            long.wait()
        BACKEND.close()


CLOSED_STDIO = """
import os, sys
sys.path.insert(0, sys.argv[1])
from conftest import make_base_spec
import sandbox
with sandbox.Template(make_base_spec(network="none"), recycle=sys.argv[2] == "recycle") as t:
    os.close(0)  # the caller's stdin and stderr are closed: a sandbox that inherits them has none
    os.close(2)
    for _ in range(2):
        print(t.run(["sh", "-c", "readlink /proc/self/fd/0 /proc/self/fd/1 /proc/self/fd/2"]).returncode, flush=True)
"""


@pytest.mark.parametrize("recycle", ["recycle", "standby"])
def test_stdio_the_caller_has_closed_is_not_inherited(require_native: None, recycle: str) -> None:
    """A slot left to inherit gets the caller's fd only if it is open and not close-on-exec
    (server.py's _stdio): the sandbox gets the caller's fd 1 alone, never an fd the library opened since
    at a number the caller closed (a request's report socket, the pool's namespaces), request after
    request."""
    root = str(Path(__file__).resolve().parents[1])
    with subprocess.Popen([sys.executable, "-c", CLOSED_STDIO, root, recycle], stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as caller:
        out_pipe, err_pipe = (f"pipe:[{os.fstat(f.fileno()).st_ino}]" for f in (caller.stdout, caller.stderr))  # type: ignore[union-attr]
        out, err = caller.communicate(timeout=60)
    # a slot not sent is the server's own fd: its /dev/null, and the stderr it inherited from its creator
    assert (caller.returncode, out) == (0, f"/dev/null\n{out_pipe}\n{err_pipe}\n0\n" * 2), err
