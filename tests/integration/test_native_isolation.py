"""What a native sandbox sees, checked from inside: filesystem, mounts, pids,
network, identity, environment, cwd, limits and capabilities.

Every test runs real sandboxes with backend="native". Network checks read
/proc/net and talk only to loopback inside the sandbox's own network
namespace; nothing is ever sent to another address.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import sandbox
from sandbox import (
    Bind,
    Chmod,
    Dev,
    DevBind,
    Dir,
    File,
    Limits,
    Namespaces,
    Proc,
    RemountRo,
    RoBind,
    SetupError,
    Spec,
    SpecError,
    Symlink,
    Tmpfs,
)
from sandbox.host import HostInfo
from sandbox.plan import Op, OpKind, compile_plan

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("require_native")]

RunSh = Callable[..., sandbox.CompletedProcess]
BaseSpec = Callable[..., Spec]

PYTHON = "/usr/bin/python3"  # the distribution's python, visible through RoBind("/usr")
needs_python = pytest.mark.skipif(not os.access(PYTHON, os.X_OK), reason=f"{PYTHON} is needed inside the sandbox")
as_root = pytest.mark.skipif(os.getuid() != 0, reason="needs host root")
as_non_root = pytest.mark.skipif(os.getuid() == 0, reason="the kernel exempts host root from this limit")


def ok(result: sandbox.CompletedProcess) -> str:
    """Assert the sandboxed command exited 0; return its stdout."""
    assert result.returncode == 0, f"exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    return result.stdout


@dataclasses.dataclass
class MountEntry:
    """One line of /proc/self/mountinfo."""

    root: str
    point: str
    options: set[str]
    fstype: str


def mountinfo(text: str) -> dict[str, MountEntry]:
    """Parse mountinfo text; the last mount on a point wins (it is the visible one)."""
    out: dict[str, MountEntry] = {}
    for line in text.splitlines():
        left, right = line.split(" - ", 1)
        f = left.split()
        point = f[4].replace("\\040", " ")
        out[point] = MountEntry(root=f[3], point=point, options=set(f[5].split(",")), fstype=right.split()[0])
    return out


def inside_mounts(run_sh: RunSh, spec: Spec) -> dict[str, MountEntry]:
    """The sandbox's own mount table, by mount point."""
    return mountinfo(ok(run_sh("cat /proc/self/mountinfo", spec)))


def stat_modes(run_sh: RunSh, spec: Spec, *paths: str) -> dict[str, int]:
    """{path: permission bits} as seen inside."""
    out = ok(run_sh("stat -c '%a %n' " + " ".join(paths), spec))
    return {line.split(" ", 1)[1]: int(line.split(" ", 1)[0], 8) for line in out.splitlines()}


def host_interfaces() -> set[str]:
    """Interface names in the host's /proc/net/dev."""
    return interfaces(Path("/proc/net/dev").read_text())


def interfaces(net_dev: str) -> set[str]:
    """Interface names in a /proc/net/dev text."""
    return {line.split(":", 1)[0].strip() for line in net_dev.splitlines()[2:] if ":" in line}


# ---------------------------------------------------------------- filesystem


def test_root_holds_only_what_was_declared(run_sh: RunSh) -> None:
    assert set(ok(run_sh("ls -A /")).split()) == {"bin", "dev", "lib", "lib64", "proc", "tmp", "usr"}


@pytest.mark.parametrize("path", ["/home", "/root", "/etc/shadow", "/etc", "/var", "/work", "/opt", "/sys", "/run"])
def test_undeclared_host_paths_do_not_exist(run_sh: RunSh, path: str) -> None:
    result = run_sh(f"test -e {path} || test -L {path}")
    assert result.returncode == 1


def test_ro_bind_is_read_only(run_sh: RunSh, base_spec: BaseSpec, tmp_path: Path) -> None:
    (tmp_path / "f").write_text("host\n")
    result = run_sh("cat /ro/f; echo x > /ro/f; touch /ro/new; mkdir /ro/d; touch /usr/sbx-probe",
                    base_spec(RoBind(str(tmp_path), "/ro")))
    assert result.stdout == "host\n"
    assert result.stderr.count("Read-only file system") == 4, result.stderr
    assert (tmp_path / "f").read_text() == "host\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]
    assert not Path("/usr/sbx-probe").exists()


