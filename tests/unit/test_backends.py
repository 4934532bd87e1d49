"""The backend registry: which backend "auto" picks and what it says when none can run.
Backends are stood in for by fakes: no sandbox is started."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from sandbox import backends
from sandbox.backends import brokered
from sandbox.errors import SpecError, UnavailableError


@pytest.fixture
def hosts(monkeypatch: pytest.MonkeyPatch) -> dict[str, tuple[bool, str]]:
    """What each backend says about this (pretend) host; edit it in the test."""
    said = {"native": (True, "works"), "bwrap": (True, "works")}
    monkeypatch.setattr(backends, "_availability", lambda name: said[name])
    return said


def test_auto_prefers_native(hosts: dict[str, tuple[bool, str]]) -> None:
    assert backends.choose("auto") == ("native", "auto: this host allows the native path")


def test_auto_falls_back_and_says_why(hosts: dict[str, tuple[bool, str]]) -> None:
    hosts["native"] = (False, "user namespaces: EPERM from clone")
    assert backends.choose("auto") == ("bwrap", "auto: native refused (user namespaces: EPERM from clone)")


def test_nothing_available_names_every_reason(hosts: dict[str, tuple[bool, str]]) -> None:
    hosts["native"] = (False, "no userns")
    hosts["bwrap"] = (False, "not found on PATH")
    with pytest.raises(UnavailableError, match="no sandbox backend: native: no userns; bwrap: not found on PATH"):
        backends.choose("auto")
    with pytest.raises(UnavailableError, match="native backend unavailable: no userns"):
        backends.choose("native")


def test_unknown_backend_is_a_value_error() -> None:
    choices = "'auto', 'brokered', 'native', 'bwrap', 'template' or 'blob'"
    with pytest.raises(SpecError, match=f"backend='docker': must be {choices}"):
        backends.choose("docker")
    with pytest.raises(SpecError, match=r"backend=\['native'\]: must be 'auto'"):
        backends.choose(["native"])  # type: ignore[arg-type]


class _Refusing:
    name = "bwrap"

    def launch(self, *args: object) -> backends.Handle:
        raise UnavailableError("bwrap backend unavailable: Creating new namespace failed: EPERM")


def test_a_launch_refused_by_the_host_names_every_backend(hosts: dict[str, tuple[bool, str]],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    real = backends.get
    monkeypatch.setattr(backends, "get", lambda name: real(name) if name == "brokered" else _Refusing())
    hosts["native"] = (False, "no userns")
    with pytest.raises(UnavailableError) as info:
        backends.launch("bwrap", None, ["true"], (-1, -1, -1), ())  # type: ignore[arg-type]
    assert str(info.value) == "no sandbox backend: native: no userns; bwrap: Creating new namespace failed: EPERM"
    hosts["native"] = (True, "works")  # another backend could run it: the error stays the backend's own
    with pytest.raises(UnavailableError, match="^bwrap backend unavailable: Creating"):
        backends.launch("bwrap", None, ["true"], (-1, -1, -1), ())  # type: ignore[arg-type]


def test_auto_finds_the_broker_from_the_environment(hosts: dict[str, tuple[bool, str]], tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The brokered executor serves where SANDBOX_TASK_BROKER is set (anyio's way: no caller tests for it):
    outside it is never named; set but naming no socket, "auto" says so and goes on; naming a socket, it
    comes first. Read at each choice, never cached."""
    monkeypatch.delenv(brokered.BROKER_ENV, raising=False)
    assert backends.choose("auto") == ("native", "auto: this host allows the native path")
    path = tmp_path / "broker"
    monkeypatch.setenv(brokered.BROKER_ENV, str(path))
    name, reason = backends.choose("auto")
    assert name == "native" and reason.startswith("auto: brokered refused (no sandbox.task broker is reachable: ")
    assert "No such file or directory" in reason
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(path))
        name, reason = backends.choose("auto")
        assert name == "brokered" and reason == f"auto: inside a task sandbox: its broker ({brokered.BROKER_ENV}=" \
            f"{path}) starts the sandbox beside it"
        assert backends.choose("native") == ("native", "requested")  # asked by name, it is not in the way
    path.unlink()
    hosts["native"] = hosts["bwrap"] = (False, "no userns")
    with pytest.raises(UnavailableError, match="^no sandbox backend: brokered: no sandbox.task broker is reachable"):
        backends.choose("auto")
    monkeypatch.delenv(brokered.BROKER_ENV)
    with pytest.raises(UnavailableError, match="^no sandbox backend: native: no userns; bwrap: no userns$"):
        backends.choose("auto")
