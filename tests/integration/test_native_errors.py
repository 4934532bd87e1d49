"""Failures of native sandboxes: typed errors that name the step and the path,
and nothing left behind (no process, no zombie, no fd)."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import sandbox
from sandbox import Namespaces, Spec
from sandbox.errors import ExecError, ExecNotFoundError, ExecPermissionError, SandboxError, SetupError, SpecError
from sandbox.mounts import Bind, Chmod, Dir, File, RemountRo, RoBind, Symlink, Tmpfs

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("require_native", "clean")]

BaseSpec = Callable[..., Spec]

MODES = {
    "reaper": {},
    "as-pid-1": {"as_pid_1": True},
    "no-pid-ns": {"namespaces": Namespaces(pid=False)},
}


@pytest.fixture
def clean(no_leftovers: str, fd_count: Callable[[], int], base_spec: BaseSpec) -> Iterator[None]:
    """The test must leave no new child, zombie or open fd behind."""
    sandbox.run(["true"], base_spec(), backend="native")  # warm up: the backend keeps one fd of sandbox-init
    before = fd_count()
    yield
    assert fd_count() == before


def setup_error(spec: Spec, argv: list[str] | None = None, **kwargs: object) -> SetupError:
    """Run and return the SetupError raised (fail if none)."""
    with pytest.raises(SetupError) as info:
        sandbox.run(argv or ["true"], spec, backend="native", timeout=60, **kwargs)  # type: ignore[arg-type]
    assert isinstance(info.value, SandboxError)
    assert info.value.backend == "native"
    return info.value


# ---------------------------------------------------------------- setup failures


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("mount", [Bind, RoBind])
def test_missing_bind_source(base_spec: BaseSpec, tmp_path: Path, mode: str, mount: type) -> None:
    missing = str(tmp_path / "no-such-dir")
    err = setup_error(base_spec(mount(missing, "/data"), **MODES[mode]), stdout=sandbox.PIPE, stdin=sandbox.PIPE)
    assert (err.step, err.path, err.errno) == ("source", missing, errno.ENOENT)
    assert missing in str(err)


def test_optional_missing_source_is_skipped(base_spec: BaseSpec, tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-dir")
    r = sandbox.run(["sh", "-c", "test -e /data || echo absent"], base_spec(Bind(missing, "/data", optional=True)),
                    capture_output=True, backend="native", timeout=60)
    assert (r.returncode, r.stdout) == (0, b"absent\n")


def test_optional_present_source_is_bound(base_spec: BaseSpec, tmp_path: Path) -> None:
    (tmp_path / "f").write_text("here\n")
    r = sandbox.run(["cat", "/data/f"], base_spec(RoBind(str(tmp_path), "/data", optional=True)),
                    capture_output=True, backend="native", timeout=60)
    assert r.stdout == b"here\n"


def test_symlink_conflict(base_spec: BaseSpec, tmp_path: Path) -> None:
    (tmp_path / "link").symlink_to("somewhere")
    (tmp_path / "file").write_text("x")
    err = setup_error(base_spec(Bind(str(tmp_path), "/w"), Symlink("elsewhere", "/w/link")))
    assert (err.step, err.path, err.errno) == ("symlink", "/w/link", errno.EEXIST)
    assert "/w/link" in str(err)
    err = setup_error(base_spec(Bind(str(tmp_path), "/w"), Symlink("elsewhere", "/w/file")))
    assert (err.step, err.path, err.errno) == ("symlink", "/w/file", errno.EEXIST)
    assert os.readlink(tmp_path / "link") == "somewhere"
    assert (tmp_path / "file").read_text() == "x"


def test_an_identical_symlink_is_fine(base_spec: BaseSpec, tmp_path: Path) -> None:
    (tmp_path / "link").symlink_to("somewhere")
    r = sandbox.run(["readlink", "/w/link"], base_spec(Bind(str(tmp_path), "/w"), Symlink("somewhere", "/w/link")),
                    capture_output=True, backend="native", timeout=60)
    assert r.stdout == b"somewhere\n"


@pytest.mark.parametrize("mode", MODES)
def test_bad_cwd(base_spec: BaseSpec, mode: str) -> None:
    err = setup_error(base_spec(cwd="/no/such/dir", **MODES[mode]))
    assert (err.step, err.path, err.errno) == ("cwd", "/no/such/dir", errno.ENOENT)
    err = setup_error(base_spec(cwd="/usr/bin/env", **MODES[mode]))
    assert (err.step, err.path, err.errno) == ("cwd", "/usr/bin/env", errno.ENOTDIR)


@pytest.mark.parametrize(
    ("extra", "step", "path", "err"),
    [
        ((Chmod("/usr", 0o700),), "chmod", "/usr", errno.EROFS),
        ((Chmod("/nope", 0o700),), "chmod", "/nope", errno.ENOENT),
        ((RemountRo("/nope"),), "remount_ro", "/nope", errno.ENOENT),
        ((Dir("/usr/newdir"),), "dir", "/usr/newdir", errno.EROFS),
        ((File("/usr/newfile", data=b"x"),), "file", "/usr/newfile", errno.EROFS),
        ((Tmpfs("/usr/new/mnt"),), "tmpfs", "/usr/new/mnt", errno.EROFS),
        ((File("/usr/bin", data=b"x"),), "file", "/usr/bin", errno.EISDIR),
        ((Symlink("x", "/usr/newlink"),), "symlink", "/usr/newlink", errno.EROFS),
    ],
)
def test_op_failures_name_step_and_path(base_spec: BaseSpec, extra: tuple[object, ...], step: str, path: str,
                                        err: int) -> None:
    e = setup_error(base_spec(*extra))
    assert (e.step, e.path, e.errno) == (step, path, err)
    assert path in str(e)


def test_bind_onto_a_file_under_a_read_only_mount(base_spec: BaseSpec, tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    e = setup_error(base_spec(RoBind(str(tmp_path / "f"), "/usr/new-file")))
    assert (e.step, e.path, e.errno) == ("bind", "/usr/new-file", errno.EROFS)


def test_a_failed_sandbox_closes_the_callers_pipes(base_spec: BaseSpec, tmp_path: Path) -> None:
    for _ in range(5):
        setup_error(base_spec(Bind(str(tmp_path / "missing"), "/x")), capture_output=True, input=b"data")


# ---------------------------------------------------------------- exec failures


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("command", ["no-such-command", "/usr/bin/no-such-command", "/nodir/cmd"])
def test_missing_command(base_spec: BaseSpec, mode: str, command: str) -> None:
    with pytest.raises(ExecNotFoundError) as info:
        sandbox.run([command, "arg"], base_spec(**MODES[mode]), capture_output=True, backend="native", timeout=60)
    err = info.value
    assert isinstance(err, FileNotFoundError) and isinstance(err, ExecError) and isinstance(err, SandboxError)
    assert (err.errno, err.filename) == (errno.ENOENT, command)
    assert command in str(err)


@pytest.mark.parametrize("mode", MODES)
def test_command_that_is_not_executable(base_spec: BaseSpec, mode: str) -> None:
    spec = base_spec(File("/opt/script", data=b"#!/bin/sh\necho ran\n", perms=0o644), Dir("/opt/dir"),
                     **MODES[mode])
    for command in ("/opt/script", "/opt/dir"):
        with pytest.raises(ExecPermissionError) as info:
            sandbox.run([command], spec, capture_output=True, backend="native", timeout=60)
        err = info.value
        assert isinstance(err, PermissionError) and isinstance(err, ExecError)
        assert (err.errno, err.filename) == (errno.EACCES, command)


@pytest.mark.parametrize("mode", MODES)
def test_non_executable_match_on_path_is_eacces(base_spec: BaseSpec, mode: str) -> None:
    spec = base_spec(File("/opt/bin/tool", data=b"#!/bin/sh\n", perms=0o644),
                     env={"PATH": "/opt/bin:/usr/bin"}, **MODES[mode])
    with pytest.raises(ExecPermissionError) as info:
        sandbox.run(["tool"], spec, backend="native", timeout=60)
    assert info.value.filename == "tool"


@pytest.mark.parametrize("mode", MODES)
def test_path_search_skips_non_executables_and_finds_the_next(base_spec: BaseSpec, mode: str) -> None:
    spec = base_spec(File("/opt/a/tool", data=b"#!/bin/sh\necho wrong\n", perms=0o644),
                     File("/opt/b/tool", data=b"#!/bin/sh\necho right\n", perms=0o755),
                     env={"PATH": "/opt/missing:/opt/a:/opt/b:/usr/bin"}, **MODES[mode])
    r = sandbox.run(["tool"], spec, capture_output=True, backend="native", timeout=60)
    assert (r.returncode, r.stdout) == (0, b"right\n")


@pytest.mark.parametrize("mode", MODES)
def test_exit_127_from_the_command_is_not_an_exec_error(base_spec: BaseSpec, mode: str) -> None:
    r = sandbox.run(["sh", "-c", "exit 127"], base_spec(**MODES[mode]), backend="native", timeout=60)
    assert r.returncode == 127


def test_a_broken_interpreter_is_reported(base_spec: BaseSpec) -> None:
    spec = base_spec(File("/opt/script", data=b"#!/no/such/interpreter\n", perms=0o755))
    with pytest.raises(ExecNotFoundError) as info:
        sandbox.run(["/opt/script"], spec, backend="native", timeout=60)
    assert info.value.filename == "/opt/script"


@pytest.mark.parametrize("mode", MODES)
def test_a_script_without_shebang_runs_with_sh_like_bwrap(base_spec: BaseSpec, mode: str) -> None:
    spec = base_spec(File("/opt/script", data=b"echo ran\n", perms=0o755), **MODES[mode])
    r = sandbox.run(["/opt/script"], spec, capture_output=True, backend="native", timeout=60)
    assert r.stdout == b"ran\n"


# ---------------------------------------------------------------- refused before anything runs


@pytest.mark.parametrize("argv", [[], [""], ["a\0b"], "sh"])
def test_bad_argv_is_a_spec_error(base_spec: BaseSpec, argv: object) -> None:
    with pytest.raises(SpecError) as info:
        sandbox.spawn(argv, base_spec(), backend="native")  # type: ignore[arg-type]
    assert info.value.field.startswith("argv")


def test_spec_must_be_a_spec() -> None:
    with pytest.raises(SpecError) as info:
        sandbox.run(["true"], {"mounts": []}, backend="native")  # type: ignore[arg-type]
    assert info.value.field == "spec"


def test_bad_stdio_arguments(base_spec: BaseSpec) -> None:
    with pytest.raises(SpecError) as info:
        sandbox.run(["true"], base_spec(), stdout=sandbox.STDOUT, backend="native")
    assert info.value.field == "stdout"
    with pytest.raises(SpecError) as info:
        sandbox.run(["true"], base_spec(), capture_output=True, stdout=sandbox.PIPE, backend="native")
    assert info.value.field == "capture_output"
    with pytest.raises(SpecError):
        sandbox.run(["true"], base_spec(), stdout=-5, backend="native")


def test_unknown_backend_name() -> None:
    with pytest.raises(ValueError):
        sandbox.run(["true"], Spec(), backend="docker")


@pytest.mark.skipif(os.getuid() == 0, reason="host root may create namespaces without a user namespace")
def test_no_user_namespace_without_privileges_is_a_clone_error(base_spec: BaseSpec) -> None:
    e = setup_error(base_spec(namespaces=Namespaces(user=False)))
    assert e.step == "clone"
    assert e.errno == errno.EPERM
