"""Nested task sandboxes through the broker (issue 24, item 1), on both backends, root and unprivileged.

Code inside a task sandbox starts sandboxes of its own with sandbox.task
(task.run and the launcher `python -m sandbox.task`): the broker of the
sandbox above starts them beside it, narrowed from that sandbox's
description, so each level sees only what every level above allows. The
untrusted code itself still cannot make a user namespace, and the broker's
socket serves no other user and no other sandbox.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import textwrap
from pathlib import Path

import pytest
from conftest import new_marker, sleepers, wait_until
from task_helpers import PY, pyrun, task_backend  # noqa: F401  (task_backend: the fixture `backend`)

from sandbox import UnavailableError, task
from sandbox.task import Sandbox
from sandbox.task.broker import Broker
from sandbox.task.run import start_here

pytestmark = pytest.mark.integration


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    """Three directories, each with a file `f` naming it: `all` (every level
    may read it), `mid` (the outer and the first nested level), `top` (the outer only)."""
    out = {}
    for name in ("all", "mid", "top"):
        d = tmp_path / name
        d.mkdir()
        (d / "f").write_text(name + "\n")
        out[name] = d
    tmp_path.chmod(0o755)
    return out


LEVEL2 = "for d in {all} {mid} {top}; do cat $d/f 2>/dev/null || echo no-$(basename $d); done; exit 7"

LEVEL1 = """
import json, subprocess, sys
from sandbox import task
from sandbox.errors import SpecError
level2 = json.dumps({{"read": ["{all}"]}})
# the launcher as a framework would call it, inside (subprocess closes inherited fds: the broker's socket is a path)
r = subprocess.run([sys.executable, "-m", "sandbox.task", level2, "--", "sh", "-c", {script!r}],
                   capture_output=True, text=True)
print("level2:", r.returncode, r.stdout.split(), r.stderr.strip()[-300:])
for name, path in (("all", "{all}"), ("mid", "{mid}"), ("top", "{top}")):
    try:
        print("level1 sees", name, open(path + "/f").read().strip())
    except OSError:
        print("level1 sees", name, "no")
code = "from sandbox import task\\ntry:\\n    task.run(['true'], task.Sandbox(read=['{top}']))\\n" \\
       "except Exception as e:\\n    print(type(e).__name__, e.field)"
r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
print("level2 asking for top:", r.stdout.strip(), r.stderr.strip()[-300:])
"""


def test_two_levels_deep_each_sees_only_what_every_level_above_allows(backend: str, tree: dict[str, Path],
                                                                      tmp_path: Path) -> None:
    paths = {k: str(v) for k, v in tree.items()}
    level1 = LEVEL1.format(script=LEVEL2.format(**paths), **paths)
    records = tmp_path / "records"
    code = (f"from sandbox import task\nr = task.run([{PY!r}, '-c', {level1!r}], "
            f"task.Sandbox(read=[{paths['all']!r}, {paths['mid']!r}], role='tool'), capture_output=True, text=True)\n"
            "print(r.stdout, r.stderr[-2000:], 'level1 exit', r.returncode, r.record['role'])")
    outer = Sandbox(read=[paths["all"], paths["mid"], paths["top"]], records=str(records))
    r = pyrun(code, outer, backend, timeout=120)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "level2: 7 ['all', 'no-mid', 'no-top']" in out, out
    assert "level1 sees all all" in out and "level1 sees mid mid" in out and "level1 sees top no" in out, out
    assert "level2 asking for top: SpecError read" in out, out
    assert "level1 exit 0 tool" in out, out
    # every start left its record in the outer sandbox's records directory
    roles = sorted(json.loads(p.read_text())["role"] for p in records.iterdir())
    assert roles == ["task", "task", "tool"], roles


WIDEN = """
import json, os
from sandbox import task
from sandbox.task import Sandbox, Proxy
os.symlink("{top}", "{work}/link")             # a link planted in a writable grant
os.environ["MODEL_URL"] = os.environ["MWM_URL"] = "http://127.0.0.1:{closed}/v1"
asks = {{
    "read": Sandbox(read=["{top}"]),
    "write": Sandbox(write=["{all}"]),
    "binds": Sandbox(binds=[task.Bind("{work}/link", "/x")]),
    "read (link)": Sandbox(read=["{work}/link"]),
    "network": Sandbox(network="open"),
    "ports": Sandbox(ports=[{closed}]),
    "proxy.allowed_hosts": Sandbox(proxy=Proxy(["example.com"])),
    "env_allow": Sandbox(env_allow=["*"]),
    "env": Sandbox(env={{"MODEL_URL": os.environ["MODEL_URL"]}}),
    "env (allowed name)": Sandbox(env_allow=["MWM_*"]),
}}
for name, sb in asks.items():
    try:
        task.run(["true"], sb)
        print(name, "STARTED")
    except Exception as e:
        print(name, "->", type(e).__name__, getattr(e, "field", None))