def test_bind_is_writable_and_writes_land_on_the_host(run_sh: RunSh, base_spec: BaseSpec, tmp_path: Path) -> None:
    (tmp_path / "old").write_text("old\n")
    (tmp_path / "gone").touch()
    spec = base_spec(Bind(str(tmp_path), "/w"))
    ok(run_sh("echo new > /w/new && echo more >> /w/old && mkdir /w/d && rm /w/gone", spec))
    assert (tmp_path / "new").read_text() == "new\n"
    assert (tmp_path / "old").read_text() == "old\nmore\n"
    assert (tmp_path / "d").is_dir()
    assert not (tmp_path / "gone").exists()
    st = (tmp_path / "new").stat()
    assert (st.st_uid, st.st_gid) == (os.getuid(), os.getgid())


def test_tmp_is_private(run_sh: RunSh, no_leftovers: str) -> None:
    host_file = Path("/tmp") / f"sbx-host-{no_leftovers}"
    inside_name = f"sbx-inside-{no_leftovers}"
    host_file.write_text("host")
    try:
        out = ok(run_sh(f"ls -A /tmp; test ! -e {host_file} && echo hidden; echo data > /tmp/{inside_name} && "
                        f"cat /tmp/{inside_name} && ls -A /tmp"))
        assert out == f"hidden\ndata\n{inside_name}\n"  # /tmp started empty
        assert not (Path("/tmp") / inside_name).exists()
        # and a second sandbox gets a fresh one
        assert ok(run_sh("ls -A /tmp")) == ""
    finally:
        host_file.unlink()


def test_a_symlinked_source_binds_its_target(run_sh: RunSh, base_spec: BaseSpec, tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "inside.txt").write_text("real\n")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    spec = base_spec(RoBind(str(tmp_path / "link"), "/x"))
    assert ok(run_sh("test -d /x && test ! -L /x && cat /x/inside.txt", spec)) == "real\n"
    entry = inside_mounts(run_sh, spec)["/x"]
    assert entry.root.endswith("/real")


def test_a_symlinked_file_source_binds_the_file(run_sh: RunSh, base_spec: BaseSpec, tmp_path: Path) -> None:
    (tmp_path / "data").write_text("payload\n")
    (tmp_path / "rel-link").symlink_to("data")
    spec = base_spec(RoBind(str(tmp_path / "rel-link"), "/etc/config"))
    assert ok(run_sh("test -f /etc/config && test ! -L /etc/config && cat /etc/config", spec)) == "payload\n"


def test_missing_parents_are_created_with_bwraps_modes(run_sh: RunSh, base_spec: BaseSpec, tmp_path: Path) -> None:
    # Expected modes measured with bubblewrap 0.8.0 for the same operations.
    spec = base_spec(
        RoBind(str(tmp_path), "/a/b/bound"),
        Tmpfs("/t/u/v"),
        Tmpfs("/pt/u/v", perms=0o700),
        Dir("/d/e/f"),
        Dir("/p/q/r", perms=0o750),
        Dir("/o/q/r", perms=0o701),
        File("/f/g/h", data=b"x"),
        Symlink("x", "/s/l"),
        Proc("/pp/proc"),
    )
    modes = stat_modes(run_sh, spec, "/a", "/a/b", "/t", "/t/u", "/pt", "/pt/u", "/d", "/d/e", "/d/e/f",
                       "/p", "/p/q", "/p/q/r", "/o", "/o/q", "/o/q/r", "/f", "/f/g", "/f/g/h", "/s", "/pp")
    assert modes == {
        "/a": 0o700, "/a/b": 0o700,
        "/t": 0o755, "/t/u": 0o755,
        "/pt": 0o700, "/pt/u": 0o700,
        "/d": 0o755, "/d/e": 0o755, "/d/e/f": 0o755,
        "/p": 0o750, "/p/q": 0o750, "/p/q/r": 0o750,
        "/o": 0o705, "/o/q": 0o705, "/o/q/r": 0o701,
        "/f": 0o755, "/f/g": 0o755, "/f/g/h": 0o666,
        "/s": 0o700,
        "/pp": 0o700,
    }


def test_dir_perms_and_an_existing_dir_keeps_its_mode(run_sh: RunSh, base_spec: BaseSpec) -> None:
    spec = base_spec(Dir("/sticky", perms=0o1777), Dir("/priv", perms=0o700), Dir("/usr/share", perms=0o700))
    assert stat_modes(run_sh, spec, "/sticky", "/priv", "/usr/share") == {
        "/sticky": 0o1777, "/priv": 0o700, "/usr/share": os.stat("/usr/share").st_mode & 0o7777}


