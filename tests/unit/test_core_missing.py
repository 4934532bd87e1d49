"""Without the compiled core the bwrap backend refuses, by name, what it would need it for."""

from __future__ import annotations

import errno as E

import pytest

from sandbox import Limits, Spec, UnavailableError, backends
from sandbox.backends.native import _explain_clone
from sandbox.host import HostInfo
from sandbox.plan import compile_plan
from sandbox.refusal import refusal

MISSING = "the compiled core sandbox._native is not built in /src/sandbox"


def host(core_missing: str | None, backend: str = "bwrap") -> HostInfo:
    return HostInfo(executor=backends.get(backend).traits, uid=1000, gid=1000, cwd="/", environ={}, pool=None,
                    core_missing=core_missing)


@pytest.mark.parametrize(("fields", "named"), [
    ({"limits": Limits(nofile=10)}, "limits"),
    ({"probe_paths": ("/root",)}, "probe_paths"),
    ({"forward": {8080: 9000}}, "forward, check_network"),
    ({"check_network": True}, "check_network"),
    ({"check": True}, "check_network"),  # its old name
])
def test_bwrap_without_the_core_refuses_what_needs_it(fields: dict, named: str) -> None:
    h = host(MISSING)
    refused = refusal(compile_plan(Spec(**fields), h), h)
    assert isinstance(refused, UnavailableError)
    assert str(refused) == f"the bwrap backend needs the compiled core for {named}: {MISSING}"


def test_bwrap_without_the_core_runs_the_rest() -> None:
    h = host(MISSING)
    assert refusal(compile_plan(Spec(), h), h) is None


def test_with_the_core_nothing_is_refused() -> None:
    h = host(None)
    assert refusal(compile_plan(Spec(limits=Limits(nofile=10), probe_paths=("/root",)), h), h) is None


@pytest.mark.parametrize(("err", "sysctls", "expected"), [
    (E.ENOSPC, {"user.max_user_namespaces": "0"}, "raise it, e.g. `sysctl -w user.max_user_namespaces=65536`"),
    (E.ENOSPC, {}, "raise the user.max_*_namespaces sysctl at its limit"),
    (E.EACCES, {"kernel.apparmor_restrict_unprivileged_userns": "1"}, "set it to 0"),
    (E.EPERM, {"kernel.unprivileged_userns_clone": "0"}, "set it to 1"),
    (E.EPERM, {}, "blocked by a seccomp policy or an LSM?"),
])
def test_clone_failures_say_what_to_change(err: int, sysctls: dict[str, str], expected: str) -> None:
    text = _explain_clone(err, sysctls)
    assert text.startswith(f"user namespaces: {E.errorcode[err]} from clone (") and expected in text
