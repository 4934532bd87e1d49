"""sandbox.launcher.native_ok(): the native probe's success is kept in the
user's cache directory, and used only while what it depends on is unchanged."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox import launcher
from sandbox.host import DISABLE_NATIVE_ENV


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private cache directory; the process-wide verdict forgotten before and after."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(DISABLE_NATIVE_ENV, raising=False)
    monkeypatch.setattr(launcher, "_native_ok", None)
    if launcher._cache_key() is None:
        pytest.skip("the compiled core or the launcher is missing here")
    yield tmp_path / "sandbox" / f"native-probe-{os.getuid()}.json"
    launcher._native_ok = None


def probes(monkeypatch: pytest.MonkeyPatch, verdict: bool) -> list[str]:
    """Replace the native probe with one that answers `verdict`; the list of calls."""
    calls: list[str] = []

    def availability(name: str, refresh: bool = False) -> tuple[bool, str]:
        calls.append(name)
        return verdict, "stand-in"

    monkeypatch.setattr(launcher.backends, "availability", availability)
    return calls


def test_a_success_is_kept_and_used(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = probes(monkeypatch, True)
    assert launcher.native_ok() and calls == ["native"]
    assert json.loads(cache.read_text()) == launcher._cache_key()
    assert cache.stat().st_mode & 0o022 == 0 and cache.parent.stat().st_mode & 0o077 == 0
    launcher._native_ok = None
    assert launcher.native_ok() and calls == ["native"]  # the second process does not probe


def test_a_failure_is_not_kept(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = probes(monkeypatch, False)
    assert not launcher.native_ok()
    launcher._native_ok = None
    assert not launcher.native_ok() and calls == ["native", "native"]
    assert not cache.exists()


def test_a_changed_host_probes_again(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = probes(monkeypatch, True)
    assert launcher.native_ok()
    launcher._native_ok = None
    real = launcher._cache_key
    monkeypatch.setattr(launcher, "_cache_key", lambda: {**(real() or {}), "boot": "another boot"})
    monkeypatch.setattr(launcher.backends, "availability", lambda name, refresh=False: (False, "changed"))
    assert not launcher.native_ok()
    assert calls == ["native"]


def test_a_cache_others_can_write_is_ignored(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = probes(monkeypatch, True)
    assert launcher.native_ok()
    cache.chmod(0o666)
    launcher._native_ok = None
    assert launcher.native_ok() and calls == ["native", "native"]


def test_disabling_native_always_asks(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    probes(monkeypatch, True)
    assert launcher.native_ok()
    launcher._native_ok = None
    monkeypatch.setenv(DISABLE_NATIVE_ENV, "1")
    calls = probes(monkeypatch, False)
    assert not launcher.native_ok() and calls == ["native"]


@pytest.mark.parametrize("content", [b"", b"{", b"\xff\xfe", b"[]", b"null", b'{"boot": "x"}'])
def test_a_corrupt_or_foreign_cache_probes_again_and_is_replaced(cache: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 content: bytes) -> None:
    cache.parent.mkdir(mode=0o700)
    cache.write_bytes(content)
    cache.chmod(0o600)
    calls = probes(monkeypatch, True)
    assert launcher.native_ok() and calls == ["native"]
    assert json.loads(cache.read_text()) == launcher._cache_key()


def test_a_directory_in_the_cache_s_place_probes_again(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache.mkdir(parents=True)
    calls = probes(monkeypatch, True)
    assert launcher.native_ok() and calls == ["native"]  # not IsADirectoryError


def test_the_key_holds_the_process_s_confinement(cache: Path) -> None:
    """What a container or a seccomp sandbox changes is part of the key (the
    integration test test_launcher_stale_cache.py confines a process for real)."""
    key = launcher._cache_key()
    assert key is not None
    process = key["process"]
    assert isinstance(process, dict) and set(process) == {"status", "ns", "lsm"}
    assert {"Seccomp", "NoNewPrivs", "CapEff"} <= set(process["status"])
    assert process["ns"]["user"] == os.stat("/proc/self/ns/user").st_ino
    assert "user.max_mnt_namespaces" in key["sysctls"]  # type: ignore[operator]