def test_file_contents_perms_and_readonly(run_sh: RunSh, base_spec: BaseSpec) -> None:
    data = bytes(range(256)) * 3
    spec = base_spec(File("/etc/blob", data=data, perms=0o640), File("/etc/ro", data=b"fixed\n", readonly=True),
                     File("/etc/empty"))
    result = run_sh("od -An -v -tx1 /etc/blob | tr -d ' \\n'; echo; stat -c '%a %s' /etc/blob /etc/ro /etc/empty; "
                    "echo changed > /etc/blob && echo blob-writable; echo changed > /etc/ro; cat /etc/ro", spec)
    lines = result.stdout.splitlines()
    assert lines[0] == data.hex()
    assert lines[1:4] == ["640 768", "666 6", "666 0"]
    assert lines[4] == "blob-writable"
    assert lines[5] == "fixed"
    assert "Read-only file system" in result.stderr


def test_chmod(run_sh: RunSh, base_spec: BaseSpec) -> None:
    spec = base_spec(Dir("/t/d"), File("/t/f", data=b"#!/bin/sh\necho ran\n", perms=0o600),
                     Chmod("/t/d", 0o711), Chmod("/t/f", 0o755), Chmod("/tmp", 0o1777))
    assert stat_modes(run_sh, spec, "/t/d", "/t/f", "/tmp") == {"/t/d": 0o711, "/t/f": 0o755, "/tmp": 0o1777}
    assert ok(run_sh("/t/f", spec)) == "ran\n"


def test_chmod_of_a_read_only_bind_fails(base_spec: BaseSpec, run_sh: RunSh) -> None:
    with pytest.raises(SetupError) as info:
        run_sh("true", base_spec(Chmod("/usr", 0o700)))
    assert (info.value.step, info.value.path, info.value.errno) == ("chmod", "/usr", errno.EROFS)


def test_remount_ro(run_sh: RunSh, base_spec: BaseSpec, tmp_path: Path) -> None:
    spec = base_spec(Bind(str(tmp_path), "/w"), Tmpfs("/scratch"), RemountRo("/w"), RemountRo("/scratch"))
    result = run_sh("touch /w/x; touch /scratch/x; touch /tmp/x && echo tmp-ok", spec)
    assert result.stdout == "tmp-ok\n"
    assert result.stderr.count("Read-only file system") == 2
    mounts = inside_mounts(run_sh, spec)
    assert "ro" in mounts["/w"].options and "ro" in mounts["/scratch"].options
    assert "rw" in mounts["/tmp"].options
    # the host's view of the directory is not affected
    (tmp_path / "host-write").write_text("fine")


def test_the_callers_umask_reaches_the_command(run_sh: RunSh) -> None:
    # setup runs with umask 0 (modes are exact); the command gets the caller's.
    old = os.umask(0o027)
    try:
        out = ok(run_sh("umask; touch /tmp/f; mkdir /tmp/d; stat -c '%a' /tmp/f /tmp/d"))
    finally:
        os.umask(old)
    assert out.split() == ["0027", "640", "750"]


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


def test_tmpfs_size_and_perms(run_sh: RunSh, base_spec: BaseSpec) -> None:
    spec = base_spec(Tmpfs("/t", size=1 << 20, perms=0o700))
    out = ok(run_sh("stat -c %a /t; df -k /t | tail -1; dd if=/dev/zero of=/t/big bs=64k count=32 2>/dev/null; "
                    "echo dd=$?; stat -c %s /t/big", spec))
    mode, df, dd, size = out.splitlines()
    assert mode == "700"
    assert df.split()[1] == "1024"  # 1 MiB in 1K blocks
    assert dd != "dd=0"  # ENOSPC
    assert int(size) <= 1 << 20


@needs_python
@pytest.mark.parametrize("ids", [{}, {"uid": 1000, "gid": 1000}, {"uid": 0, "gid": 0}], ids=["caller", "1000", "0"])
def test_dev_is_usable(run_sh: RunSh, base_spec: BaseSpec, ids: dict[str, int]) -> None:
    spec = base_spec(**ids)
    out = ok(run_sh("echo x > /dev/null && head -c 5 /dev/urandom | wc -c && head -c 3 /dev/zero | od -An -tx1 && "
                    "echo shm > /dev/shm/f && cat /dev/shm/f && readlink /dev/fd /dev/stdin /dev/ptmx", spec))
    assert out.split() == ["5", "00", "00", "00", "shm", "/proc/self/fd", "/proc/self/fd/0", "pts/ptmx"]
    assert run_sh("echo z > /dev/full", spec).returncode != 0  # ENOSPC
    code = "import os; m, s = os.openpty(); print(os.ttyname(s)); os.write(s, b'hi\\n'); print(os.read(m, 10))"
    assert ok(run_sh(f'{PYTHON} -c "{code}"', spec)).splitlines() == ["/dev/pts/0", "b'hi\\r\\n'"]


# ---------------------------------------------------------------- mount flags


