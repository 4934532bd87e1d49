"""sandbox-launch's `--report-fd N` (sandbox.backends.blob): one struct sbx_result through a pipe whose write
end only the launcher holds, so the blob executor raises the native backend's typed errors.

- the record: a start (the sandbox's first process, its stamps) or the setup's failure, then the pipe's end;
  a failure is then not printed on the command's stderr; a bad fd number is refused;
- the write end is never the command's: a command that writes to that number forges nothing, and it cannot
  be passed on (`--pass-fd`, the fds the command keeps at their numbers);
- the blob executor: SetupError / ExecError with their step, backend "blob", and no process or fd left behind;
- without the option, sandbox-launch keeps its contract: 125 and one "sandbox: ..." line.
"""

from __future__ import annotations

import base64
import os
import subprocess
from collections.abc import Iterator

import pytest
from conftest import child_pids, make_base_spec

import sandbox
from sandbox import backends
from sandbox._core.binding import ffi
from sandbox.backends.blob import launcher_path
from sandbox.backends.native import blob_for
from sandbox.plan_cache import compiled_plan

pytestmark = pytest.mark.integration

RECORD = ffi.sizeof("struct sbx_result")
SOURCE = "/no/such/source"


@pytest.fixture(autouse=True)
def blob() -> None:
    ok, why = backends.availability("blob")
    if not ok:
        pytest.skip(f"the blob executor is unavailable: {why}")


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        yield r, w
    finally:
        for fd in (r, w):
            try:
                os.close(fd)
            except OSError:
                pass


def plan_words(spec: sandbox.Spec) -> list[str]:
    return ["--plan", base64.b64encode(blob_for(compiled_plan(spec, backends.host_for("blob")))).decode()]


def launch(words: list[str], w: int, *more: int) -> subprocess.CompletedProcess[bytes]:
    """sandbox-launch WORDS with the pipe's write end (and `more`) at its own number; the caller's copy of
    the write end closed after."""
    try:
        return subprocess.run([launcher_path(), *words], pass_fds=(w, *more), capture_output=True, timeout=60,
                              env={"PATH": "/usr/bin:/bin"})
    finally:
        os.close(w)


def records(r: int) -> bytes:
    out = b""
    while chunk := os.read(r, 4096):
        out += chunk
    return out


def test_a_start_is_one_record_and_the_write_end_is_the_launchers_alone(pipe: tuple[int, int]) -> None:
    r, w = pipe
    done = launch(["--report-fd", str(w), *plan_words(make_base_spec()), "--", "/bin/sh", "-c", "ls /proc/self/fd"],
                  w)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [b"0", b"1", b"2", b"3"]  # 3: ls's own directory
    data = records(r)
    assert len(data) == RECORD
    res = ffi.from_buffer("struct sbx_result *", data)
    assert res.step == 0 and res.pid > 0 and res.t_ns[0] > 0


def test_a_command_that_writes_to_the_reports_number_forges_nothing(pipe: tuple[int, int]) -> None:
    """The attack: the command knows the number (it is on the launcher's command line) and writes a record of
    its own there, a failure that would make the caller believe its command never ran."""
    r, w = pipe
    forge = (f"import os\ntry:\n    os.write({w}, bytes({RECORD}))\n    print('forged')\n"
             "except OSError as e:\n    print('refused')")
    done = launch(["--report-fd", str(w), *plan_words(make_base_spec()), "--", "/usr/bin/python3", "-c", forge], w)
    assert done.stdout == b"refused\n", done.stderr
    data = records(r)
    assert len(data) == RECORD and ffi.from_buffer("struct sbx_result *", data).step == 0


def test_a_setup_failure_is_the_record_not_a_line_on_stderr(pipe: tuple[int, int]) -> None:
    r, w = pipe
    spec = make_base_spec(sandbox.RoBind(SOURCE, "/mnt"))
    done = launch(["--report-fd", str(w), *plan_words(spec), "--", "/bin/true"], w)
    assert (done.returncode, done.stderr) == (125, b"")
    res = ffi.from_buffer("struct sbx_result *", records(r))
    assert res.step != 0 and res.err == 2  # ENOENT, of the source


@pytest.mark.parametrize("number", ["2", "x", "99", "-1"])
def test_a_report_fd_that_is_no_open_fd_above_stdio_is_refused(number: str) -> None:
    done = subprocess.run([launcher_path(), "--report-fd", number, *plan_words(make_base_spec()), "--",
                           "/bin/true"], capture_output=True, timeout=60)
    assert done.returncode == 125
    assert done.stderr == f"sandbox: --report-fd {number}: not an open fd above 2\n".encode()


def test_a_passed_fd_is_the_commands_at_its_number(pipe: tuple[int, int]) -> None:
    r, w = pipe
    data_r, data_w = os.pipe()
    try:
        os.write(data_w, b"passed")
        os.close(data_w)
        script = f"import os\nprint(sorted(map(int, os.listdir('/proc/self/fd'))), os.read({data_r}, 9).decode())"
        done = launch(["--report-fd", str(w), "--pass-fd", str(data_r), *plan_words(make_base_spec()), "--",
                       "/usr/bin/python3", "-c", script], w, data_r)
    finally:
        os.close(data_r)
    assert (done.returncode, done.stdout) == (0, f"[0, 1, 2, 3, {data_r}] passed\n".encode()), done.stderr
    assert ffi.from_buffer("struct sbx_result *", records(r)).step == 0


