"""The task sandbox's world, on both backends, root and unprivileged: the
filesystem allowlist, Python as installed, hide, the environment."""

from __future__ import annotations

import os
import site
from pathlib import Path

import pytest
from task_helpers import PY, pyrun, task_backend, trun  # noqa: F401  (task_backend: the fixture `backend`)

from sandbox import task
from sandbox.task import Bind, Sandbox
from sandbox.task.facts import Facts
from sandbox.task.pyenv import PythonFacts

pytestmark = pytest.mark.integration


def test_nothing_undeclared_exists(backend: str, tmp_path: Path) -> None:
    (tmp_path / "granted").mkdir()
    (tmp_path / "undeclared").mkdir()
    os.chdir(tmp_path / "undeclared")  # a caller's cwd that is not declared: absent, and no failure
    try:
        r = trun('echo ROOT $(ls -A /); '
                 'for p in /home /root "$1" /etc/shadow /etc/sudoers /etc/ssh /etc/ssl/private; do '
                 '[ -e "$p" ] && echo "EXISTS $p"; done; pwd; ls /etc; ls "$2" >/dev/null && echo granted-ok; '
                 'echo RUN $(find /run)',
                 Sandbox(read=(str(tmp_path / "granted"),)), backend, str(tmp_path / "undeclared"),
                 str(tmp_path / "granted"))
    finally:
        os.chdir("/")
    assert r.returncode == 0, r.stderr
    assert "EXISTS" not in r.stdout
    root = set(r.stdout.split("\n")[0].split()[1:])
    # run: /run/sandbox/task-broker only, the socket of the sandbox's broker (SANDBOX_TASK_BROKER)
    assert root <= {"bin", "dev", "etc", "lib", "lib64", "lib32", "libx32", "opt", "proc", "run", "sbin", "tmp", "usr"}
    assert r.stdout.split("\n")[1] == "/"  # the undeclared cwd is not there: the start falls back to /
    assert "passwd" in r.stdout and "granted-ok" in r.stdout and "shadow" not in r.stdout
    assert r.stdout.split("\n")[-2] == "RUN /run /run/sandbox /run/sandbox/task-broker", r.stdout


def test_only_write_paths_writable_binds_and_tmp_are_writable(backend: str, tmp_path: Path) -> None:
    for d in ("rw", "rw/ro", "ro", "ro/rw", "bound", "bound_rw"):
        (tmp_path / d).mkdir()
    sb = Sandbox(write=(str(tmp_path / "rw"), str(tmp_path / "ro/rw")),
                 read=(str(tmp_path / "rw/ro"), str(tmp_path / "ro")),
                 binds=(Bind(str(tmp_path / "bound"), "/b"), Bind(str(tmp_path / "bound_rw"), "/brw", writable=True)))
    script = ('for p in /tmp "$1/rw" "$1/rw/ro" "$1/ro" "$1/ro/rw" /b /brw /usr /etc; do '
              'if touch "$p/f" 2>/dev/null; then echo "W $p"; else echo "R $p"; fi; done')
    r = trun(script, sb, backend, str(tmp_path))
    got = dict(line.split(" ", 1)[::-1] for line in r.stdout.split("\n") if line)
    t = str(tmp_path)
    assert got == {"/tmp": "W", f"{t}/rw": "W", f"{t}/rw/ro": "R", f"{t}/ro": "R", f"{t}/ro/rw": "W",
                   "/b": "R", "/brw": "W", "/usr": "R", "/etc": "R"}
    assert (tmp_path / "bound_rw" / "f").exists() and not (tmp_path / "bound" / "f").exists()


def test_a_link_to_an_undeclared_path_does_not_resolve(backend: str, tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "secret").write_text("s3cret")
    os.symlink(str(tmp_path / "secret"), tmp_path / "ws" / "link")
    r = trun('cat "$1/link"', Sandbox(read=(str(tmp_path / "ws"),)), backend, str(tmp_path / "ws"))
    assert r.returncode != 0 and "s3cret" not in r.stdout


def test_python_as_installed(backend: str) -> None:
    code = ("import sys, os, cloudpickle; print(sys.executable); print(cloudpickle.__file__);"
            "d = '/usr/lib/python3/dist-packages'; print(sorted(os.listdir(d)) if os.path.isdir(d) else 'none')")
    r = pyrun(code, Sandbox(), backend)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("\n")
    assert lines[0] == PY and lines[1].startswith(tuple(site.getsitepackages()))
    assert lines[2] in ("[]", "none")  # another interpreter's site directory: emptied
    # PATH is led by this interpreter: `#!/usr/bin/env python3` runs on this environment
    r = trun("env python3 -c 'import sys; print(sys.prefix)'", Sandbox(), backend)
    import sys
    assert r.stdout.strip() == sys.prefix, r.stderr