"""


def test_a_widening_request_is_refused_with_the_field_named(backend: str, tree: dict[str, Path],
                                                           tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    work.chmod(0o777)
    paths = {k: str(v) for k, v in tree.items()}
    code = WIDEN.format(work=work, closed=9, **paths)
    outer = Sandbox(read=[paths["all"]], write=[str(work)], env_allow=["MWM_*"],
                    proxy=task.Proxy(["allowed.example"]))
    r = pyrun(code, outer, backend, timeout=120)
    assert r.returncode == 0, r.stderr
    got = dict(line.split(" -> ") for line in r.stdout.strip().split("\n"))
    assert got == {"read": "SpecError read", "write": "SpecError write", "binds": "SpecError binds",
                   "read (link)": "SpecError read", "network": "SpecError network", "ports": "SpecError ports",
                   "proxy.allowed_hosts": "SpecError proxy.allowed_hosts", "env_allow": "SpecError env_allow",
                   "env": "SpecError env", "env (allowed name)": "SpecError env"}, r.stdout


NESTED_SLEEP = """
import sys, time
from sandbox import task
p = task.spawn(["sh", "-c", "sleep 1000 {marker}"], task.Sandbox())
print(p.pid, flush=True)
time.sleep(1000)
"""


def test_killing_the_outer_kills_the_inner(backend: str) -> None:
    marker = new_marker()
    outer = task.spawn([PY, "-c", NESTED_SLEEP.format(marker=marker)], Sandbox(), backend=backend,
                       stdout=subprocess.PIPE)
    try:
        assert outer.stdout is not None
        assert int(outer.stdout.readline())  # the nested sandbox is up
        assert wait_until(lambda: bool(sleepers(marker)), timeout=10)
        outer.kill()
        # before anyone waits for the outer (which would close its broker): the requester's death alone ends it
        assert wait_until(lambda: not sleepers(marker), timeout=10), "the nested sandbox outlived the outer one"
        assert outer.wait(timeout=30) == -signal.SIGKILL
    finally:
        outer.kill()
        outer.wait()
        outer.stdout.close()  # type: ignore[union-attr]


def test_the_launchers_death_takes_the_nested_sandbox_down(backend: str) -> None:
    marker = new_marker()
    with subprocess.Popen([PY, "-m", "sandbox.task", "--backend", backend, "{}", "--", PY, "-c",
                           NESTED_SLEEP.format(marker=marker)], stdout=subprocess.PIPE) as launcher:
        try:
            assert launcher.stdout is not None
            assert int(launcher.stdout.readline())
            assert wait_until(lambda: bool(sleepers(marker)), timeout=10)
            launcher.kill()  # SIGKILL: no cleanup runs in the launcher
            launcher.wait()
            assert wait_until(lambda: not sleepers(marker), timeout=10), "the nested sandbox outlived its broker"
        finally:
            launcher.kill()


def test_nested_kill_and_signals_reach_the_nested_sandbox(backend: str) -> None:
    code = textwrap.dedent("""
        import signal, time
        from sandbox import task
        p = task.spawn(["sh", "-c", "trap 'exit 42' TERM; while :; do sleep 0.05; done"], task.Sandbox())
        time.sleep(0.5)
        p.terminate()
        print("term", p.wait(timeout=30))
        p = task.spawn(["sleep", "1000"], task.Sandbox())
        p.kill()
        print("kill", p.wait(timeout=30))
        print("missing", task.run(["/no/such/cmd"], task.Sandbox()).returncode if False else "")
        try:
            task.run(["/no/such/cmd"], task.Sandbox())
        except FileNotFoundError as e:
            print("not found", type(e).__name__)
    """)
    r = pyrun(code, Sandbox(), backend, timeout=120)
    assert r.stdout.split("\n")[:2] == ["term 42", f"kill {-signal.SIGKILL}"], r.stderr
    assert "not found ExecNotFoundError" in r.stdout, r.stderr


def test_untrusted_code_still_cannot_make_a_user_namespace(backend: str) -> None:
    code = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "print('made one' if libc.unshare(0x10000000) == 0 else f'refused {ctypes.get_errno()}')\n"  # CLONE_NEWUSER
            "print('broker', os.environ.get('SANDBOX_TASK_BROKER') is not None)")
    r = pyrun(code, Sandbox(), backend)
    assert r.stdout.split("\n")[:2] == ["refused 1", "broker True"], r.stderr


REQUEST = ("import os, sys\nos.environ['SANDBOX_TASK_BROKER'] = sys.argv[1]\nfrom sandbox import task\n"
           "try:\n    task.run(['true'], task.Sandbox())\n    print('STARTED')\n"
           "except Exception as e:\n    print(type(e).__name__, e)\n")


def test_the_broker_refuses_another_sandbox_and_has_no_name(backend: str) -> None:
    sb = Sandbox()
    broker = Broker(sb, task.compile(sb), backend, start=start_here)
    sock = broker._socket.sock
    assert sock.getsockname() == broker.host_path  # a path, never an abstract name; gone once attached
    target = task.spawn(["sleep", "1000"], sb, backend=backend)
    # another sandbox, shown the socket all the same
    other = task.spawn([PY, "-c", REQUEST, "/b"], Sandbox(binds=[task.Bind(broker.host_path, "/b")]),
                       backend=backend, stdout=subprocess.PIPE)
    try:
        broker.attach(target.pid)  # the broker serves `target`'s sandbox
        assert not os.path.lexists(broker.host_path)
        out, _ = other.communicate(timeout=60)
        assert out.decode().startswith("UnavailableError"), out
        assert "is not a process of this broker's sandbox" in out.decode(), out
    finally:
        broker.close()
        target.kill()
        target.wait()


HANDED = """
import array, json, os, socket, sys
s = socket.socket(fileno=int(sys.argv[1]))
req = {"kind": "task", "argv": ["true"], "environ": {}, "sandbox": {}}
s.sendmsg([json.dumps(req).encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]).tobytes())])
print(json.loads(s.recv(65536))["message"])
"""


def test_the_broker_refuses_another_user(backend: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root can run a process as another user")
    sb = Sandbox()
    broker = Broker(sb, task.compile(sb), backend, start=start_here)
    target = task.spawn(["sleep", "1000"], sb, backend=backend)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        r = subprocess.run([PY, "-c", REQUEST, broker.host_path], user=65534, group=65534, extra_groups=[],
                           capture_output=True, text=True, cwd="/", timeout=60)
        assert r.stdout.startswith("UnavailableError") and "Permission denied" in r.stdout, r.stdout + r.stderr
        conn.connect(broker.host_path)  # a connection of ours, handed to the other user, who asks on it
        broker.attach(target.pid)
        r = subprocess.run([PY, "-c", HANDED, str(conn.fileno())], user=65534, group=65534, extra_groups=[],
                           pass_fds=(conn.fileno(),), capture_output=True, text=True, cwd="/", timeout=60)
        assert "uid 65534 (pid " in r.stdout and "is not the owner" in r.stdout, r.stdout + r.stderr
    finally:
        conn.close()
        broker.close()
        target.kill()
        target.wait()


def test_without_a_broker_the_error_says_why(tmp_path: Path) -> None:
    code = "import os\nos.environ['SANDBOX_TASK_BROKER'] = '57'\n" + REQUEST.split("\n", 2)[2]
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60)
    assert "UnavailableError" in r.stdout and "SANDBOX_TASK_BROKER=57 names no broker socket" in r.stdout, r.stdout
    with socket.socket() as tcp, pytest.raises(UnavailableError, match="names no broker socket"):
        os.environ["SANDBOX_TASK_BROKER"] = str(tcp.fileno())  # a socket, but not a broker's
        try:
            task.run(["true"], Sandbox())
        finally:
            del os.environ["SANDBOX_TASK_BROKER"]


SPEC_INSIDE = """
import subprocess
import sandbox
from sandbox import RoBind, Spec, Tmpfs
from sandbox.presets import system_mounts
spec = Spec(mounts=[*system_mounts(), Tmpfs("/tmp"), RoBind("{all}"), RoBind("{all}", "/elsewhere")])
r = sandbox.run(["sh", "-c", "cat {all}/f /elsewhere/f; cat {top}/f 2>/dev/null || echo no-top; exit 5"], spec,
                capture_output=True, text=True)