def test_the_reports_fd_cannot_be_passed_to_the_command(pipe: tuple[int, int]) -> None:
    """The attack: a caller's bug (or a harness's argv) passing the report's write end on as well; the command
    would hold it and could write a record of its own, a failure that never happened."""
    r, w = pipe
    forge = f"import os\nos.write({w}, bytes({RECORD}))"
    done = launch(["--report-fd", str(w), "--pass-fd", str(w), *plan_words(make_base_spec()), "--",
                   "/usr/bin/python3", "-c", forge], w)
    assert done.returncode == 125
    assert done.stderr == f"sandbox: --pass-fd {w}: the report's fd is the launcher's alone\n".encode()
    assert records(r) == b""


def test_an_fd_passed_twice_is_refused(pipe: tuple[int, int]) -> None:
    r, w = pipe
    done = launch(["--pass-fd", str(w), "--pass-fd", str(w), *plan_words(make_base_spec()), "--", "/bin/true"], w)
    assert (done.returncode, done.stderr) == (125, f"sandbox: --pass-fd {w}: given twice\n".encode())


def test_report_fd_with_handoff_is_a_usage_error(pipe: tuple[int, int]) -> None:
    r, w = pipe
    done = launch(["--handoff", "--report-fd", str(w), *plan_words(make_base_spec()), "--", "/bin/true"], w)
    assert done.returncode == 125 and done.stderr.startswith(b"sandbox: usage: "), done.stderr
    assert records(r) == b""


def test_without_the_option_a_setup_failure_is_125_and_one_line() -> None:
    done = subprocess.run([launcher_path(), *plan_words(make_base_spec(sandbox.RoBind(SOURCE, "/mnt"))), "--",
                           "/bin/true"], capture_output=True, timeout=60)
    assert done.returncode == 125
    assert done.stderr.startswith(b"sandbox: ") and SOURCE.encode() in done.stderr and done.stderr.count(b"\n") == 1


# ---------------------------------------------------------------- the blob executor

def open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


@pytest.mark.parametrize(("argv", "extra", "error", "step"), [
    (["/bin/true"], (sandbox.RoBind(SOURCE, "/mnt"),), sandbox.SetupError, "source"),
    (["/no/such/command"], (), sandbox.ExecNotFoundError, None),
], ids=["source", "exec"])
def test_the_blob_executor_raises_the_typed_error(argv: list[str], extra: tuple[sandbox.Mount, ...],
                                                  error: type[sandbox.SandboxError], step: str | None) -> None:
    before = (child_pids(), open_fds())
    with pytest.raises(error) as raised:
        sandbox.run(argv, make_base_spec(*extra), backend="blob", capture_output=True, timeout=60)
    assert getattr(raised.value, "step", None) == step and getattr(raised.value, "backend", None) == "blob"
    assert (child_pids(), open_fds()) == before


def test_the_blob_executor_passes_fds_at_their_numbers() -> None:
    r, w = os.pipe()
    try:
        os.write(w, b"passed")
        os.close(w)
        script = f"import os\nprint(sorted(map(int, os.listdir('/proc/self/fd'))), os.read({r}, 9).decode())"
        done = sandbox.run(["/usr/bin/python3", "-c", script], make_base_spec(), backend="blob", pass_fds=(r,),
                           capture_output=True, text=True, timeout=60)
    finally:
        os.close(r)
    assert (done.returncode, done.stdout) == (0, f"[0, 1, 2, 3, {r}] passed\n"), done.stderr


def test_a_launcher_that_ends_without_a_record_is_a_setup_error_naming_its_status() -> None:
    """No record (the launcher failed itself: a malformed plan, sandbox-init missing): its status, reaped."""
    from sandbox.backends.blob import report

    pid = os.posix_spawn("/bin/sh", ["/bin/sh", "-c", "exit 125"], {})
    with pytest.raises(sandbox.SetupError, match=r"^sandbox-launch ended \(exit status 125\) before it started "
                                                 r"the sandbox \(its \"sandbox: \.\.\.\" line went to") as raised:
        report.started(b"", pid, b"", ["/bin/true"], 0, "sandbox-launch")
    assert (raised.value.step, raised.value.backend) == ("launch", "blob")
    assert pid not in child_pids()


def test_the_blob_handle_reports_its_sandbox_and_its_stages() -> None:
    with sandbox.spawn(["/bin/sh", "-c", "exit 3"], make_base_spec(), backend="blob") as proc:
        assert proc.sandbox_pid != proc.pid  # the launcher's child
        stamps = proc.timings
        assert 0 < stamps["launcher"] < stamps["child"] < stamps["ready"] <= stamps["exec"], stamps
        assert proc.wait(timeout=60) == 3
