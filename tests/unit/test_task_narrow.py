"""narrowed(parent, child): a nested description can only narrow its parent's."""

from __future__ import annotations

import pytest

from sandbox import SpecError
from sandbox.task import Bind, Limits, Proxy, Sandbox, narrowed

PARENT = Sandbox(read=("/data",), write=("/ws", "/data/scratch"), binds=(Bind("/models", "/m"),),
                 ports=(8080,), proxy=Proxy(("api.example.com",)), env_allow=("MWM_*",), hide=("trainer.scoring",),
                 probes=("/home/me/.ssh",), limits=Limits(memory_mb=4096, cpu_s=600), records="/runs/rec",
                 framework_package="trainer")


def test_a_narrower_child_inherits_what_never_loosens() -> None:
    child = Sandbox(read=("/data/split", "/ws"), write=("/ws/tool", "/data/scratch/t"), ports=(8080,),
                    env_allow=("MWM_A", "MWM_B*"), hide=("x",), limits=Limits(memory_mb=512, file_mb=5),
                    enforce="best_effort", records=None, role="tool")
    out = narrowed(PARENT, child)
    assert out.hide == ("trainer.scoring", "x") and out.probes == ("/home/me/.ssh",)
    assert out.limits == Limits(memory_mb=512, file_mb=5, cpu_s=600)
    assert (out.enforce, out.records, out.role, out.framework_package) == ("required", "/runs/rec", "tool", "trainer")


@pytest.mark.parametrize(("child", "field"), [
    (Sandbox(read=("/etc",)), "read"),
    (Sandbox(write=("/data/split",)), "write"),  # read-only in the parent
    (Sandbox(binds=(Bind("/models", "/m", writable=True),)), "binds"),
    (Sandbox(network="open"), "network"),
    (Sandbox(ports=(9000,)), "ports"),
    (Sandbox(sockets={7000: "/s"}), "sockets"),
    (Sandbox(proxy=Proxy(("evil.example.com",))), "proxy.allowed_hosts"),
    (Sandbox(env_allow=("*",)), "env_allow"),
    (Sandbox(framework_package="trainer", framework=True), "framework"),
    (Sandbox(framework_package="pytest"), "framework_package"),  # covered in place of the parent's: shown again
    (Sandbox(framework_package="pytest", framework=True), "framework_package"),
    (Sandbox(packages=("checkout_pkg",)), "packages"),  # a checkout or PYTHONPATH module the parent does not show
])
def test_anything_wider_is_refused_by_field(child: Sandbox, field: str) -> None:
    with pytest.raises(SpecError) as info:
        narrowed(PARENT, child)
    assert info.value.field == field


def test_the_framework_package_is_the_parents_or_none() -> None:
    assert narrowed(PARENT, Sandbox(framework_package="trainer")).framework_package == "trainer"
    assert narrowed(PARENT, Sandbox()).framework_package == "trainer"
    with pytest.raises(SpecError, match="framework_package='other'.*must be the parent's"):
        narrowed(Sandbox(), Sandbox(framework_package="other"))  # the parent covers none: hide= covers more
