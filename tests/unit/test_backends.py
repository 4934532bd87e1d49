"""The backend registry: which backend "auto" picks and what it says when none can run.
Backends are stood in for by fakes: no sandbox is started."""

from __future__ import annotations

import pytest

from sandbox import backends
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
    with pytest.raises(SpecError, match="backend='docker': must be 'auto', 'native', 'bwrap', 'template' or 'blob'"):
        backends.choose("docker")
    with pytest.raises(SpecError, match=r"backend=\['native'\]: must be 'auto'"):
        backends.choose(["native"])  # type: ignore[arg-type]


class _Refusing:
    name = "bwrap"

    def launch(self, *args: object) -> backends.Handle:
        raise UnavailableError("bwrap backend unavailable: Creating new namespace failed: EPERM")


def test_a_launch_refused_by_the_host_names_every_backend(hosts: dict[str, tuple[bool, str]],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backends, "get", lambda name: _Refusing())
    hosts["native"] = (False, "no userns")
    with pytest.raises(UnavailableError) as info:
        backends.launch("bwrap", None, ["true"], (-1, -1, -1), ())  # type: ignore[arg-type]
    assert str(info.value) == "no sandbox backend: native: no userns; bwrap: Creating new namespace failed: EPERM"
    hosts["native"] = (True, "works")  # another backend could run it: the error stays the backend's own
    with pytest.raises(UnavailableError, match="^bwrap backend unavailable: Creating"):
        backends.launch("bwrap", None, ["true"], (-1, -1, -1), ())  # type: ignore[arg-type]
