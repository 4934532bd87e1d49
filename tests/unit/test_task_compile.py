"""compile_task: a description and hand-made host facts compiled into a Spec (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox import Bind as SBind
from sandbox import RemountRo, RoBind, SpecError, Tmpfs
from sandbox.task import Bind, Facts, Proxy, Sandbox, compile_task
from sandbox.task.facts import hide_names
from sandbox.task.pyenv import PythonFacts, locate, pth_additions

PY = PythonFacts(executable="/venv/bin/python", executable_chain=("/venv/bin/python", "/usr/bin/python3.11"),
                 venv_cfg="/venv/pyvenv.cfg", bindir="/venv/bin", stdlib=("/usr/lib/python3.11",),
                 site_dirs=("/venv/lib/python3.11/site-packages",), pth_added=("/src/checkout",),
                 other_site_dirs=("/usr/lib/python3/dist-packages",), pythonpath=())


def facts(**kw: object) -> Facts:
    base = {"python": PY, "system": (RoBind("/usr"),), "etc": ("/etc/passwd",), "hidden": (),
            "framework_paths": (), "packages": (), "realpaths": {}}
    base.update(kw)
    return Facts(**base)  # type: ignore[arg-type]


def binds_of(spec: object) -> list[tuple[str, str, bool]]:
    return [(m.src, m.dest, not m.readonly) for m in spec.mounts if isinstance(m, SBind)]  # type: ignore[attr-defined]


def test_python_is_shown_as_installed_without_pth_additions() -> None:
    spec = compile_task(Sandbox(), facts(), {}).spec
    shown = {dest for _, dest, _ in binds_of(spec)}
    assert {"/venv/bin/python", "/venv/pyvenv.cfg", "/venv/lib/python3.11/site-packages"} <= shown
    assert "/src/checkout" not in shown and not any(d.startswith("/src") for d in shown)
    assert Tmpfs("/usr/lib/python3/dist-packages", perms=0o555) in spec.mounts
    assert RemountRo("/usr/lib/python3/dist-packages") in spec.mounts
    assert spec.env_dict["PATH"].split(":")[0] == "/venv/bin"


def test_most_specific_grant_wins_in_either_direction() -> None:
    sb = Sandbox(write=("/w", "/r/rw"), read=("/w/ro", "/r"))
    order = [(dest, rw) for _, dest, rw in binds_of(compile_task(sb, facts(), {}).spec) if dest[:2] in ("/w", "/r")]
    assert order.index(("/w", True)) < order.index(("/w/ro", False))
    assert order.index(("/r", False)) < order.index(("/r/rw", True))


def test_hide_covers_every_name_and_the_pycache(tmp_path: Path) -> None:
    pkg = tmp_path / "lib" / "pkg"
    (pkg / "__pycache__").mkdir(parents=True)
    (pkg / "scoring.py").write_text("")
    (tmp_path / "lib" / "whole").mkdir()
    hidden = (("pkg.scoring", str(pkg / "scoring.py")), ("whole", str(tmp_path / "lib" / "whole")))
    sb = Sandbox(read=(str(tmp_path / "lib"),), binds=(Bind(str(tmp_path / "lib"), "/w/lib"),), hide=("pkg.scoring",))
    c = compile_task(sb, facts(hidden=hidden, empty_file="/e/empty"), {})
    for root in (str(tmp_path / "lib"), "/w/lib"):
        assert RoBind("/e/empty", f"{root}/pkg/scoring.py") in c.spec.mounts
        assert Tmpfs(f"{root}/pkg/__pycache__", perms=0o555) in c.spec.mounts
        assert Tmpfs(f"{root}/whole", perms=0o555) in c.spec.mounts
    # the covers come after every bind
    last_bind = max(i for i, m in enumerate(c.spec.mounts) if isinstance(m, SBind) and m.src != "/e/empty")
    first_cover = min(i for i, m in enumerate(c.spec.mounts) if isinstance(m, SBind) and m.src == "/e/empty")
    assert last_bind < first_cover
    assert c.spec.env_dict["SANDBOX_HIDE"] == "pkg.scoring,whole"


def test_hide_names_come_from_the_environment_except_for_the_judge() -> None:
    env = {"SANDBOX_HIDE": "a, b.c,,"}
    assert hide_names(Sandbox(hide=("x",)), env) == ("x", "a", "b.c")
    assert hide_names(Sandbox(hide=("x",), role="judge"), env) == ("x",)


def test_locate_never_runs_package_code(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    pkg = tmp_path / "sidefx"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (pkg / "scoring.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    assert locate("sidefx.scoring", [str(tmp_path)]) == str(pkg / "scoring.py")
    assert locate("sidefx", [str(tmp_path)]) == str(pkg)
    assert not marker.exists()
    with pytest.raises(SpecError, match="not found"):
        locate("sidefx.nothere", [str(tmp_path)])


def test_pth_additions(tmp_path: Path) -> None:
    (tmp_path / "checkout").mkdir()
    (tmp_path / "e.pth").write_text(f"{tmp_path / 'checkout'}\nimport os\n# note\n/does/not/exist\n")
    assert pth_additions([str(tmp_path)]) == [str(tmp_path / "checkout")]


def test_environment_allowlist_patterns_and_translation() -> None:
    environ = {"MWM_A": "/data/x", "MWM_B": "1", "HOME": "/root", "OPENAI_API_KEY": "k" * 20, "PATH": "/opt/x:/bin"}
    sb = Sandbox(env_allow=("MWM_*",), env={"EXPLICIT": "/data/y"}, binds=(Bind("/data", "/in"),))
    env = compile_task(sb, facts(), environ).spec.env_dict
    assert env["MWM_A"] == "/in/x" and env["MWM_B"] == "1" and env["EXPLICIT"] == "/in/y"
    assert "HOME" not in env and "OPENAI_API_KEY" not in env
    assert "/opt/x" not in env["PATH"]


def test_forwarding_ports_sockets_env_urls_and_proxy() -> None:
    environ = {"MODEL_URL": "http://localhost:8123/v1", "TOOLS": "http://127.0.0.1:9001", "OTHER": "http://10.0.0.1:99"}
    sb = Sandbox(env_allow=("MODEL_URL", "TOOLS", "OTHER"), ports=(7000,), sockets={7100: "/run/s.sock"},
                 proxy=Proxy(("example.com",)))
    c = compile_task(sb, facts(), environ, proxy_port=3128)
    assert dict(c.spec.forward) == {8123: 8123, 9001: 9001, 7000: 7000, 7100: "/run/s.sock", 3128: 3128}
    assert c.spec.check and c.spec.network == "none"
    assert all(c.spec.env_dict[v] == "http://127.0.0.1:3128" for v in ("HTTP_PROXY", "https_proxy"))
    open_spec = compile_task(Sandbox(network="open", env_allow=("MODEL_URL",)), facts(), environ).spec
    assert open_spec.network == "host" and not open_spec.forward


def test_framework_package_covered_unless_asked() -> None:
    fw = ("/venv/lib/python3.11/site-packages/trainer", "/src/checkout/trainer")
    covered = compile_task(Sandbox(framework_package="trainer"), facts(framework_paths=fw, empty_file="/e"), {})
    assert "/venv/lib/python3.11/site-packages/trainer" in covered.hidden
    shown = compile_task(Sandbox(framework_package="trainer", framework=True), facts(framework_paths=fw), {})
    assert not shown.hidden
    dests = {d for _, d, _ in binds_of(shown.spec)}
    assert "/src/checkout/trainer" not in dests  # never its checkout


def test_no_proxy_lists_loopback_and_every_forwarded_port_when_the_proxy_is_set() -> None:
    environ = {"MODEL_URL": "http://localhost:8123/v1", "no_proxy": "internal.example"}
    sb = Sandbox(env_allow=("MODEL_URL", "no_proxy"), ports=(7000,), sockets={7100: "/run/s.sock"},
                 proxy=Proxy(("example.com",)))
    env = compile_task(sb, facts(), environ, proxy_port=3128).spec.env_dict
    assert env["NO_PROXY"] == env["no_proxy"]
    entries = env["NO_PROXY"].split(",")
    assert entries[0] == "internal.example"  # what the caller listed stays, first
    assert {"localhost", "127.0.0.1", "::1"} <= set(entries)
    for port in (7000, 7100, 8123):
        assert f"127.0.0.1:{port}" in entries and f"localhost:{port}" in entries
    assert "127.0.0.1:3128" not in entries  # the proxy itself is reached as a proxy, never through one
    plain = compile_task(Sandbox(ports=(7000,)), facts(), {}).spec.env_dict
    assert "NO_PROXY" not in plain and "no_proxy" not in plain