print("spec:", r.returncode, r.stdout.split(), r.backend, "broker" in r.backend_reason)
for name, bad in (("seccomp", Spec(seccomp=None)), ("read", Spec(mounts=[RoBind("{top}")])),
                  ("cap_add", Spec(cap_add=["CAP_NET_RAW"]))):
    try:
        sandbox.run(["true"], bad)
        print(name, "STARTED")
    except Exception as e:
        print(name, "->", type(e).__name__, getattr(e, "field", str(e).split(":")[0]))
try:
    sandbox.run(["sleep", "1000"], Spec(), timeout=1)
except subprocess.TimeoutExpired as e:
    print("timeout", e.killed_by)
"""


def test_sandbox_run_of_a_spec_inside_goes_through_the_broker(backend: str, tree: dict[str, Path]) -> None:
    paths = {k: str(v) for k, v in tree.items()}
    outer = Sandbox(read=[paths["all"]])
    r = pyrun(SPEC_INSIDE.format(**paths), outer, backend, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().split("\n")
    assert lines == ["spec: 5 ['all', 'all', 'no-top'] brokered True", "seccomp -> SpecError seccomp",
                     "read -> SpecError read",
                     "cap_add -> UnavailableError a nested sandbox cannot let the command keep a capability",
                     "timeout timeout"], r.stdout + r.stderr


def test_the_broker_variable_name_is_the_same_in_the_executor_and_the_wire() -> None:
    from sandbox.backends import brokered
    from sandbox.task import wire

    assert brokered.BROKER_ENV == wire.BROKER_ENV == "SANDBOX_TASK_BROKER"


def test_inside_without_the_broker_variable_the_error_says_why(backend: str) -> None:
    code = ("import os\nfrom sandbox import task\ndel os.environ['SANDBOX_TASK_BROKER']\n"
            "try:\n    task.run(['true'], task.Sandbox())\nexcept Exception as e:\n    print(type(e).__name__, e)\n")
    r = pyrun(code, Sandbox(), backend)
    assert r.stdout.startswith("UnavailableError"), r.stdout + r.stderr
    assert "nor is a sandbox.task broker reachable (SANDBOX_TASK_BROKER is not set" in r.stdout, r.stdout


def test_a_broker_runs_a_bounded_number_of_nested_sandboxes(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from sandbox.task import broker

    monkeypatch.setattr(broker, "MAX_CHILDREN", 1)  # the broker runs in this (the test's) process
    code = ("from sandbox import task\np = task.spawn(['sleep', '1000'], task.Sandbox())\n"
            "try:\n    task.run(['true'], task.Sandbox())\nexcept Exception as e:\n    print(type(e).__name__, e)\n"
            "p.kill()\nprint('first', p.wait())\nprint('then', task.run(['true'], task.Sandbox()).returncode)\n")
    r = pyrun(code, Sandbox(), backend, timeout=120)
    lines = r.stdout.strip().split("\n")
    assert lines[0].startswith("UnavailableError") and "1 nested sandboxes" in lines[0], r.stdout + r.stderr
    assert lines[1:] == [f"first {-signal.SIGKILL}", "then 0"], r.stdout + r.stderr


def test_a_kernel_without_scm_pidfd_still_serves_the_sandbox(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before Linux 6.5 no pidfd comes with a message: the broker opens one from the sender's pid as it reads
    the request (a pid's strength), and still serves its own sandbox (as pretended here, in this process)."""
    from sandbox.task import wire

    monkeypatch.setattr(wire, "attaches_pidfds", lambda: False)  # the broker runs in this (the test's) process
    r = pyrun("from sandbox import task\nprint('nested', task.run(['true'], task.Sandbox()).returncode)\n",
              Sandbox(), backend, timeout=120)
    assert r.stdout.strip() == "nested 0", r.stdout + r.stderr


