"""The nsbox provider beyond Inspect's self_check: exec_remote's streaming and
long-lived processes, the exec output limit, a session that died, the config
(files, named environments, bad fields), links planted against the file API,
and what is left after cleanup and after the eval's process is killed."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

pytest.importorskip("inspect_ai")

from conftest import wait_until  # noqa: E402  (tests/, on sys.path)
from inspect_ai.util import (  # noqa: E402
    ExecCompleted,
    ExecRemoteAwaitableOptions,
    ExecRemoteStreamingOptions,
    ExecStderr,
    ExecStdout,
    OutputLimitExceededError,
    SandboxEnvironment,
    SandboxUnavailableError,
)
from inspect_ai.util._sandbox.limits import override_max_exec_output_size  # noqa: E402

from sandbox.inspect import ConfigError, NsboxConfig, NsboxSandboxEnvironment, lifecycle  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.anyio, pytest.mark.usefixtures("require_native")]
TASK = "provider-test"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def env() -> AsyncIterator[NsboxSandboxEnvironment]:
    environments = await NsboxSandboxEnvironment.sample_init(TASK, None, {})
    try:
        sandbox = environments["default"]
        assert isinstance(sandbox, NsboxSandboxEnvironment)
        yield sandbox
    finally:
        await NsboxSandboxEnvironment.sample_cleanup(TASK, None, environments, False)
        assert lifecycle.open_count() == 0


def _dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


async def _alive(env: SandboxEnvironment, marker: str) -> bool:
    ps = await env.exec(["sh", "-c", f"ps -eo args | grep -v grep | grep -c {marker}"])
    return ps.stdout.strip() != "0"


async def test_exec_remote_streams_output_then_the_exit_status(env: NsboxSandboxEnvironment) -> None:
    proc = await env.exec_remote(["sh", "-c", "echo one; echo two >&2; sleep 0.2; printf 'caf\\303'; "
                                  "printf '\\251\\n'; exit 3"])
    events = [e async for e in proc]
    out = "".join(e.data for e in events if isinstance(e, ExecStdout))
    err = "".join(e.data for e in events if isinstance(e, ExecStderr))
    assert (out, err) == ("one\ncafé\n", "two\n")  # a character split across reads is joined
    assert isinstance(events[-1], ExecCompleted) and events[-1].exit_code == 3


async def test_exec_remote_process_outlives_the_call_until_killed(env: NsboxSandboxEnvironment) -> None:
    server = await env.exec_remote(["python3", "-c", "import socket, time\n"
                                    "s = socket.socket(); s.bind(('127.0.0.1', 8765)); s.listen()\n"
                                    "print('up', flush=True)\n"
                                    "while True: c, _ = s.accept(); c.sendall(b'pong'); c.close()"])
    events = server.__aiter__()
    assert isinstance(first := await events.__anext__(), ExecStdout) and first.data == "up\n"
    client = await env.exec(["python3", "-c", "import socket; print(socket.create_connection(("
                             "'127.0.0.1', 8765)).recv(4).decode())"], timeout=30)
    assert client.stdout == "pong\n"
    await server.kill()
    with pytest.raises(StopAsyncIteration):  # killed: no ExecCompleted, as with Inspect's own kill()
        await events.__anext__()
    assert not await _alive(env, "8765")


async def test_exec_remote_stdin_open_and_awaitable(env: NsboxSandboxEnvironment) -> None:
    proc = await env.exec_remote(["cat"], ExecRemoteStreamingOptions(stdin_open=True))
    await proc.write_stdin("hello ")
    await proc.write_stdin(b"world")
    await proc.close_stdin()
    events = [e async for e in proc]
    assert "".join(e.data for e in events if isinstance(e, ExecStdout)) == "hello world"
    done = await env.exec_remote(["sh", "-c", "cat; exit 4"], ExecRemoteAwaitableOptions(input="in"),
                                 stream=False)
    assert (done.returncode, done.stdout) == (4, "in")
    with pytest.raises(TimeoutError):
        await env.exec_remote(["sleep", "30"], ExecRemoteAwaitableOptions(timeout=1), stream=False)


async def test_cancelling_an_exec_kills_its_tree(env: NsboxSandboxEnvironment) -> None:
    task = asyncio.ensure_future(env.exec(["sh", "-c", "sleep 1001 & sleep 1002"]))
    await asyncio.sleep(0.5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not await _alive(env, "100[12]")


async def test_output_past_the_limit_raises_and_kills(env: NsboxSandboxEnvironment) -> None:
    with override_max_exec_output_size(1024):
        with pytest.raises(OutputLimitExceededError, match="1 KiB") as caught:
            await env.exec(["sh", "-c", "yes | head -c 5000; sleep 1003"])
    assert caught.value.truncated_output == "y\n" * 512
    assert not await _alive(env, "1003")
    small = await env.exec(["sh", "-c", "yes | head -c 5000"])
    assert len(small.stdout) == 5000


async def test_exec_results_as_a_shell_gives_them(env: NsboxSandboxEnvironment) -> None:
    missing = await env.exec(["no-such-program"])
    assert (missing.success, missing.returncode) == (False, 127)
    nowhere = await env.exec(["true"], cwd="/no/such/dir")
    assert not nowhere.success and "/no/such/dir" in nowhere.stderr
    with pytest.raises(PermissionError):
        await env.exec(["/etc/passwd"])
    here = await env.exec(["sh", "-c", "pwd; echo $HOME $EXTRA"], env={"EXTRA": "added"}, cwd=".")
    assert here.stdout == "/workspace\n/root added\n"


async def test_a_session_killed_from_outside_is_unavailable(env: NsboxSandboxEnvironment) -> None:
    os.kill(env.session.pid, signal.SIGKILL)
    assert wait_until(lambda: _dead(env.session.pid))  # the kill is delivered after os.kill returns
    with pytest.raises(SandboxUnavailableError, match="default"):
        await env.exec(["true"])


async def test_planted_links_do_not_reach_the_host(env: NsboxSandboxEnvironment, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("host secret")
    await env.exec(["ln", "-s", str(secret), "leak"])
    await env.exec(["ln", "-s", "../../../../../../" + str(tmp_path), "up"])
    for path in ("leak", "up/secret"):
        with pytest.raises(FileNotFoundError):
            await env.read_file(path)
    for path in ("leak", "up/secret"):  # the links lead nowhere inside: nothing is written anywhere
        with pytest.raises(FileNotFoundError):
            await env.write_file(path, "overwritten?")
    assert secret.read_text() == "host secret"


async def test_config_file_with_two_environments(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "f").write_text("from the host\n")
    config = tmp_path / "nsbox.yaml"
    config.write_text(textwrap.dedent(f"""\
        environments:
          default: {{env: {{GREETING: hi}}, binds: [{{src: {data}, dest: /data}}], limits: {{pids: 64}}}}
          other: {{workdir: /srv}}
        """))
    environments = await NsboxSandboxEnvironment.sample_init(TASK, str(config), {})
    try:
        assert list(environments) == ["default", "other"]
        first, second = environments["default"], environments["other"]
        done = await first.exec(["sh", "-c", "echo $GREETING; cat /data/f; touch /data/g; pwd; "
                                 "grep -c : /proc/net/dev"])
        assert done.stdout.split("\n")[:2] == ["hi", "from the host"]
        assert "Read-only file system" in done.stderr  # binds are read-only unless readonly: false
        assert done.stdout.split("\n")[2:4] == ["/workspace", "1"]  # one interface: lo
        await first.write_file("only-here", "x")
        assert (await second.exec(["ls", "/workspace"])).stdout == ""
        assert (await second.exec(["pwd"])).stdout == "/srv\n"
    finally:
        await NsboxSandboxEnvironment.sample_cleanup(TASK, str(config), environments, False)


@pytest.mark.parametrize(("config", "words"), [
    ({"limits": {"memory_mb": -1}}, "limits.memory_mb"),
    ({"limits": {"cpu": 0}}, "limits.cpu"),
    ({"imagee": "debian"}, "imagee"),
    ({"network": "everything"}, "network"),
    ({"workdir": "relative"}, "workdir"),
    ({"binds": [{"src": "/nonexistent/nsbox-test"}]}, "binds[0].src"),
    ({"image": "nsbox-test.invalid/missing:1"}, "image"),
    ({"environments": {"default": {}, "web": {"binds": [{"src": "/nonexistent/x"}]}}}, "environments.web"),
])
async def test_bad_config_names_the_field_and_leaves_nothing(config: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError, match=words.replace("[", r"\[").replace("]", r"\]")):
        model = NsboxSandboxEnvironment.config_deserialize(config)
        await NsboxSandboxEnvironment.task_init(TASK, model)
        await NsboxSandboxEnvironment.sample_init(TASK, model, {})
    assert lifecycle.open_count() == 0


async def test_bad_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be read"):
        await NsboxSandboxEnvironment.task_init(TASK, str(tmp_path / "absent.yaml"))
    (tmp_path / "bad.yaml").write_text("limits: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        await NsboxSandboxEnvironment.task_init(TASK, str(tmp_path / "bad.yaml"))
    (tmp_path / "bad.json").write_text('{"limits": {"pids": "many"}}')
    with pytest.raises(ConfigError, match="limits.pids"):
        await NsboxSandboxEnvironment.task_init(TASK, str(tmp_path / "bad.json"))


async def test_task_cleanup_closes_what_a_sample_left_open() -> None:
    environments = await NsboxSandboxEnvironment.sample_init(TASK, NsboxConfig(), {})
    assert lifecycle.open_count() == 1
    await NsboxSandboxEnvironment.task_cleanup(TASK, None, True)
    assert lifecycle.open_count() == 0
    with pytest.raises(SandboxUnavailableError):
        await environments["default"].exec(["true"])


KILLED = """
import asyncio, sys
from sandbox.inspect import NsboxSandboxEnvironment
async def main():
    envs = await NsboxSandboxEnvironment.sample_init("killed", None, {})
    await envs["default"].exec_remote(["sleep", "1004"])
    print(envs["default"].session.pid, flush=True)
    await asyncio.sleep(1000)