def test_mount_flags_in_mountinfo(run_sh: RunSh, base_spec: BaseSpec, tmp_path: Path) -> None:
    for name in ("ro", "rw", "dev", "tmp", "rort"):
        (tmp_path / name).mkdir()
    spec = base_spec(
        RoBind(str(tmp_path / "ro"), "/m/ro"),
        Bind(str(tmp_path / "rw"), "/m/rw"),
        DevBind(str(tmp_path / "dev"), "/m/dev"),
        Tmpfs("/m/tmp"),
        Tmpfs("/m/rotmp"),
        RemountRo("/m/rotmp"),
        Bind(str(tmp_path / "rort"), "/m/rort"),
        RemountRo("/m/rort"),
    )
    m = inside_mounts(run_sh, spec)
    assert {"ro", "nosuid", "nodev"} <= m["/m/ro"].options
    assert {"rw", "nosuid", "nodev"} <= m["/m/rw"].options
    assert {"rw", "nosuid"} <= m["/m/dev"].options and "nodev" not in m["/m/dev"].options
    assert {"rw", "nosuid", "nodev"} <= m["/m/tmp"].options and m["/m/tmp"].fstype == "tmpfs"
    assert {"ro", "nosuid", "nodev"} <= m["/m/rotmp"].options
    assert {"ro", "nosuid", "nodev"} <= m["/m/rort"].options
    assert {"ro", "nosuid", "nodev"} <= m["/usr"].options
    assert {"nosuid", "nodev", "noexec"} <= m["/proc"].options and m["/proc"].fstype == "proc"
    for knob in ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus"):
        if os.path.exists(knob):  # the kernel-reconfiguring parts of procfs are read-only
            assert "ro" in m[knob].options, knob
    assert {"nosuid", "nodev"} <= m["/"].options and m["/"].fstype == "tmpfs"
    assert "nodev" not in m["/dev/null"].options
    assert m["/dev/pts"].fstype == "devpts"


def host_submount(parent: str) -> str | None:
    """A mount point strictly below `parent` on the host that is writable by us, or None."""
    for entry in mountinfo(Path("/proc/self/mountinfo").read_text()).values():
        point = entry.point
        if point.startswith(parent.rstrip("/") + "/") and "rw" in entry.options and os.access(point, os.W_OK):
            return point
    return None


def test_read_only_reaches_submounts(run_sh: RunSh, base_spec: BaseSpec) -> None:
    sub = host_submount("/dev")  # typically /dev/shm: a writable tmpfs below /dev
    if sub is None:
        pytest.skip("no writable host mount below /dev")
    inner = "/hostdev" + sub[len("/dev"):]
    spec = base_spec(RoBind("/dev", "/hostdev"))
    result = run_sh(f"touch {inner}/sbx-probe-$$", spec)
    assert result.returncode != 0
    assert "Read-only file system" in result.stderr
    m = inside_mounts(run_sh, spec)
    below = [e for p, e in m.items() if p == "/hostdev" or p.startswith("/hostdev/")]
    assert len(below) >= 2 and inner in m
    for entry in below:
        assert {"ro", "nosuid", "nodev"} <= entry.options, entry


def test_read_only_root_bind_covers_every_host_mount(run_sh: RunSh, base_spec: BaseSpec) -> None:
    spec = base_spec(RoBind("/", "/host"))
    m = inside_mounts(run_sh, spec)
    below = [e for p, e in m.items() if p == "/host" or p.startswith("/host/")]
    host_count = len(mountinfo(Path("/proc/self/mountinfo").read_text()))
    assert len(below) >= min(host_count, 3)
    assert all("ro" in e.options for e in below), [e for e in below if "ro" not in e.options]
    assert run_sh("touch /host/tmp/sbx-probe", spec).returncode != 0


def test_bind_keeps_submounts_visible(run_sh: RunSh, base_spec: BaseSpec) -> None:
    # Binds are recursive (bwrap's --bind is rbind): the host's /proc below / stays visible.
    out = ok(run_sh("cat /host/proc/self/stat >/dev/null && echo proc-visible", base_spec(RoBind("/", "/host"))))
    assert out == "proc-visible\n"


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

    plan = compile_plan(spec, HostInfo.current())
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


# ---------------------------------------------------------------- pid namespace


def test_command_is_pid_2_under_the_reaper(run_sh: RunSh) -> None:
    out = ok(run_sh("echo $$; tr '\\0' ' ' < /proc/1/cmdline; echo; echo /proc/[0-9]*"))
    pid, init_cmdline, pids = out.splitlines()
    assert pid == "2"
    assert init_cmdline.startswith("sandbox-init ")
    assert pids == "/proc/1 /proc/2"  # the reaper and sh (the glob is expanded by sh itself)