def test_an_editable_checkout_is_absent_and_packages_shows_one(backend: str, tmp_path: Path) -> None:
    """A site directory whose .pth adds a checkout (an editable install): its
    path is not shown inside; the checkout's tests and data are absent."""
    site_dir, checkout = tmp_path / "site", tmp_path / "checkout"
    (checkout / "src" / "edpkg").mkdir(parents=True)
    (checkout / "tests").mkdir()
    (checkout / "src" / "edpkg" / "__init__.py").write_text("VALUE = 42\n")
    site_dir.mkdir()
    (site_dir / "edpkg.pth").write_text(str(checkout / "src") + "\n")
    real = PythonFacts.current()
    fake = PythonFacts(**{**real.__dict__, "site_dirs": (*real.site_dirs, str(site_dir)),
                          "pth_added": (str(checkout / "src"),)})
    code = (f"import site, os; site.addsitedir({str(site_dir)!r});"
            f"print(os.path.exists({str(checkout / 'tests')!r}));"
            "import edpkg; print(edpkg.VALUE)")
    sb = Sandbox()
    env = {"PATH": os.environ.get("PATH", "")}
    compiled = task.compile_task(sb, Facts.gather(sb, env, python=fake), env)
    import sandbox
    r = sandbox.run([PY, "-c", code], compiled.spec, backend=backend, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "No module named 'edpkg'" in r.stderr
    # `packages` names it (a module found on the path): just the package is shown
    import sys
    sys.path.insert(0, str(checkout / "src"))
    try:
        sb = Sandbox(packages=("edpkg",))
        compiled = task.compile_task(sb, Facts.gather(sb, env, python=fake), env)
    finally:
        sys.path.remove(str(checkout / "src"))
    r = sandbox.run([PY, "-c", code], compiled.spec, backend=backend, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "42"]


def test_hide_covers_under_two_names_without_running_the_package(backend: str, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    lib = tmp_path / "lib"
    pkg = lib / "judgepkg"
    (pkg / "__pycache__").mkdir(parents=True)
    marker = tmp_path / "side-effect"
    (pkg / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (pkg / "scoring.py").write_text("ANSWER = 'the answers'\n")
    (pkg / "util.py").write_text("OK = 1\n")
    (pkg / "__pycache__" / "scoring.cpython-311.pyc").write_bytes(b"cached answers")
    monkeypatch.syspath_prepend(str(lib))
    sb = Sandbox(read=(str(lib),), binds=(Bind(str(lib), "/w/lib"),), hide=("judgepkg.scoring",),
                 env={"PYTHONPATH": str(lib)})
    script = ('for root in "$1" /w/lib; do wc -c < "$root/judgepkg/scoring.py"; '
              'ls -A "$root/judgepkg/__pycache__" | wc -l; '
              'cat "$root/judgepkg/util.py"; done; echo "HIDE=$SANDBOX_HIDE"; '
              f'{PY} -c "from judgepkg import scoring; print(hasattr(scoring, \'ANSWER\'))"')
    r = trun(script, sb, backend, str(lib))
    assert not marker.exists()  # resolved without running judgepkg/__init__.py
    assert r.returncode == 0, r.stderr
    out = r.stdout.split("\n")
    assert out[:6] == ["0", "0", "OK = 1", "0", "0", "OK = 1"]  # empty file, empty cache, the rest intact
    assert out[6] == "HIDE=judgepkg.scoring" and out[7] == "False"


def test_a_hidden_package_imports_nothing(backend: str) -> None:
    r = pyrun("import cffi; print(getattr(cffi, 'FFI', None), cffi.__file__)", Sandbox(hide=("cffi",)), backend)
    assert r.returncode == 0 and r.stdout.split() == ["None", "None"], r.stderr


def test_framework_package_covered_unless_shown(backend: str) -> None:
    code = "import sandbox.spec; print('imported')"
    assert "imported" not in pyrun(code, Sandbox(framework_package="sandbox"), backend).stdout
    r = pyrun(code, Sandbox(framework_package="sandbox", framework=True), backend)
    assert r.stdout.strip() == "imported", r.stderr


def test_environment_allowlist_and_translation(backend: str, tmp_path: Path) -> None:
    environ = {"MWM_DATA": str(tmp_path / "x"), "MWM_N": "3", "HOME": "/root", "SECRET_TOKEN": "t" * 20,
               "PATH": os.environ.get("PATH", "/usr/bin")}
    sb = Sandbox(env_allow=("MWM_*",), env={"SET": "v"}, binds=(Bind(str(tmp_path), "/w"),), chdir=str(tmp_path))
    r = task.run(["sh", "-c", 'env | sort; pwd; echo "$0"', str(tmp_path / "arg")], sb, backend=backend,
                 capture_output=True, text=True, environ=environ, timeout=60)
    lines = r.stdout.split("\n")
    names = {ln.split("=", 1)[0] for ln in lines if "=" in ln}
    assert names <= {"MWM_DATA", "MWM_N", "SET", "PATH", "PWD", "SHLVL", "_", "SANDBOX_TASK_BROKER"}
    assert "MWM_DATA=/w/x" in lines and "MWM_N=3" in lines and "SET=v" in lines
    assert "/w" in lines and "/w/arg" in lines  # chdir and argv translated


def test_limits(backend: str, tmp_path: Path) -> None:
    sb = Sandbox(write=(str(tmp_path),), limits=task.Limits(file_mb=1))
    r = trun('sh -c "head -c 3000000 /dev/zero > $1/big"; echo "status $?"', sb, backend, str(tmp_path))
    assert "status 0" not in r.stdout
    assert (tmp_path / "big").stat().st_size <= 1 << 20


def test_a_hidden_package_reached_through_a_link_is_covered_where_it_leads(backend: str, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "real" / "linkpkg").mkdir(parents=True)
    (tmp_path / "real" / "linkpkg" / "__init__.py").write_text("SECRET = 1\n")
    (tmp_path / "lib").mkdir()
    os.symlink("../real/linkpkg", tmp_path / "lib" / "linkpkg")
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    sb = Sandbox(read=(str(tmp_path / "lib"), str(tmp_path / "real")), hide=("linkpkg",))
    r = trun('ls -A "$1/lib/linkpkg/" "$1/real/linkpkg/" | grep -c init', sb, backend, str(tmp_path))
    assert r.stdout.strip() == "0", r.stderr
