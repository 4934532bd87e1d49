"""sandbox.task.Sandbox: the JSON form's keys and shapes, defaults, refusal of unknown keys by name."""

from __future__ import annotations

import json

import pytest

from sandbox import SpecError
from sandbox.task import Bind, Layout, Limits, Proxy, Sandbox

FULL = {
    "read": ["/data/split"], "write": ["/runs/1"],
    "binds": [{"source": "/work/ws", "target": "/w", "writable": True}],
    "layout": {"outside": "/work/ws", "inside": "/w"}, "chdir": "/work/ws",
    "packages": ["mypkg"], "framework_package": "trainer", "framework": False, "hide": ["trainer.scoring"],
    "env_allow": ["MWM_*", "LANG"], "env": {"MODEL_KEY": "k"}, "network": "isolated", "ports": [8080, 9000],
    "sockets": {"7000": "/run/meter.sock"}, "proxy": {"allowed_hosts": ["api.example.com"]},
    "limits": {"memory_mb": 512, "file_mb": 10, "cpu_s": 30}, "enforce": "best_effort", "enabled": True,
    "records": "/runs/records", "probes": ["/home/me/.ssh"], "role": "learner",
}


def test_empty_object_is_the_default_description() -> None:
    sb = Sandbox.from_dict({})
    assert sb == Sandbox()
    assert (sb.network, sb.enforce, sb.enabled, sb.role) == ("isolated", "required", True, "task")
    assert not (sb.read or sb.write or sb.binds or sb.ports or sb.sockets or sb.proxy)


def test_every_key_of_the_reference_and_a_round_trip() -> None:
    sb = Sandbox.from_json(json.dumps(FULL))
    assert sb.binds == (Bind("/work/ws", "/w", True),)
    assert sb.layout == Layout("/work/ws", "/w")
    assert sb.sockets == ((7000, "/run/meter.sock"),)
    assert sb.proxy == Proxy(("api.example.com",))
    assert sb.limits == Limits(memory_mb=512, file_mb=10, cpu_s=30)
    assert set(sb.to_dict()) == set(FULL)
    assert Sandbox.from_json(sb.to_json()) == sb
    assert json.loads(sb.to_json()) == FULL


@pytest.mark.parametrize(("data", "named"), [
    ({"writable": ["/x"]}, "writable"),
    ({"binds": [{"source": "/a", "target": "/b", "mode": "ro"}]}, "mode"),
    ({"layout": {"outside": "/a", "inside": "/b", "x": 1}}, "x"),
    ({"proxy": {"hosts": []}}, "hosts"),
    ({"limits": {"nofile": 3}}, "nofile"),
])
def test_unknown_keys_are_refused_by_name(data: dict, named: str) -> None:
    with pytest.raises(SpecError, match=named):
        Sandbox.from_dict(data)


@pytest.mark.parametrize(("data", "field"), [
    ({"read": "/x"}, "read"), ({"read": ["relative"]}, "read"), ({"network": "host"}, "network"),
    ({"enforce": "maybe"}, "enforce"), ({"role": "boss"}, "role"), ({"ports": [0]}, "ports"),
    ({"sockets": {"x": "/s"}}, "sockets"), ({"limits": {"cpu_s": -1}}, "limits.cpu_s"),
    ({"enabled": "yes"}, "enabled"), ({"network": "open", "ports": [80]}, "ports"),
    ({"binds": [{"source": "/a"}]}, "binds[0]"), ({"ports": [7000], "sockets": {"7000": "/s"}}, "sockets"),
])
def test_bad_values_name_the_field(data: dict, field: str) -> None:
    with pytest.raises(SpecError) as info:
        Sandbox.from_dict(data)
    assert info.value.field.startswith(field)


def test_frozen_and_view_keeps_the_rest() -> None:
    sb = Sandbox.from_dict(FULL)
    with pytest.raises(AttributeError):
        sb.role = "judge"  # type: ignore[misc]
    v = sb.view(binds=[Bind("/other", "/o")], layout=Layout("/other", "/o"))
    assert v.binds == (Bind("/other", "/o"),) and v.layout == Layout("/other", "/o")
    for name in ("network", "proxy", "env", "env_allow", "enforce", "records", "limits", "ports", "sockets"):
        assert getattr(v, name) == getattr(sb, name)


def test_socket_paths_may_be_pathlib_paths() -> None:
    from pathlib import Path

    from sandbox.task import Sandbox

    assert Sandbox(sockets={7399: Path("/run/s.sock")}).sockets == ((7399, "/run/s.sock"),)
