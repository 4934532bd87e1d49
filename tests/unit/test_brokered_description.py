"""A Spec started inside a task sandbox becomes a task description (sandbox.backends.brokered.description),
or is refused by name."""

from __future__ import annotations

import sys

import pytest

from sandbox import Bind, DevBind, File, Proc, RoBind, Spec, SpecError, Tmpfs
from sandbox.backends.brokered.description import description_of
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