GARBAGE = """
import os, socket, array
from sandbox import task
where = os.environ["SANDBOX_TASK_BROKER"]
r, w = os.pipe()
def ask(data, fds=()):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(where)
    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds else []
    s.sendmsg([data], anc)
    s.settimeout(30)
    answer = s.recv(4096).decode()[:60]
    s.close()
    return answer
print("not json:", ask(b"not json"))
print("a list:", ask(b"[1, 2]"))
print("no fds:", ask(b'{"kind": "task"}'))
print("four fds:", ask(b'{"kind": "task", "argv": ["true"], "environ": {}}', [r, r, r, r]))
print("twelve fds:", ask(b'{"kind": "task"}', [r] * 12))
print("bad argv:", ask(b'{"kind": "task", "argv": "true", "environ": {}}', [0, 1, 2]))
print("bad kind:", ask(b'{"kind": "other", "argv": ["true"], "environ": {}}', [0, 1, 2]))
print("still serving:", task.run(["true"], task.Sandbox()).returncode)
"""


def test_the_broker_survives_malformed_requests_and_leaks_no_fd(backend: str) -> None:
    pyrun("pass", Sandbox(), backend)  # what a first start opens for good (caches, pools) is not a leak
    before = len(os.listdir("/proc/self/fd"))
    r = pyrun(GARBAGE, Sandbox(), backend, timeout=120)
    lines = r.stdout.strip().split("\n")
    assert len(lines) == 8, r.stdout + r.stderr
    for line in lines[:-1]:
        assert line.split(": ", 1)[1].startswith('{"error": "SpecError"'), r.stdout + r.stderr
    assert lines[-1] == "still serving: 0", r.stdout + r.stderr
    assert wait_until(lambda: len(os.listdir("/proc/self/fd")) <= before, timeout=10), \
        (before, os.listdir("/proc/self/fd"))


