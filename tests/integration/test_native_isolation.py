"""Native-only mechanics of building the sandbox's filesystem: more binds
than the soft fd limit, and destinations resolved inside the new root, so a
symlink planted in a writable bind (or made by an earlier operation) cannot
send a later operation out to the host.

What a sandbox looks like from inside, on either backend, is the conformance
suite's job (tests/conformance). bwrap resolves destinations differently
(docs/backends.md: bubblewrap #195), so these checks are the native path's.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import sandbox
from sandbox import Bind, Chmod, Dir, File, RoBind, SetupError, Spec, SpecError, Symlink, Tmpfs
from sandbox.host import HostInfo
from sandbox.plan import Op, OpKind, compile_plan

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("require_native")]

RunSh = Callable[..., sandbox.CompletedProcess]
BaseSpec = Callable[..., Spec]


# ---------------------------------------------------------------- many binds


MANY_BINDS = r"""
import resource, sys
import sandbox
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))  # the usual default soft limit
spec = sandbox.Spec.from_json(sys.argv[1])
extra = tuple(sandbox.RoBind("/usr/bin/true", f"/b/{i}") for i in range(int(sys.argv[2])))
r = sandbox.run(["sh", "-c", "ls /b | wc -l"], spec.replace(mounts=spec.mounts + extra), capture_output=True,
                backend="native", timeout=60)
print(r.stdout.decode().strip())
"""


def test_more_binds_than_the_soft_fd_limit(base_spec: BaseSpec) -> None:
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 1024:
        pytest.skip("hard RLIMIT_NOFILE below 1024")
    r = subprocess.run([sys.executable, "-c", MANY_BINDS, base_spec().to_json(), "1100"], capture_output=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert r.stdout.decode().strip() == "1100"


# ---------------------------------------------------------------- destination symlink escapes


def host_root_link(start: Path) -> str:
    """A relative link target that climbs from directory `start` to the host's /."""
    return "../" * (len(start.resolve().parts) + 1)


ESCAPE_LINKS = ["absolute-root", "relative-root", "absolute-outside"]


@pytest.mark.parametrize("kind", ["dir", "file", "deep-dir", "tmpfs"])
@pytest.mark.parametrize("link", ESCAPE_LINKS)
def test_destination_symlinks_in_a_writable_bind_cannot_escape(run_sh: RunSh, base_spec: BaseSpec, tmp_path: Path,
                                                                no_leftovers: str, link: str, kind: str) -> None:
    """bwrap's CVE-2026-87766 lesson: a destination is resolved inside the new
    root, so a symlink planted in a writable bind cannot send a later
    operation out to the host."""
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    (work / "absolute-root").symlink_to("/")
    (work / "relative-root").symlink_to(host_root_link(work))
    (work / "absolute-outside").symlink_to(outside)
    name = f"sbx-pwned-{no_leftovers}"
    dest = f"/work/{link}/{name}" if kind != "deep-dir" else f"/work/{link}/{name}-a/b/{name}"
    op = {"dir": Dir(dest), "deep-dir": Dir(dest), "file": File(dest, data=b"owned"), "tmpfs": Tmpfs(dest)}[kind]
    try:
        result: sandbox.CompletedProcess | None = run_sh(f"ls -d /{name} /{name}-a/b/{name} 2>/dev/null",
                                                         base_spec(Bind(str(work), "/work"), op))
    except SetupError:
        result = None  # refusing is fine too
    leaked = [p for p in (Path("/") / name, Path("/") / f"{name}-a") if os.path.lexists(p)]
    for p in leaked:  # do not leave them behind, then fail
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    assert leaked == []
    assert list(outside.iterdir()) == []
    assert sorted(p.name for p in work.iterdir()) == sorted(ESCAPE_LINKS)
    if result is not None and link != "absolute-outside":
        # it landed in the sandbox's own root, as if that were /
        assert result.stdout.strip() in (f"/{name}", f"/{name}-a/b/{name}")


@pytest.mark.parametrize("op", ["file", "chmod", "bind"])
def test_a_final_symlink_in_a_writable_bind_does_not_reach_its_host_target(
        run_sh: RunSh, base_spec: BaseSpec, tmp_path: Path, op: str) -> None:
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    victim = outside / "victim"
    victim.write_text("original\n")
    victim.chmod(0o600)
    (work / "abs").symlink_to(victim)
    (work / "rel").symlink_to("../outside/victim")
    for link in ("abs", "rel"):
        dest = f"/work/{link}"
        extra = {"file": File(dest, data=b"owned\n"), "chmod": Chmod(dest, 0o777),
                 "bind": RoBind("/usr/bin/true", dest)}[op]
        try:
            run_sh("true", base_spec(Bind(str(work), "/work"), extra))
        except SetupError as exc:
            assert exc.path == dest
        assert victim.read_text() == "original\n"
        assert victim.stat().st_mode & 0o7777 == 0o600
        assert (work / link).is_symlink()


def test_links_in_a_bound_dir_cannot_redirect_file_ops(base_spec: BaseSpec, run_sh: RunSh,
                                                       tmp_path: Path, no_leftovers: str) -> None:
    src, outside = tmp_path / "src", tmp_path / "outside"
    src.mkdir()
    outside.mkdir()
    (src / "abs").symlink_to(outside)
    (src / "rel").symlink_to("../outside")
    for link in ("abs", "rel"):
        try:
            run_sh("true", base_spec(Bind(str(src), "/x"), File(f"/x/{link}/{no_leftovers}", data=b"x")))
        except SetupError as exc:
            assert exc.path == f"/x/{link}/{no_leftovers}"
        assert list(outside.iterdir()) == []


def spawn_plan_unchecked(spec: Spec, extra_ops: tuple[Op, ...], argv: list[str]) -> int:
    """Run `argv` under `spec`'s plan plus `extra_ops` that the Spec check would
    refuse (the C core must hold on its own); return the command's exit status.
    SetupError propagates."""
    from sandbox.backends import native

    plan = compile_plan(spec, HostInfo.current(native.TRAITS))
    plan = dataclasses.replace(plan, ops=plan.ops + extra_ops)
    proc = sandbox.SandboxProcess(argv, native.launch(plan, argv, (-1, -1, -1), ()), backend="native")
    return proc.wait(timeout=30)


@pytest.mark.parametrize("target", ["outside", "/etc", "../../../../../../../../../../etc"])
def test_symlink_op_then_file_below_it_stays_inside(base_spec: BaseSpec, tmp_path: Path, no_leftovers: str,
                                                    target: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    link_target = str(outside) if target == "outside" else target
    name = f"sbx-pwned-{no_leftovers}"
    # The Spec refuses a File below a Symlink outright ...
    with pytest.raises(SpecError):
        base_spec(Tmpfs("/x"), Symlink(link_target, "/x/link"), File(f"/x/link/{name}", data=b"x"))
    # ... and the C core, handed such a plan anyway, stays inside the new root.
    spec = base_spec(Tmpfs("/x"), Symlink(link_target, "/x/link"))
    op = Op(OpKind.FILE, f"/x/link/{name}", data=b"owned", mode=0o644, parent_mode=0o755)
    host_file = Path("/etc" if target != "outside" else outside) / name
    try:
        try:
            assert spawn_plan_unchecked(spec, (op,), ["true"]) == 0
        except SetupError as exc:
            assert exc.path == f"/x/link/{name}"
        assert not host_file.exists()
        assert list(outside.iterdir()) == []
    finally:
        if host_file.exists():
            host_file.unlink()