def test_as_pid_1(run_sh: RunSh, base_spec: BaseSpec) -> None:
    out = ok(run_sh("echo $$; tr '\\0' ' ' < /proc/1/cmdline", base_spec(as_pid_1=True)))
    pid, cmdline = out.splitlines()
    assert pid == "1"
    assert cmdline.startswith("sh -c ")


def test_without_a_pid_namespace_proc_is_the_hosts(run_sh: RunSh, base_spec: BaseSpec) -> None:
    spec = base_spec(namespaces=Namespaces(pid=False))
    out = ok(run_sh("cat /proc/1/cmdline; echo; echo $$", spec))
    init, pid = out.rsplit("\n", 2)[0], out.splitlines()[-1]
    assert init.encode() == Path("/proc/1/cmdline").read_bytes()
    assert int(pid) > 2


@pytest.mark.parametrize("ns", ["user", "mnt", "pid", "net", "ipc", "uts", "cgroup"])
def test_namespaces_are_new(run_sh: RunSh, ns: str) -> None:
    inside = ok(run_sh(f"readlink /proc/self/ns/{ns}")).strip()
    assert inside.startswith(f"{ns}:[")
    assert inside != os.readlink(f"/proc/self/ns/{ns}")


@pytest.mark.parametrize("ns", ["ipc", "uts", "cgroup"])
def test_namespaces_can_be_shared(run_sh: RunSh, base_spec: BaseSpec, ns: str) -> None:
    field = {"ipc": "ipc", "uts": "uts", "cgroup": "cgroup"}[ns]
    spec = base_spec(namespaces=Namespaces(**{field: False}))
    assert ok(run_sh(f"readlink /proc/self/ns/{ns}", spec)).strip() == os.readlink(f"/proc/self/ns/{ns}")


# ---------------------------------------------------------------- network


def test_only_loopback_exists(run_sh: RunSh) -> None:
    out = ok(run_sh("cat /proc/net/dev"))
    assert interfaces(out) == {"lo"}


def test_no_route_leads_out(run_sh: RunSh) -> None:
    out = ok(run_sh("cat /proc/net/route; echo ===; cat /proc/net/ipv6_route; echo ===; cat /proc/net/if_inet6"))
    route, ipv6_route, if_inet6 = out.split("===\n")
    assert route.splitlines()[1:] == []  # the IPv4 main table is empty
    six = [line.split() for line in ipv6_route.splitlines()]
    assert six and all(fields[-1] == "lo" for fields in six)
    addrs = [line.split() for line in if_inet6.splitlines()]
    assert [(a[0], a[-1]) for a in addrs] == [("00000000000000000000000000000001", "lo")]


@needs_python
def test_loopback_is_up_with_both_addresses(run_sh: RunSh) -> None:
    # Talks to itself over 127.0.0.1 and ::1 inside the sandbox's own network
    # namespace; a UDP connect() only looks up a route (it sends nothing).
    script = r"""
import errno, fcntl, socket, struct
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, struct.pack("16sH", b"lo", 0)))[1]
addr = socket.inet_ntoa(fcntl.ioctl(s, 0x8915, struct.pack("16sH14s", b"lo", socket.AF_INET, b""))[20:24])
print("up" if flags & 1 else "down", addr)
for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
    srv = socket.socket(family, socket.SOCK_STREAM)
    srv.bind((host, 0)); srv.listen(1)
    cli = socket.create_connection(srv.getsockname()[:2], timeout=5)
    conn, _ = srv.accept(); cli.sendall(b"ping"); print(host, conn.recv(4).decode())
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    u.connect(("192.0.2.1", 9))
    print("route-found")
except OSError as e:
    print(errno.errorcode[e.errno])
"""
    out = ok(run_sh(f"{PYTHON} -c '{script}'"))
    assert out.splitlines() == ["up 127.0.0.1", "127.0.0.1 ping", "::1 ping", "ENETUNREACH"]


def test_host_network_shows_the_host_interfaces(run_sh: RunSh, base_spec: BaseSpec) -> None:
    out = ok(run_sh("readlink /proc/self/ns/net; cat /proc/net/dev", base_spec(network="host")))
    ns, net_dev = out.split("\n", 1)
    assert interfaces(net_dev) == host_interfaces()
    assert ns == os.readlink("/proc/self/ns/net")


# ---------------------------------------------------------------- identity


def test_hostname(run_sh: RunSh, base_spec: BaseSpec) -> None:
    assert ok(run_sh("cat /proc/sys/kernel/hostname", base_spec(hostname="sbx-box"))) == "sbx-box\n"
    assert ok(run_sh("cat /proc/sys/kernel/hostname")) == os.uname().nodename + "\n"
    assert os.uname().nodename != "sbx-box"


