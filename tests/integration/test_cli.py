"""`python -m sandbox run/probe` as a real subprocess, running real sandboxes.

The subprocess runs the package the tests import (the installed one): `-P`
keeps its cwd, which may be a checkout's root, off sys.path.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import site
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from leakcheck import descendants, kill_trees

import sandbox
from sandbox import spec as S
from sandbox.bwrap import grammar
from sandbox.seccomp import DEFAULT_POLICY, compile_policy

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 60
SYSTEM = [
    "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
    "--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev",
]
BWRAP = shutil.which("bwrap")


PYTHON_M_SANDBOX = [sys.executable, "-P", "-m", "sandbox"]


def cli(*args: str, env: dict[str, str] | None = None, cwd: str | Path = REPO, pass_fds: tuple[int, ...] = (),
        input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run `python -m sandbox ARGS` and capture its output."""
    return subprocess.run([*PYTHON_M_SANDBOX, *args], env=env, cwd=cwd, pass_fds=pass_fds,
                          input=input, capture_output=True, text=True, timeout=TIMEOUT)


def run(*args: str, **kw) -> subprocess.CompletedProcess[str]:
    """`python -m sandbox run ARGS`."""
    return cli("run", *args, **kw)


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("sandbox: ")
    return lines[0]


@contextlib.contextmanager
def start(*args: str) -> Iterator[subprocess.Popen[str]]:
    """Start `python -m sandbox run ARGS` and wait until the command prints its first line.
    On the way out, passed or failed, the CLI and its sandbox are gone (bwrap's default
    is no --die-with-parent: killing the CLI alone would leave the sandbox running)."""
    proc = subprocess.Popen([*PYTHON_M_SANDBOX, "run", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        yield proc
    finally:
        if proc.poll() is None:
            kill_trees({proc.pid, *descendants(proc.pid)})
        proc.communicate()


# ---------------------------------------------------------------- exit status

class TestExitStatus:
    @pytest.mark.parametrize("extra", [[], ["--unshare-all"], ["--unshare-pid"], ["--unshare-pid", "--as-pid-1"]])
    def test_command_status(self, extra):
        result = run(*SYSTEM, *extra, "--", "sh", "-c", "exit 3")
        assert result.returncode == 3, result.stderr
        assert result.stderr == ""

    @pytest.mark.parametrize("extra", [[], ["--unshare-all"]])
    def test_killed_by_signal(self, extra):
        assert run(*SYSTEM, *extra, "--", "sh", "-c", "kill -9 $$").returncode == 137

    def test_output_passes_through(self):
        result = run(*SYSTEM, "--unshare-all", "--", "sh", "-c", "echo out; echo err >&2")
        assert (result.returncode, result.stdout, result.stderr) == (0, "out\n", "err\n")

    def test_stdin_passes_through(self):
        assert run(*SYSTEM, "cat", input="from stdin\n").stdout == "from stdin\n"

    def test_bad_option(self):
        result = run(*SYSTEM, "--foo", "true")
        assert result.returncode == 125
        assert one_error_line(result) == "sandbox: Unknown option --foo"
        assert result.stdout == ""

    def test_a_later_bwraps_option_is_unknown(self):
        result = run(*SYSTEM, "--overlay-src", "/usr", "true")  # bubblewrap 0.11's
        assert result.returncode == 125
        assert one_error_line(result) == "sandbox: Unknown option --overlay-src"

    def test_bwrap_grammar_error(self):
        result = run(*SYSTEM, "--perms", "0700", "--bind", "/a", "/b", "true")
        assert result.returncode == 125
        assert one_error_line(result) == "sandbox: --perms must be followed by an option that creates a file"

    def test_invalid_spec(self):
        result = run(*SYSTEM, "--spec", "{nope", "true")
        assert result.returncode == 125
        assert "not valid JSON" in one_error_line(result)

    def test_no_command(self):
        result = run(*SYSTEM)
        assert result.returncode == 125
        one_error_line(result)

    def test_missing_command(self):
        result = run(*SYSTEM, "--unshare-all", "/nonexistent")
        assert result.returncode == 127
        assert "/nonexistent" in one_error_line(result)

    def test_command_not_executable(self, tmp_path):
        script = tmp_path / "script"
        script.write_text("#!/bin/sh\necho hi\n")
        script.chmod(0o644)
        result = run(*SYSTEM, "--ro-bind", str(script), "/script", "/script")
        assert result.returncode == 126
        assert "/script" in one_error_line(result)

    def test_failed_setup(self):
        result = run(*SYSTEM, "--chdir", "/nonexistent", "true")
        assert result.returncode == 125
        one_error_line(result)

    def test_missing_bind_source(self, tmp_path):
        result = run(*SYSTEM, "--bind", str(tmp_path / "source-enoent"), "/dest", "true")
        assert result.returncode == 125
        assert "source-enoent" in one_error_line(result)
        assert run(*SYSTEM, "--bind-try", str(tmp_path / "source-enoent"), "/dest", "true").returncode == 0

    def test_repeated_option_warns(self):
        result = run(*SYSTEM, "--chdir", "/", "--chdir", "/", "true")
        assert result.returncode == 0
        assert result.stderr == "sandbox: Only the last --chdir option will take effect\n"


# ---------------------------------------------------------------- environment and cwd

class TestEnvironment:
    def test_setenv_overrides_the_callers_value(self):
        env = {**os.environ, "FOO": "wrong", "BAR": "baz"}
        result = run(*SYSTEM, "--setenv", "FOO", "bar", "sh", "-c", 'echo "$FOO$BAR"', env=env)
        assert result.stdout == "barbaz\n"

    def test_unsetenv(self):
        env = {**os.environ, "FOO": "foo", "BAR": "baz"}
        assert run(*SYSTEM, "--unsetenv", "FOO", "sh", "-c", 'echo "$FOO$BAR"', env=env).stdout == "baz\n"

    def test_clearenv_leaves_only_pwd(self, tmp_path):
        result = run(*SYSTEM, "--bind", str(tmp_path), str(tmp_path), "--clearenv", "/usr/bin/env", cwd=tmp_path)
        assert result.stdout == f"PWD={tmp_path}\n"

    def test_cwd_is_kept_when_visible(self, tmp_path):
        result = run(*SYSTEM, "--bind", str(tmp_path), str(tmp_path), "pwd", cwd=tmp_path)
        assert result.stdout == f"{tmp_path}\n"

    def test_chdir_sets_cwd_and_pwd(self):
        result = run(*SYSTEM, "--chdir", "/usr", "--clearenv", "sh", "-c", 'pwd; echo "$PWD"')
        assert result.stdout == "/usr\n/usr\n"

    def test_env_options_apply_in_order(self):
        result = run(*SYSTEM, "--setenv", "A", "1", "--clearenv", "--setenv", "B", "2", "--chdir", "/", "/usr/bin/env")
        assert sorted(result.stdout.splitlines()) == ["B=2", "PWD=/"]


# ---------------------------------------------------------------- options

class TestOptions:
    def test_hostname(self):
        assert run(*SYSTEM, "--unshare-uts", "--hostname", "foo", "hostname").stdout == "foo\n"

    def test_as_pid_1(self):
        assert run(*SYSTEM, "--unshare-pid", "--as-pid-1", "sh", "-c", "echo $$").stdout == "1\n"

    def test_uid_and_gid(self):
        result = run(*SYSTEM, "--unshare-user", "--uid", "1000", "--gid", "1001", "sh", "-c",
                     "id -u; id -g; cat /proc/self/setgroups")
        assert result.stdout == "1000\n1001\ndeny\n"

    def test_unshare_net_leaves_only_loopback(self):
        result = run(*SYSTEM, "--unshare-net", "cat", "/proc/net/dev")
        interfaces = [line.split(":")[0].strip() for line in result.stdout.splitlines()[2:]]
        assert interfaces == ["lo"]

    def test_perms_and_size(self):
        result = run(*SYSTEM, "--tmpfs", "/tmp", "--perms", "1741", "--dir", "/tmp/d", "--size", "1048576",
                     "--perms", "01777", "--tmpfs", "/tmp/t", "sh", "-c",
                     "stat -c %a /tmp/d /tmp/t; df --output=size --block-size=1K /tmp/t | tail -1")
        assert result.stdout.split() == ["1741", "1777", "1024"]

    def test_limits(self):
        result = run(*SYSTEM, "--limit-nofile", "17", "--limit-cpu", "5", "sh", "-c", "ulimit -n; ulimit -t")
        assert result.stdout == "17\n5\n"

    def test_spec_option(self):
        base = S.Spec(mounts=(S.RoBind("/usr"), S.Symlink("usr/bin", "/bin"), S.Symlink("usr/lib", "/lib"),
                              S.Symlink("usr/lib64", "/lib64"), S.File("/etc/motd", b"hello\n")))
        result = run("--spec", base.to_json(), "--proc", "/proc", "cat", "/etc/motd")
        assert (result.returncode, result.stdout) == (0, "hello\n")

    def test_backend_option(self):
        for backend in ("native", "bwrap", "auto"):
            result = run(*SYSTEM, "--backend", backend, "sh", "-c", "exit 4")
            assert result.returncode == 4, (backend, result.stderr)


# ---------------------------------------------------------------- file descriptors

class TestFds:
    def test_inherited_fds_pass_through(self):
        r, w = os.pipe()
        try:
            result = run(*SYSTEM, "sh", "-c", f"echo through > /proc/self/fd/{w}", pass_fds=(w,))
            os.close(w)
            assert result.returncode == 0, result.stderr
            assert os.read(r, 100) == b"through\n"
        finally:
            os.close(r)

    def test_close_fds(self):
        r, w = os.pipe()
        try:
            result = run(*SYSTEM, "--close-fds", "sh", "-c", f"test -e /proc/self/fd/{w}", pass_fds=(w,))
            assert result.returncode == 1
        finally:
            os.close(r)
            os.close(w)

    def test_args_fd(self):
        r, w = os.pipe()
        os.write(w, b"--setenv\0X\0from args\0--dir\0/tmp/hello\0")
        os.close(w)
        try:
            result = run(*SYSTEM, "--tmpfs", "/tmp", "--args", str(r), "sh", "-c",
                         f'echo "$X"; test -d /tmp/hello && echo dir; test -e /proc/self/fd/{r} || echo closed',
                         pass_fds=(r,))
        finally:
            os.close(r)
        assert result.stdout == "from args\ndir\nclosed\n", result.stderr

    def test_file_and_bind_data_fds(self):
        fds = []
        for data in (b"file data", b"bound data"):
            r, w = os.pipe()
            os.write(w, data)
            os.close(w)
            fds.append(r)
        try:
            result = run(*SYSTEM, "--tmpfs", "/tmp", "--perms", "0640", "--file", str(fds[0]), "/tmp/file",
                         "--ro-bind-data", str(fds[1]), "/tmp/bound", "sh", "-c",
                         "cat /tmp/file; echo; cat /tmp/bound; echo; stat -c %a /tmp/file /tmp/bound",
                         pass_fds=tuple(fds))
        finally:
            for fd in fds:
                os.close(fd)
        assert result.stdout.split("\n") == ["file data", "bound data", "640", "600", ""], result.stderr


# ---------------------------------------------------------------- signals

class TestSignals:
    @pytest.mark.parametrize("extra", [[], ["--unshare-pid"]])
    @pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
    def test_forwarded_signal_ends_the_command(self, extra, sig):
        with start(*SYSTEM, *extra, "--", "sh", "-c", "echo ready; exec sleep 60") as proc:
            proc.send_signal(sig)
            assert proc.wait(timeout=TIMEOUT) == 128 + sig

    @pytest.mark.parametrize("extra", [[], ["--unshare-pid"], ["--unshare-pid", "--as-pid-1"]])
    def test_command_can_catch_a_forwarded_signal(self, extra):
        # Short foreground sleeps: the shell runs the trap when the current one ends, wherever
        # the signal lands (a signal that arrives just before `wait` starts can be missed by dash).
        script = 'trap "echo caught; exit 7" TERM; echo ready; while :; do sleep 0.05; done'
        with start(*SYSTEM, *extra, "--", "sh", "-c", script) as proc:
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=TIMEOUT)
            assert (proc.returncode, out) == (7, "caught\n")


# ---------------------------------------------------------------- other commands

class TestCommands:
    def test_probe(self):
        result = cli("probe")
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip()

    def test_help(self):
        for args in (["--help"], ["run", "--help"]):
            result = cli(*args)
            assert result.returncode == 0
            assert "usage:" in result.stdout

    def test_run_help_is_the_grammar_usage(self):
        result = cli("run", "--help")
        assert result.returncode == 0 and result.stdout.startswith(grammar.usage())
        assert "Exit status:" in result.stdout

    def test_run_version(self):
        result = cli("run", "--version")
        assert result.returncode == 0 and result.stdout.startswith("sandbox ")

    @pytest.mark.parametrize("flag", ["--version", "-V"])
    def test_version(self, flag):
        result = cli(flag)
        assert (result.returncode, result.stdout) == (0, f"sandbox {sandbox.__version__}\n")

    def test_the_console_script_says_its_version(self):
        script = Path(sys.executable).with_name("sandbox")
        for args in (["--version"], ["run", "--version"], ["run", "--ro-bind", "/", "/", "--version"]):
            result = subprocess.run([script, *args], capture_output=True, text=True, timeout=TIMEOUT, env=NO_SERVER)
            assert (result.returncode, result.stdout, result.stderr) == (0, f"sandbox {sandbox.__version__}\n", "")


# ---------------------------------------------------------------- named bwrap: its --version

# The console script is the client of the CLI server (tests/integration/test_cli_server.py): these
# tests run it without one, so that none is started in the user's own socket directory.
NO_SERVER = {**os.environ, "SANDBOX_CLI_SERVER": "0"}
BWRAP_VERSION = "bubblewrap 0.8.0\n"  # what bwrap 0.8.0 prints: the release whose command line `run` is


@pytest.fixture
def as_bwrap(tmp_path: Path) -> Path:
    """The console script under the name bwrap (a link, as a drop-in is installed)."""
    link = tmp_path / "bwrap"
    link.symlink_to(Path(sys.executable).with_name("sandbox"))
    tmp_path.chmod(0o755)
    return link


class TestNamedBwrap:
    """Programs check bwrap's version by reading `bubblewrap X.Y.Z` (all that
    follows `bubblewrap `, or the second field of each line): named bwrap,
    the program prints exactly that for the release whose command line it
    implements, wherever `--version` comes (bwrap prints it there, then exits)."""

    @pytest.mark.parametrize("args", [["--version"], ["--ro-bind", "/", "/", "--version", "true"]])
    def test_its_version_is_bwraps_line_alone(self, as_bwrap, args):
        result = subprocess.run([as_bwrap, *args], capture_output=True, text=True, timeout=TIMEOUT, env=NO_SERVER)
        assert (result.returncode, result.stdout, result.stderr) == (0, BWRAP_VERSION, "")
        assert result.stdout.strip().removeprefix("bubblewrap ") == "0.8.0"
        assert [line.split()[1] for line in result.stdout.splitlines()] == ["0.8.0"]

    @pytest.mark.skipif(BWRAP is None, reason="bwrap is not installed")
    def test_it_is_what_bwrap_0_8_0_prints(self, as_bwrap):
        expected = subprocess.run([BWRAP, "--version"], capture_output=True, timeout=TIMEOUT)
        if expected.stdout != BWRAP_VERSION.encode():
            pytest.skip(f"the installed bwrap is not 0.8.0: {expected.stdout!r}")
        result = subprocess.run([as_bwrap, "--version"], capture_output=True, timeout=TIMEOUT)
        assert (result.returncode, result.stdout, result.stderr) == (expected.returncode, expected.stdout,
                                                                      expected.stderr)

    def test_on_a_terminal_a_second_line_names_this_package(self, as_bwrap):
        import pty

        main, tty = pty.openpty()
        try:
            proc = subprocess.Popen([as_bwrap, "--version"], stdout=tty, stderr=subprocess.PIPE)
            os.close(tty)
            tty = -1
            out = b""
            while True:
                try:
                    chunk = os.read(main, 4096)
                except OSError:  # EIO: the terminal's other side is closed
                    break
                if not chunk:
                    break
                out += chunk
            assert proc.wait(timeout=TIMEOUT) == 0
        finally:
            os.close(main)
            if tty >= 0:
                os.close(tty)
        first, second = out.decode().splitlines()
        assert first == BWRAP_VERSION.strip()
        assert f"sandbox {sandbox.__version__}" in second and "not by bubblewrap" in second

    def test_probe_help(self):
        result = cli("probe", "--help")
        assert result.returncode == 0 and result.stdout.startswith("usage: python -m sandbox probe")

    def test_the_installed_command_names_itself_in_its_help(self):
        command = Path(sys.executable).with_name("sandbox")  # the client, run directly (no CLI server)
        env = {**os.environ, "SANDBOX_CLI_SERVER": "0"}
        for args, first in ((["--help"], "usage: sandbox run "), (["run", "--help"], "usage: sandbox run "),
                            (["probe", "--help"], "usage: sandbox probe")):
            result = subprocess.run([str(command), *args], env=env, capture_output=True, text=True, timeout=TIMEOUT)
            assert result.returncode == 0 and result.stdout.startswith(first), (args, result.stdout[:200])
            assert "python -m" not in result.stdout, args

    def test_probe_names_the_package_the_tests_import(self):
        result = cli("probe")
        package = Path(sandbox.__file__).resolve().parent
        assert f"package: sandbox {sandbox.__version__} in {package}\n" in result.stdout + "\n"

    def test_python_m_sandbox_in_an_uncompiled_checkout_runs_the_installed_package(self, tmp_path):
        # A source checkout's root: sandbox/ without its compiled core, which `python -m` would import.
        if not any(Path(sandbox.__file__).is_relative_to(p) for p in site.getsitepackages()):
            pytest.skip("an editable install: its finder serves the compiled core to any copy of the package")
        installed = Path(sandbox.__file__).resolve().parent
        shutil.copytree(installed, tmp_path / "sandbox", ignore=shutil.ignore_patterns("_native*", "_bin", "*.pyc"))
        result = subprocess.run([sys.executable, "-m", "sandbox", "probe"], cwd=tmp_path, capture_output=True,
                                text=True, timeout=TIMEOUT, env={**os.environ, "PYTHONSAFEPATH": ""})
        assert result.returncode == 0, result.stderr
        assert f"package: sandbox {sandbox.__version__} in {installed}\n" in result.stdout + "\n"

    def test_verbose_says_which_backend_ran_and_why(self):
        expected = sandbox.probe().choose("auto")
        result = run(*SYSTEM, "--verbose", "true")
        assert result.returncode == 0, result.stderr
        assert result.stderr.startswith(f"sandbox: {expected[0]} backend ({expected[1]}), network ")

    def test_dry_run_describes_and_runs_nothing(self, tmp_path):
        marker = tmp_path / "ran"
        result = run(*SYSTEM, "--tmpfs", "/tmp", "--unshare-all", "--hostname", "box", "--limit-nofile", "64",
                     "--seccomp-default", "--dry-run", "--bind", str(tmp_path), "/w", "touch", f"/w/{marker.name}")
        assert result.returncode == 0, result.stderr
        assert not marker.exists()
        words, _, bwrap = result.stdout.partition("equivalent bwrap command line:\n")
        assert words.startswith("backend: ")
        for expected in ("bind /usr at /usr, read-only", "symlink /bin -> usr/bin", "tmpfs at /tmp, mode 0755",
                         f"bind {tmp_path} at /w, writable", "hostname: box", "RLIMIT_NOFILE 64 open files",
                         "namespaces: new user, mount, pid, ipc, uts", "network: its own: only lo"):
            assert expected in words, (expected, words)
        line = bwrap.splitlines()[0]
        assert line.startswith("bwrap --unshare-user") and line.endswith(f"-- touch /w/{marker.name}")
        assert f"--bind {tmp_path} /w" in line and "--hostname box" in line and "--seccomp 3" in line
        assert "RLIMIT_NOFILE 64" in bwrap.splitlines()[-1]

    @pytest.mark.skipif(BWRAP is None, reason="bwrap is not installed")
    def test_dry_run_bwrap_line_runs_under_the_real_bwrap(self):
        result = run(*SYSTEM, "--unshare-all", "--clearenv", "--seccomp-default", "--dry-run", "--file", "0",
                     "/etc/motd", "cat", "/etc/motd", input="hello\n")
        line = result.stdout.split("equivalent bwrap command line:\n")[1].splitlines()[0]
        argv = shlex.split(line)
        # The text numbers the fds from 3 (the data, then the program): put real ones in their place.
        data, program = os.pipe(), os.pipe()
        os.write(data[1], b"hello\n")
        os.write(program[1], compile_policy(DEFAULT_POLICY))
        for fd in (data[1], program[1]):
            os.close(fd)
        argv[argv.index("--file") + 1] = str(data[0])
        argv[argv.index("--seccomp") + 1] = str(program[0])
        try:
            real = subprocess.run(argv, pass_fds=(data[0], program[0]), capture_output=True, text=True,
                                  timeout=TIMEOUT, cwd="/")
        finally:
            os.close(data[0])
            os.close(program[0])
        assert (real.returncode, real.stdout) == (0, "hello\n"), real.stderr

    def test_unknown_command(self):
        result = cli("frobnicate")
        assert result.returncode == 125
        one_error_line(result)

    def test_no_arguments(self):
        result = cli()
        assert result.returncode == 125 and "usage:" in result.stderr


# ---------------------------------------------------------------- same results as bwrap 0.8.0

@pytest.mark.skipif(BWRAP is None, reason="bwrap is not installed")
@pytest.mark.parametrize("args", [
    ["sh", "-c", "exit 3"],
    ["--unshare-pid", "sh", "-c", "exit 3"],
    ["sh", "-c", "kill -9 $$"],
    ["--clearenv", "--setenv", "A", "b", "--chdir", "/", "/usr/bin/env"],
    ["--unshare-uts", "--hostname", "foo", "hostname"],
    ["--unshare-pid", "--as-pid-1", "sh", "-c", "echo $$"],
    ["--unshare-user", "--uid", "1000", "--gid", "1001", "sh", "-c", "id -u; id -g"],
    ["--tmpfs", "/tmp", "--dir", "/tmp/a", "--perms", "0750", "--dir", "/tmp/a/b/c", "stat", "-c", "%a %n",
     "/tmp/a", "/tmp/a/b", "/tmp/a/b/c"],
    ["--tmpfs", "/tmp", "--symlink", "/usr/bin", "/tmp/link", "readlink", "/tmp/link"],
    ["--", "sh", "-c", "echo hello"],
])
def test_same_as_bwrap(args):
    real = subprocess.run([BWRAP, *SYSTEM, *args], capture_output=True, text=True, timeout=TIMEOUT, cwd="/")
    ours = run(*SYSTEM, *args, cwd="/")
    assert (ours.returncode, ours.stdout) == (real.returncode, real.stdout), ours.stderr
