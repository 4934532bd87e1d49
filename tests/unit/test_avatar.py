"""Pure tests of sandbox.compat.avatar: no process is started, no sandbox is built."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from sandbox.compat import avatar
from sandbox.compat.avatar import (
    Bwrap,
    Container,
    ExecSpec,
    HermeticEnv,
    NativeSandbox,
    NoSandbox,
    RLimits,
    Sandbox,
    SandboxExec,
    SandboxUnavailable,
    hermetic_env,
    make_sandbox,
    native_spec,
)
from sandbox.spec import Bind, Dev, Limits, Proc, RoBind, Spec, Tmpfs

CWD = Path("/work/space")
ARGV = ["python3", "-m", "pytest", "-q", "a b", "--flag=$HOME"]
PROFILE = "(version 1)(allow default)(deny network*)"


def native_or_none() -> NativeSandbox | None:
    """A NativeSandbox if the launcher can run here, else None."""
    try:
        return NativeSandbox()
    except SandboxUnavailable:
        return None


def harness_backends() -> list[Sandbox]:
    return [
        NoSandbox(),
        HermeticEnv(),
        HermeticEnv(rlimits=RLimits()),
        SandboxExec(),
        SandboxExec(allow_network=True),
        Bwrap(),
        Bwrap(allow_network=True, rlimits=RLimits()),
        Container(image="python:3.11"),
        Container(image="python:3.11", runtime="docker", allow_network=True, rlimits=RLimits(pids=7)),
    ]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """os.environ with no locale, TZ or test-sensitive names."""
    for name in list(os.environ):
        if name in ("LANG", "TZ", "SECRET_TOKEN", "RIGGED") or name.startswith("LC_"):
            monkeypatch.delenv(name)
    return monkeypatch


# ---------------------------------------------------------------- ExecSpec / Protocol

def test_execspec_is_frozen() -> None:
    spec = ExecSpec(argv=["true"], env={"A": "1"})
    assert spec.preexec_fn is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.argv = ["false"]  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.env = {}  # type: ignore[misc]
    assert [f.name for f in dataclasses.fields(ExecSpec)] == ["argv", "env", "preexec_fn"]


@pytest.mark.parametrize("backend", harness_backends(), ids=repr)
def test_every_backend_is_a_sandbox(backend: Sandbox) -> None:
    assert isinstance(backend, Sandbox)
    assert isinstance(backend.mode, str)


def test_native_backend_is_a_sandbox() -> None:
    native = native_or_none()
    if native is None:
        pytest.skip("the native launcher is not available here")
    assert isinstance(native, Sandbox)
    assert native.mode == "native"


def test_non_sandboxes_are_not_sandboxes() -> None:
    assert not isinstance(object(), Sandbox)
    assert not isinstance(ExecSpec(argv=[], env={}), Sandbox)


def test_modes() -> None:
    assert NoSandbox.mode == "none"
    assert HermeticEnv.mode == "hermetic-env"
    assert SandboxExec.mode == "sandbox-exec"
    assert Bwrap.mode == "bwrap"
    assert Container.mode == "container"
    assert NativeSandbox.mode == "native"


def test_constructors_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        Bwrap(True)  # type: ignore[misc]
    with pytest.raises(TypeError):
        Container("python:3.11")  # type: ignore[misc]
    with pytest.raises(TypeError):
        HermeticEnv(RLimits())  # type: ignore[misc]


def test_sandbox_unavailable_is_a_runtime_error() -> None:
    assert issubclass(SandboxUnavailable, RuntimeError)


# ---------------------------------------------------------------- RLimits / hermetic_env

def test_rlimits_defaults() -> None:
    limits = RLimits()
    assert (limits.cpu_seconds, limits.fsize_bytes, limits.pids) == (300, 536870912, 1024)
    with pytest.raises(dataclasses.FrozenInstanceError):
        limits.pids = 1  # type: ignore[misc]
    assert callable(limits.preexec())  # resource exists on Linux


def test_hermetic_env_vector() -> None:
    source = {
        "PATH": "/usr/bin:/bin",
        "VIRTUAL_ENV": "/venv",
        "LC_ALL": "C.UTF-8",
        "PYTEST_ADDOPTS": "-p rigged",
        "PYTHONPATH": "/evil",
        "NODE_OPTIONS": "--require /evil.js",
        "RUBYOPT": "-r/evil",
        "LD_PRELOAD": "/evil.so",
        "SECRET_TOKEN": "hunter2",
    }
    before = dict(source)
    out = hermetic_env(source)
    assert out == {"PATH": "/usr/bin:/bin", "VIRTUAL_ENV": "/venv", "LC_ALL": "C.UTF-8"}
    assert source == before
    assert out is not source


def test_hermetic_env_keeps_exactly_the_listed_names() -> None:
    kept = ["PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "TERM", "TMPDIR", "TMP", "TEMP", "TZ",
            "VIRTUAL_ENV", "SSL_CERT_FILE", "SSL_CERT_DIR", "LC_CTYPE", "LC_", "LC_MESSAGES"]
    dropped = ["lc_all", "Lc_ALL", "path", "LCALL", "XLC_ALL", "PWD", "OLDPWD", "DISPLAY", "HOSTNAME",
               "PYTHONHOME", "GIT_DIR", "SSH_AUTH_SOCK"]
    source = {name: f"value of {name}" for name in kept + dropped}
    assert hermetic_env(source) == {name: f"value of {name}" for name in kept}
    assert hermetic_env({}) == {}


# ---------------------------------------------------------------- environment at prepare time

@pytest.mark.parametrize("backend", harness_backends(), ids=repr)
def test_env_is_read_at_prepare_time(backend: Sandbox, clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("PATH", "/before")
    clean_env.setenv("SECRET_TOKEN", "before")
    clean_env.setenv("LANG", "before")
    first = backend.prepare(["true"], CWD)
    clean_env.setenv("PATH", "/after")
    clean_env.setenv("SECRET_TOKEN", "after")
    clean_env.setenv("LANG", "after")
    second = backend.prepare(["true"], CWD)
    assert first.env["PATH"] == "/before"
    assert second.env["PATH"] == "/after"
    assert second.env["LANG"] == "after"
    if backend.mode in ("none", "container"):
        assert second.env == dict(os.environ)
        assert second.env["SECRET_TOKEN"] == "after"
    else:
        assert second.env == hermetic_env(os.environ)
        assert "SECRET_TOKEN" not in second.env
    if backend.mode == "container":
        assert "LANG=before" in first.argv
        assert "LANG=after" in second.argv


@pytest.mark.parametrize("backend", harness_backends(), ids=repr)
def test_env_is_a_fresh_dict(backend: Sandbox) -> None:
    spec = backend.prepare(["true"], CWD)
    assert spec.env is not os.environ
    spec.env["ADDED_BY_TEST"] = "1"
    assert "ADDED_BY_TEST" not in os.environ
    assert "ADDED_BY_TEST" not in backend.prepare(["true"], CWD).env


@pytest.mark.parametrize("backend", harness_backends(), ids=repr)
def test_argv_is_the_tail_and_a_copy(backend: Sandbox) -> None:
    argv = list(ARGV)
    spec = backend.prepare(argv, CWD)
    assert spec.argv[len(spec.argv) - len(ARGV):] == ARGV
    assert spec.argv is not argv
    argv.append("mutated")
    assert "mutated" not in spec.argv


# ---------------------------------------------------------------- the backends' exact output

def test_no_sandbox(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("SECRET_TOKEN", "s")
    spec = NoSandbox().prepare(ARGV, CWD)
    assert spec == ExecSpec(argv=ARGV, env=dict(os.environ), preexec_fn=None)


def test_hermetic_env_backend(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("SECRET_TOKEN", "s")
    clean_env.setenv("LC_TIME", "C")
    spec = HermeticEnv().prepare(ARGV, CWD)
    assert spec == ExecSpec(argv=ARGV, env=hermetic_env(os.environ), preexec_fn=None)
    assert spec.env["LC_TIME"] == "C"
    limited = HermeticEnv(rlimits=RLimits(cpu_seconds=5)).prepare(ARGV, CWD)
    assert limited.argv == ARGV
    assert callable(limited.preexec_fn)


def bwrap_argv(*unshare: str) -> list[str]:
    """What Bwrap().prepare(ARGV, CWD) gives, with `unshare` before the command."""
    return [
        "bwrap", "--die-with-parent",
        "--ro-bind", "/", "/",
        "--dev", "/dev",
        "--proc", "/proc",
        "--tmpfs", "/tmp",
        "--bind", "/work/space", "/work/space",
        "--chdir", "/work/space",
        *unshare,
        *ARGV,
    ]


def test_bwrap_argv_without_network() -> None:
    spec = Bwrap().prepare(ARGV, CWD)
    assert spec.argv == bwrap_argv("--unshare-net")
    assert spec.env == hermetic_env(os.environ)
    assert spec.preexec_fn is None


def test_bwrap_argv_with_network() -> None:
    spec = Bwrap(allow_network=True, rlimits=RLimits()).prepare(ARGV, CWD)
    assert spec.argv == bwrap_argv()
    assert "--unshare-net" not in spec.argv
    assert callable(spec.preexec_fn)


def test_sandbox_exec_argv() -> None:
    spec = SandboxExec().prepare(ARGV, CWD)
    assert spec.argv == ["/usr/bin/sandbox-exec", "-p", PROFILE, *ARGV]
    assert spec.env == hermetic_env(os.environ)
    assert spec.preexec_fn is None
    allowed = SandboxExec(allow_network=True, rlimits=RLimits()).prepare(ARGV, CWD)
    assert allowed.argv == ARGV
    assert callable(allowed.preexec_fn)


def container_argv(runtime: str, network: str, pids: str, *rest: str) -> list[str]:
    """What Container(...).prepare gives for CWD: `runtime run` with its fixed options, then `rest`."""
    return [
        runtime, "run", "--rm", "-i",
        "--network", network,
        "--read-only",
        "--tmpfs", "/tmp",
        "--pids-limit", pids,
        "-v", "/work/space:/workspace:rw",
        "-w", "/workspace",
        *rest,
    ]


def test_container_argv_and_env_ordering(clean_env: pytest.MonkeyPatch) -> None:
    # Insertion order deliberately differs from the expected -e order.
    clean_env.setenv("LC_TIME", "en_GB.UTF-8")
    clean_env.setenv("TZ", "Europe/Paris")
    clean_env.setenv("LC_ALL", "C.UTF-8")
    clean_env.setenv("LANG", "fr_FR.UTF-8")
    clean_env.setenv("SECRET_TOKEN", "s")
    spec = Container(image="python:3.11").prepare(ARGV, CWD)
    assert spec.argv == container_argv(
        "podman", "none", "1024",
        "-e", "LANG=fr_FR.UTF-8",
        "-e", "TZ=Europe/Paris",
        "-e", "LC_ALL=C.UTF-8",
        "-e", "LC_TIME=en_GB.UTF-8",
        "python:3.11",
        *ARGV,
    )
    assert "SECRET_TOKEN=s" not in spec.argv
    assert spec.env == dict(os.environ)
    assert spec.preexec_fn is None


def test_container_network_runtime_pids(clean_env: pytest.MonkeyPatch) -> None:
    spec = Container(image="img", runtime="docker", allow_network=True, rlimits=RLimits(pids=7)).prepare(["id"], CWD)
    assert spec.argv == container_argv("docker", "bridge", "7", "img", "id")


def test_container_needs_an_image() -> None:
    with pytest.raises(ValueError, match="image"):
        Container(image="")


@pytest.mark.parametrize("backend", harness_backends(), ids=repr)
def test_prepare_is_deterministic_without_rlimits(backend: Sandbox) -> None:
    a = backend.prepare(ARGV, CWD)
    b = backend.prepare(ARGV, CWD)
    assert a.argv == b.argv
    assert a.env == b.env
    assert (a.preexec_fn is None) == (b.preexec_fn is None)


# ---------------------------------------------------------------- make_sandbox

def test_make_sandbox_mode_mapping() -> None:
    limits = RLimits(cpu_seconds=9)
    assert make_sandbox("none") == NoSandbox()
    assert make_sandbox("none", allow_network=True, rlimits=limits) == NoSandbox()
    assert make_sandbox("hermetic-env", allow_network=True, rlimits=limits) == HermeticEnv(rlimits=limits)
    assert make_sandbox("sandbox-exec", allow_network=True, rlimits=limits) == SandboxExec(
        allow_network=True, rlimits=limits)
    assert make_sandbox("bwrap") == Bwrap()
    assert make_sandbox("bwrap", allow_network=True, rlimits=limits) == Bwrap(allow_network=True, rlimits=limits)
    assert make_sandbox("container", image="img") == Container(image="img")
    assert make_sandbox("container", image="img", runtime="docker", allow_network=True, rlimits=limits) == Container(
        image="img", runtime="docker", allow_network=True, rlimits=limits)
    for mode in ("none", "hermetic-env", "sandbox-exec", "bwrap"):
        made = make_sandbox(mode, image="ignored", runtime="ignored")
        assert made.mode == mode
        assert isinstance(made, Sandbox)


def test_make_sandbox_none_ignores_network_and_limits() -> None:
    spec = make_sandbox("none", allow_network=False, rlimits=RLimits(cpu_seconds=1)).prepare(ARGV, CWD)
    assert spec.argv == ARGV
    assert spec.preexec_fn is None
    assert spec.env == dict(os.environ)


def test_make_sandbox_hermetic_env_ignores_network() -> None:
    for allow in (False, True):
        spec = make_sandbox("hermetic-env", allow_network=allow).prepare(ARGV, CWD)
        assert spec.argv == ARGV


@pytest.mark.parametrize("mode", ["x", "", "Bwrap", "docker", "hermetic_env", " none"])
def test_make_sandbox_unknown_mode(mode: str) -> None:
    with pytest.raises(ValueError) as info:
        make_sandbox(mode)
    assert str(info.value) == f"unknown sandbox_mode: {mode!r}"


def test_make_sandbox_unknown_mode_message() -> None:
    with pytest.raises(ValueError, match=r"^unknown sandbox_mode: 'x'$"):
        make_sandbox("x")


def test_make_sandbox_container_without_image() -> None:
    with pytest.raises(ValueError, match="image"):
        make_sandbox("container")
    with pytest.raises(ValueError, match="image"):
        make_sandbox("container", image="", runtime="docker")


def test_make_sandbox_native() -> None:
    try:
        made = make_sandbox("native", allow_network=True, rlimits=RLimits(pids=3))
    except SandboxUnavailable as exc:
        assert str(exc)  # the reason is given
        with pytest.raises(SandboxUnavailable):
            NativeSandbox()
    else:
        assert made == NativeSandbox(allow_network=True, rlimits=RLimits(pids=3))
        assert made.mode == "native"


def test_modes_constant() -> None:
    assert avatar.MODES == ("none", "hermetic-env", "sandbox-exec", "bwrap", "container", "native")


# ---------------------------------------------------------------- the native mode's Spec

def test_native_spec_default_world() -> None:
    environ = {"PATH": "/usr/bin", "HOME": "/home/u", "SECRET_TOKEN": "s", "LC_ALL": "C", "PYTHONPATH": "/x"}
    before = dict(environ)
    spec = native_spec(CWD, environ=environ)
    assert environ == before
    assert isinstance(spec, Spec)
    assert spec.mounts == (RoBind("/", "/"), Dev("/dev"), Proc("/proc"), Tmpfs("/tmp"),
                           Bind("/work/space", "/work/space"))
    assert all(type(m) is not Bind or m.dest == "/work/space" for m in spec.mounts)
    assert spec.network == "none"
    assert spec.cwd == "/work/space"
    assert spec.env_dict == {"PATH": "/usr/bin", "HOME": "/home/u", "LC_ALL": "C"}
    assert spec.env_inherit == ()
    assert spec.die_with_parent is True
    assert spec.new_session is True
    assert spec.limits == Limits()


def test_native_spec_network_and_limits() -> None:
    spec = native_spec(CWD, allow_network=True, rlimits=RLimits(cpu_seconds=7, fsize_bytes=3 << 20, pids=11),
                       environ={})
    assert spec.network == "host"
    assert spec.limits.cpu_s == 7
    assert spec.limits.nproc == 11
    assert spec.limits.file_bytes == 3 << 20
    default = native_spec(CWD, rlimits=RLimits(), environ={}).limits
    assert (default.cpu_s, default.file_bytes, default.nproc) == (300, 512 << 20, 1024)


def test_native_spec_file_limit_is_byte_precise() -> None:
    assert native_spec(CWD, rlimits=RLimits(fsize_bytes=1), environ={}).limits.file_bytes == 1
    assert native_spec(CWD, rlimits=RLimits(fsize_bytes=4097), environ={}).limits.file_bytes == 4097


def test_native_spec_cwd_under_tmp_is_bound_after_the_tmpfs() -> None:
    spec = native_spec(Path("/tmp/ws"), environ={})
    kinds = [m.kind for m in spec.mounts]
    assert kinds.index("tmpfs") < kinds.index("bind")
    assert spec.mounts[-1] == Bind("/tmp/ws", "/tmp/ws")


def test_native_spec_is_pure_and_json_round_trips() -> None:
    a = native_spec(CWD, rlimits=RLimits(), environ={"PATH": "/bin"})
    b = native_spec(str(CWD), rlimits=RLimits(), environ={"PATH": "/bin"})
    assert a == b
    assert Spec.from_json(a.to_json()) == a


def test_native_spec_rejects_a_relative_cwd() -> None:
    with pytest.raises(ValueError):
        native_spec(Path("relative/dir"), environ={})


# ---------------------------------------------------------------- NativeSandbox.prepare (needs the launcher)

@pytest.fixture
def native() -> NativeSandbox:
    sandbox = native_or_none()
    if sandbox is None:
        pytest.skip("the native launcher is not available here")
    return sandbox


def test_native_prepare_shape(native: NativeSandbox, clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("SECRET_TOKEN", "s")
    spec = native.prepare(ARGV, CWD)
    assert spec.preexec_fn is None
    assert spec.env == hermetic_env(os.environ)
    assert os.path.isabs(spec.argv[0])
    assert spec.argv[len(spec.argv) - len(ARGV):] == ARGV
    assert len(spec.argv) > len(ARGV)
    assert not any("SECRET_TOKEN" in a for a in spec.argv)


def test_native_prepare_is_deterministic(native: NativeSandbox) -> None:
    limited = NativeSandbox(rlimits=RLimits(cpu_seconds=3))
    assert native.prepare(ARGV, CWD) == native.prepare(list(ARGV), Path(str(CWD)))
    assert limited.prepare(ARGV, CWD) == limited.prepare(ARGV, CWD)
    assert native.prepare(ARGV, CWD).argv != NativeSandbox(allow_network=True).prepare(ARGV, CWD).argv
    assert native.prepare(ARGV, CWD).argv != limited.prepare(ARGV, CWD).argv
    assert native.prepare(ARGV, CWD).argv != native.prepare(ARGV, Path("/work/other")).argv


def test_native_prepare_reads_env_at_prepare_time(native: NativeSandbox, clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("LC_TIME", "before")
    first = native.prepare(["true"], CWD)
    clean_env.setenv("LC_TIME", "after")
    second = native.prepare(["true"], CWD)
    assert first.env["LC_TIME"] == "before"
    assert second.env["LC_TIME"] == "after"


def test_native_prepare_does_no_io_and_starts_nothing(native: NativeSandbox, monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    import builtins
    import io
    import subprocess
    import tempfile

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"prepare() must be pure, but called {args!r}")

    for owner, name in [(builtins, "open"), (io, "open"), (os, "open"), (os, "fork"), (os, "posix_spawn"),
                        (os, "posix_spawnp"), (os, "mkdir"), (os, "makedirs"), (tempfile, "mkstemp"),
                        (tempfile, "mkdtemp"), (subprocess.Popen, "_execute_child")]:
        monkeypatch.setattr(owner, name, forbidden)
    spec = native.prepare(["true"], tmp_path / "not-created")
    monkeypatch.undo()
    assert spec.argv[-1] == "true"
    assert not (tmp_path / "not-created").exists()
    assert list(tmp_path.iterdir()) == []