def id_map(text: str) -> list[tuple[int, int, int]]:
    """Parse a uid_map/gid_map text."""
    return [(int(a), int(b), int(c)) for a, b, c in (line.split() for line in text.splitlines())]


def test_default_identity_is_the_callers(run_sh: RunSh, base_spec: BaseSpec) -> None:
    spec = base_spec(mounts=(RoBind("/usr"), Symlink("usr/bin", "/bin"), Symlink("usr/lib", "/lib"),
                             Symlink("usr/lib64", "/lib64"), Proc()))
    out = ok(run_sh("id -u; id -g; id -G; cat /proc/self/uid_map; echo ==; cat /proc/self/gid_map; echo ==; "
                    "cat /proc/self/setgroups", spec))
    ids, rest = out.split("\n", 3)[:3], out.split("\n", 3)[3]
    uid_map, gid_map, setgroups = rest.split("==\n")
    assert ids == [str(os.getuid()), str(os.getgid()), str(os.getgid())]
    assert id_map(uid_map) == [(os.getuid(), os.getuid(), 1)]
    assert id_map(gid_map) == [(os.getgid(), os.getgid(), 1)]
    assert setgroups.strip() == "deny"


@pytest.mark.parametrize("with_dev", [False, True], ids=["direct", "nested-userns"])
def test_declared_uid_and_gid(run_sh: RunSh, base_spec: BaseSpec, with_dev: bool) -> None:
    mounts = (RoBind("/usr"), Symlink("usr/bin", "/bin"), Symlink("usr/lib", "/lib"), Symlink("usr/lib64", "/lib64"),
              Proc(), *([Dev()] if with_dev else []), Tmpfs("/tmp"))
    spec = base_spec(mounts=mounts, uid=1000, gid=1000)
    out = ok(run_sh("id -u; id -g; id -G; cat /proc/self/uid_map /proc/self/gid_map /proc/self/setgroups; "
                    "touch /tmp/f; stat -c '%u %g' /tmp/f", spec))
    lines = out.splitlines()
    assert lines[:3] == ["1000", "1000", "1000"]
    uid_map, gid_map = id_map(lines[3]), id_map(lines[4])
    if with_dev:
        # setup ran as 0 (devpts needs it); the command lives in a nested
        # user namespace whose only ids map onto that 0
        assert uid_map == [(1000, 0, 1)] and gid_map == [(1000, 0, 1)]
    else:
        assert uid_map == [(1000, os.getuid(), 1)] and gid_map == [(1000, os.getgid(), 1)]
    assert lines[5] == "deny"
    assert lines[6] == "1000 1000"


def test_root_inside(run_sh: RunSh, base_spec: BaseSpec) -> None:
    out = ok(run_sh("id -u; id -g; cat /proc/self/uid_map", base_spec(uid=0, gid=0)))
    lines = out.splitlines()
    assert lines[:2] == ["0", "0"]
    assert id_map(lines[2]) == [(0, os.getuid(), 1)]


def test_files_written_as_another_uid_belong_to_the_caller(run_sh: RunSh, base_spec: BaseSpec,
                                                           tmp_path: Path) -> None:
    ok(run_sh("touch /w/f", base_spec(Bind(str(tmp_path), "/w"), uid=1234, gid=4321)))
    st = (tmp_path / "f").stat()
    assert (st.st_uid, st.st_gid) == (os.getuid(), os.getgid())


# ---------------------------------------------------------------- environment


def environ_inside(spec: Spec) -> dict[str, str]:
    """The command's environment, read from /proc/self/environ by `cat` run directly (no shell)."""
    r = sandbox.run(["cat", "/proc/self/environ"], spec, capture_output=True, backend="native", timeout=60)
    assert r.returncode == 0, r.stderr
    items = [item for item in r.stdout.split(b"\0") if item]
    return dict(item.decode().split("=", 1) for item in items)