def test_a_link_swapped_in_after_the_check_changes_nothing(backend: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The race a requester could try: the path it asked for, in a directory it can write, replaced by a
    link to what the parent does not show, between the broker's check and the mount. The broker binds
    what it checked (an fd it holds), so the swap is simulated here at the worst moment: right after."""
    from sandbox.task import broker

    work, secret = tmp_path / "work", tmp_path / "secret"
    (work / "d").mkdir(parents=True)
    (work / "d" / "f").write_text("mine\n")
    secret.mkdir()
    (secret / "f").write_text("secret\n")
    for d in (tmp_path, work, secret):
        d.chmod(0o777)
    real_pin = broker.pin

    def pin_then_swap(field: str, path: str) -> int:
        fd = real_pin(field, path)
        if path == str(work / "d"):
            os.rename(path, str(work / "d2"))
            os.symlink(str(secret), path)
        return fd

    monkeypatch.setattr(broker, "pin", pin_then_swap)  # the broker runs in this (the test's) process
    code = (f"from sandbox import task\nr = task.run(['cat', {str(work / 'd' / 'f')!r}], "
            f"task.Sandbox(read=[{str(work / 'd')!r}]), capture_output=True, text=True)\n"
            "print(r.returncode, r.stdout.strip(), r.stderr.strip())\n")
    r = pyrun(code, Sandbox(write=[str(work)]), backend, timeout=120)
    assert (work / "d").is_symlink()  # the swap happened
    assert r.stdout.strip() == "0 mine", r.stdout + r.stderr


def test_pin_refuses_a_path_through_a_link(tmp_path: Path) -> None:
    from sandbox import SpecError
    from sandbox.task.broker import pin

    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    os.close(pin("read", str(tmp_path / "real")))
    for path in (tmp_path / "link", tmp_path / "link" / "x", tmp_path / "missing"):
        with pytest.raises(SpecError) as info:
            pin("read", str(path))
        assert info.value.field == "read"


def test_the_record_comes_back_in_the_parents_paths(backend: str, tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "in").mkdir(parents=True)
    outer = Sandbox(binds=[task.Bind(work, "/w", writable=True)], records=work / "records")
    code = ("import os\nfrom sandbox import task\nr = task.run(['true'], task.Sandbox(read=['/w/in']))\n"
            "print(r.record_path.startswith('/w/records/'), os.path.exists(r.record_path))\n"
            "print([b['source'] for b in r.record['binds'] if b['target'] == '/w/in'])\n"
            f"print({str(tmp_path)!r} in repr(r.record))\n")
    r = pyrun(code, outer, backend, timeout=120)
    assert r.stdout.split("\n")[:3] == ["True True", "['/w/in']", "False"], r.stdout + r.stderr


CLOSED_STDIN_INSIDE = """
import os, socket
from sandbox import task
os.close(0)
secret, peer = socket.socketpair()  # close-on-exec, at the number of the stdin closed above
assert secret.fileno() == 0, secret.fileno()
r = task.run(["sh", "-c", "readlink /proc/self/fd/0 || echo closed"], task.Sandbox(), capture_output=True,
             text=True)
print(os.readlink("/proc/self/fd/0"), r.returncode, r.stdout.strip())
"""


def test_a_close_on_exec_fd_at_a_closed_stdin_is_not_the_nested_sandboxs(backend: str) -> None:
    # What a command exec'd here would inherit: not a close-on-exec fd (the caller's secret here; as easily
    # a socket of the library's own, to the broker), which the broker would otherwise put at its fd 0.
    r = pyrun(CLOSED_STDIN_INSIDE, Sandbox(), backend, timeout=120)
    assert r.returncode == 0, r.stderr
    secret, status, theirs = r.stdout.split()
    assert secret.startswith("socket:") and status == "0" and theirs != secret, r.stdout
