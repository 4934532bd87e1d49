"""A Spec started inside a task sandbox becomes a task description (sandbox.backends.brokered.description),
or is refused by name."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from sandbox import Bind, DevBind, File, Proc, RoBind, Spec, SpecError, Tmpfs
from sandbox.backends.brokered.description import description_of
from sandbox.mounts import Chmod, Dev, Dir, Mount, Mqueue, Overlay, RemountRo, Symlink
from sandbox.presets import system_mounts
from sandbox.spec import Limits, Namespaces


def test_binds_network_env_limits_probes_and_forwards_carry_over() -> None:
    spec = Spec(mounts=[*system_mounts(), Proc(), Tmpfs("/tmp"), RoBind("/etc/hosts"), RoBind(sys.prefix),
                        RoBind("/data"), Bind("/runs/1"), RoBind("/runs/2", "/w"), RoBind("/missing/x", optional=True)],
                network="none", env={"A": "1"}, env_inherit=["MWM_*"], cwd="/runs/1",
                limits=Limits(memory_mb=64, cpu_s=5), probe_paths=["/root/.ssh"], forward={8080: 8080, 9000: "/s"})
    sb = description_of(spec)
    assert sb.read == ("/data",) and sb.write == ("/runs/1",)  # /usr, its links, /etc files, the interpreter: given
    assert [(b.source, b.target, b.writable) for b in sb.binds] == [("/runs/2", "/w", False)]
    assert sb.network == "isolated" and sb.env_dict == {"A": "1"} and sb.env_allow == ("MWM_*",)
    assert sb.chdir == "/runs/1" and sb.limits.memory_mb == 64 and sb.limits.cpu_s == 5
    assert sb.probes == ("/root/.ssh",) and sb.ports == (8080,) and sb.sockets == ((9000, "/s"),)
    assert description_of(Spec(network="host")).network == "open"


@pytest.mark.parametrize(("spec", "field"), [
    (Spec(seccomp=None), "seccomp"),
    (Spec(cap_add=["CAP_NET_RAW"]), "cap_add"),
    (Spec(uid=0), "uid"),
    (Spec(hostname="h"), "hostname"),
    (Spec(namespaces=Namespaces(pid=False)), "namespaces"),
    (Spec(as_pid_1=True), "as_pid_1"),
    (Spec(landlock=True), "landlock"),
    (Spec(limits=Limits(nproc=10)), "limits.nproc"),
    (Spec(mounts=[DevBind("/dev/kvm")]), "mounts[0]"),
    (Spec(mounts=[File("/x", b"data")]), "mounts[0]"),
])
def test_what_a_description_cannot_express_is_refused_by_name(spec: Spec, field: str) -> None:
    with pytest.raises(SpecError) as info:
        description_of(spec)
    assert info.value.field == field


@pytest.mark.parametrize("mount", [
    Tmpfs("/scratch"), Tmpfs("/tmp/inner"), Proc("/view/proc"), Dev("/hostdev"), Dir("/made"),
    Symlink("/usr/bin", "/tools"), Symlink("usr/bin", "/usrbin"), RemountRo("/data"), Chmod("/data", 0o700),
    Mqueue(), Overlay("/o", ["/lower"]),
])
def test_a_mount_the_task_world_would_silently_lack_is_refused_by_name(mount: Mount) -> None:
    # Left out, each would show something else than the Spec asks: a tmpfs over a bind (writes would reach the
    # host), a remount (the bind would stay writable), a directory or link (absent), a proc or dev elsewhere.
    with pytest.raises(SpecError) as info:
        description_of(Spec(mounts=[*system_mounts(), Bind("/data"), mount]))
    assert info.value.field == f"mounts[{len(system_mounts()) + 1}]"


def test_the_task_worlds_own_mounts_are_left_to_it() -> None:
    spec = Spec(mounts=[*system_mounts(), Proc(), Dev(), Tmpfs("/tmp", size=1 << 20, perms=0o700), Bind("/data")])
    sb = description_of(spec)
    assert sb.write == ("/data",) and sb.read == () and sb.binds == ()


@pytest.mark.parametrize("mount", [Tmpfs("/tmp"), Proc(), Dev()])
def test_the_task_worlds_own_mount_over_an_earlier_one_is_refused(mount: Mount) -> None:
    # the task world mounts its /tmp, /proc and /dev before every bind: one the Spec covers would show
    spec = Spec(mounts=[RoBind("/data", f"{mount.dest_path()}/data"), mount])
    with pytest.raises(SpecError) as info:
        description_of(spec)
    assert info.value.field == "mounts[1]" and "covers mounts[0]" in info.value.problem


def test_without_a_cwd_the_start_is_decided_here_by_bwraps_rule(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # the broker runs in another process: its own cwd, were the choice left to it, would be the candidate
    shown, home, hidden = tmp_path / "shown", tmp_path / "home", tmp_path / "hidden"
    for d in (shown / "sub", home, hidden):
        d.mkdir(parents=True)
    spec = Spec(mounts=[RoBind(str(shown)), RoBind(str(home), "/home/me"), RoBind("/nowhere", "/w", optional=True),
                        RoBind("/nowhere", f"{shown}/sub", optional=True)])
    monkeypatch.chdir(shown / "sub")
    assert description_of(spec).chdir == str(shown / "sub")  # the caller's, shown
    assert description_of(spec.replace(cwd="/usr")).chdir == "/usr"  # a given cwd wins
    monkeypatch.chdir(hidden)
    assert description_of(spec).chdir == "/"  # not shown, and no HOME
    assert description_of(spec.replace(env={"HOME": "/home/me"})).chdir == "/home/me"  # HOME, through its bind
    assert description_of(spec.replace(env={"HOME": "/w"})).chdir == "/"  # an optional bind of nothing
    os.rmdir(hidden)
    assert description_of(spec).chdir == "/"  # the caller's cwd is gone