def test_environment_is_exactly_the_declared_one(base_spec: BaseSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SBX_SECRET", "must-not-leak")
    env = {"PATH": "/usr/bin", "A": "1", "EMPTY": "", "SPACES": "a b  c", "UNICODE": "héllo"}
    assert environ_inside(base_spec(env=env)) == env


def test_empty_environment(base_spec: BaseSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SBX_SECRET", "must-not-leak")
    assert environ_inside(base_spec(env={})) == {}


def test_env_inherit_patterns(base_spec: BaseSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LC_SBXTEST_ONE", "one")
    monkeypatch.setenv("LC_SBXTEST_TWO", "two")
    monkeypatch.setenv("SBXTEST_LC_NO", "no")
    monkeypatch.setenv("lc_sbxtest_lower", "no")
    spec = base_spec(env={"PATH": "/usr/bin", "LC_SBXTEST_TWO": "explicit"}, env_inherit=["LC_SBXTEST_*"])
    env = environ_inside(spec)
    assert env == {"PATH": "/usr/bin", "LC_SBXTEST_ONE": "one", "LC_SBXTEST_TWO": "explicit"}


# ---------------------------------------------------------------- cwd


def test_given_cwd(run_sh: RunSh, base_spec: BaseSpec) -> None:
    assert ok(run_sh("pwd", base_spec(cwd="/usr/share"))) == "/usr/share\n"
    assert ok(run_sh("pwd", base_spec(Dir("/made/here"), cwd="/made/here"))) == "/made/here\n"


def test_default_cwd_is_the_callers_when_it_exists_inside(run_sh: RunSh, base_spec: BaseSpec, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "marker").write_text("here\n")
    monkeypatch.chdir(tmp_path)
    out = ok(run_sh("pwd; cat marker", base_spec(RoBind(str(tmp_path)))))
    assert out == f"{tmp_path}\nhere\n"


def test_default_cwd_falls_back_to_home_then_root(run_sh: RunSh, base_spec: BaseSpec, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # below /tmp: hidden by the sandbox's own /tmp
    assert ok(run_sh("pwd", base_spec(env={"PATH": "/usr/bin", "HOME": "/usr/lib"}))) == "/usr/lib\n"
    monkeypatch.setenv("HOME", "/usr/share")  # the caller's HOME does not count: only the command's
    assert ok(run_sh("pwd")) == "/\n"
    assert ok(run_sh("pwd", base_spec(env={"PATH": "/usr/bin", "HOME": "/nonexistent-home"}))) == "/\n"


# ---------------------------------------------------------------- limits


def test_limits_are_visible_in_proc(run_sh: RunSh, base_spec: BaseSpec) -> None:
    spec = base_spec(limits=Limits(cpu_s=30, memory_mb=2048, file_mb=3, nofile=50, nproc=200))
    out = ok(run_sh("cat /proc/self/limits", spec))
    rows = {line[:26].strip(): line[26:].split()[:2] for line in out.splitlines()[1:]}
    hard = {res: resource.getrlimit(res)[1] for res in (resource.RLIMIT_NOFILE, resource.RLIMIT_NPROC)}

    def capped(value: int, res: int) -> str:
        h = hard[res]
        return str(value if h == resource.RLIM_INFINITY else min(value, h))

    assert rows["Max cpu time"] == ["30", "30"]
    assert rows["Max address space"] == [str(2048 << 20)] * 2
    assert rows["Max file size"] == [str(3 << 20)] * 2
    assert rows["Max open files"] == [capped(50, resource.RLIMIT_NOFILE)] * 2
    assert rows["Max processes"] == [capped(200, resource.RLIMIT_NPROC)] * 2


def test_file_size_limit_cuts_a_write(run_sh: RunSh, base_spec: BaseSpec) -> None:
    result = run_sh("dd if=/dev/zero of=/tmp/big bs=1M count=2 2>/dev/null; echo dd=$?; stat -c %s /tmp/big",
                    base_spec(limits=Limits(file_mb=1)))
    lines = result.stdout.splitlines()
    assert lines[0] != "dd=0"  # killed by SIGXFSZ (or failed with EFBIG)
    assert int(lines[1]) == 1 << 20


def test_without_a_file_size_limit_the_write_succeeds(run_sh: RunSh) -> None:
    out = ok(run_sh("dd if=/dev/zero of=/tmp/big bs=1M count=2 2>/dev/null; echo dd=$?; stat -c %s /tmp/big"))
    assert out.splitlines() == ["dd=0", str(2 << 20)]


@needs_python
def test_address_space_limit_fails_a_large_allocation(run_sh: RunSh, base_spec: BaseSpec) -> None:
    code = f"{PYTHON} -c 'b = bytearray(512 << 20); print(len(b))'"
    assert ok(run_sh(code)) == f"{512 << 20}\n"
    result = run_sh(code, base_spec(limits=Limits(memory_mb=256)))
    assert result.returncode == 1
    assert "MemoryError" in result.stderr


@needs_python
def test_nofile_limit(run_sh: RunSh, base_spec: BaseSpec) -> None:
    code = (f"{PYTHON} -c 'import os\nfds = []\ntry:\n    while True: fds.append(os.open(\"/dev/null\", 0))\n"
            "except OSError as e: print(e.errno, max(fds))'")
    out = ok(run_sh(code, base_spec(limits=Limits(nofile=16))))
    err, highest = out.split()
    assert int(err) == errno.EMFILE
    assert int(highest) == 15


@as_non_root
def test_nproc_limit(run_sh: RunSh, base_spec: BaseSpec, no_leftovers: str) -> None:
    script = f"n=0; for i in 1 2 3 4 5 6 7 8; do sleep 1000 {no_leftovers} 2>/dev/null & n=$((n+1)); done; echo $n"
    result = run_sh(script, base_spec(limits=Limits(nproc=4)))
    assert result.returncode != 0 or "fork" in result.stderr.lower(), (result.stdout, result.stderr)
    assert "fork" in result.stderr.lower()


def test_cpu_limit_kills_a_busy_loop(run_sh: RunSh, base_spec: BaseSpec) -> None:
    result = run_sh("while :; do :; done", base_spec(limits=Limits(cpu_s=1)), timeout=30)
    assert result.returncode in (-24, -9)  # SIGXCPU at the soft limit (SIGKILL past the hard one)


# ---------------------------------------------------------------- privileges


def status_fields(text: str) -> dict[str, str]:
    """`Name: value` pairs of a /proc/PID/status text."""
    return {k: v.strip() for k, v in (line.split(":", 1) for line in text.splitlines() if ":" in line)}


def test_no_new_privs_and_no_capabilities(run_sh: RunSh) -> None:
    st = status_fields(ok(run_sh("cat /proc/self/status")))
    assert st["NoNewPrivs"] == "1"
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert st[cap] == "0000000000000000", cap


def test_root_inside_has_no_capabilities(run_sh: RunSh, base_spec: BaseSpec) -> None:
    st = status_fields(ok(run_sh("cat /proc/self/status", base_spec(uid=0, gid=0))))
    assert (st["Uid"].split()[0], st["CapEff"], st["CapBnd"]) == ("0", "0000000000000000", "0000000000000000")


@as_root
def test_host_root_without_a_user_namespace_drops_capabilities(run_sh: RunSh, base_spec: BaseSpec) -> None:
    st = status_fields(ok(run_sh("cat /proc/self/status", base_spec(namespaces=Namespaces(user=False)))))
    assert st["Uid"].split()[0] == "0"
    assert st["CapEff"] == st["CapBnd"] == st["CapPrm"] == "0000000000000000"
    assert st["NoNewPrivs"] == "1"


@pytest.mark.parametrize("uid", [0, 1000])
def test_cap_add_keeps_exactly_that_capability(run_sh: RunSh, base_spec: BaseSpec, uid: int) -> None:
    st = status_fields(ok(run_sh("cat /proc/self/status", base_spec(uid=uid, gid=uid,
                                                                    cap_add=["CAP_NET_BIND_SERVICE"]))))
    bit = f"{1 << 10:016x}"
    assert (st["CapEff"], st["CapPrm"], st["CapBnd"]) == (bit, bit, bit)
    assert st["CapAmb"] == (bit if uid else st["CapAmb"])
    assert st["NoNewPrivs"] == "1"


BIND_PORT_80 = (f"{PYTHON} -c 'import socket\ns = socket.socket()\ntry:\n"
                "    s.bind((\"127.0.0.1\", 80)); print(\"bound\")\nexcept PermissionError: print(\"denied\")'")
NO_DEV_MOUNTS = (RoBind("/usr"), Symlink("usr/bin", "/bin"), Symlink("usr/lib", "/lib"), Symlink("usr/lib64", "/lib64"),
                 Proc(), Tmpfs("/tmp"))


@needs_python
@pytest.mark.parametrize("uid", [0, 1000])
def test_cap_net_bind_service_works_only_when_added(run_sh: RunSh, base_spec: BaseSpec, uid: int) -> None:
    # Binds port 80 on 127.0.0.1 inside the sandbox's own network namespace.
    # No /dev: with uid != 0 a Dev mount moves the command into a nested user
    # namespace (see the next test).
    assert ok(run_sh(BIND_PORT_80, base_spec(mounts=NO_DEV_MOUNTS, uid=uid, gid=uid))) == "denied\n"
    spec = base_spec(mounts=NO_DEV_MOUNTS, uid=uid, gid=uid, cap_add=["CAP_NET_BIND_SERVICE"])
    assert ok(run_sh(BIND_PORT_80, spec)) == "bound\n"


@needs_python
def test_nested_userns_caps_do_not_reach_the_sandbox_network(run_sh: RunSh, base_spec: BaseSpec) -> None:
    # With Dev and uid != 0 the command runs in a nested user namespace that
    # does not own the network namespace, so a kept network capability holds
    # nothing there (bubblewrap 0.8 behaves the same: --dev --uid 1000 --cap-add).
    spec = base_spec(uid=1000, gid=1000, cap_add=["CAP_NET_BIND_SERVICE"])
    assert ok(run_sh(BIND_PORT_80, spec)) == "denied\n"