asyncio.run(main())
"""


def test_a_killed_eval_leaves_nothing() -> None:
    child = subprocess.Popen([sys.executable, "-c", KILLED], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        pid1 = int(child.stdout.readline())
        assert os.path.exists(f"/proc/{pid1}")
    finally:
        child.kill()
        child.wait()
    assert wait_until(lambda: not os.path.exists(f"/proc/{pid1}"), timeout=10)
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert "sleep 1004" not in ps


async def test_connection_is_a_shell_into_the_samples_sandbox(env: NsboxSandboxEnvironment, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDBOX_SESSION_DIR", str(tmp_path / "sessions"))  # this test's own per-user directory
    await env.write_file("/tmp/mark", "this sample\n")
    connection = await env.connection()
    assert connection.type == "nsbox" and connection.command.endswith("-- bash -l")
    assert (await env.connection()).command == connection.command  # published once
    shell = await asyncio.to_thread(subprocess.run, connection.command, shell=True, input="cat /tmp/mark; exit 3\n",
                                    capture_output=True, text=True, timeout=60)
    assert (shell.returncode, shell.stdout) == (3, "this sample\n"), shell.stderr
    env.session.close()  # the sample ends: its socket goes with it
    assert not list((tmp_path / "sessions").glob("session-*.sock"))
