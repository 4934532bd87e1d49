"""A Flatpak test app in a private user installation, for benchmarks/cli.py's `flatpak run` rows.

    app = FlatpakApp.build(Path(tmp) / "flatpak")   # or None, with the reason in `unavailable()`
    subprocess.run(app.argv, env=app.env(bindir))   # `flatpak run` with the `bwrap` of bindir

The app is as small as an app can be, as Flatpak's own tests build theirs
(make-test-runtime.sh, make-test-app.sh): a runtime of this host's
/usr/bin/true, ldconfig and the libraries they link (Flatpak runs ldconfig
in a sandbox of its own to make the runtime's ld.so.cache the first time),
and an app whose command is `true`. Both are exported into an OSTree repo
with `flatpak build-export` and installed from it with `flatpak --user
install` into a HOME of its own, so nothing of the caller's Flatpak
installations is read or written. `flatpak run` then starts it as it starts
any app: `bwrap --args FD` with `--file`/`--ro-bind-data` for
/.flatpak-info, `--lock-file`, `--seccomp FD`, `--sync-fd` and a dozen
mounts, the bwrap taken from PATH (Debian's flatpak; FLATPAK_BWRAP unset).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

APP = "org.sandbox.Bench"
RUNTIME = "org.sandbox.BenchPlatform"
BRANCH = "master"
HOST_PATH = "/usr/local/bin:/usr/bin:/bin"


def unavailable() -> str | None:
    """Why no `flatpak run` row can be measured here, or None."""
    if shutil.which("flatpak", path=HOST_PATH) is None:
        return "flatpak is not installed (apt-get install flatpak)"
    if host_bwrap() is None:
        return "no bwrap on PATH to compare with (apt-get install bubblewrap)"
    return None


def host_bwrap() -> str | None:
    """The real bwrap of this host (not a venv's link to ours)."""
    return shutil.which("bwrap", path=HOST_PATH)


def _libraries(binary: str) -> list[str]:
    """The shared libraries `binary` loads, its ELF interpreter among them (ldd's absolute paths)."""
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        words = line.replace("=>", " ").split()
        found += [w for w in words if w.startswith("/")][:1]
    return found


class FlatpakApp:
    """The test app, installed in `root`/home; `argv` runs it, `env(bindir)` with the bwrap of `bindir`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.argv = ["flatpak", "--user", "run", APP]

    @classmethod
    def build(cls, root: Path) -> FlatpakApp:
        """Build the runtime and the app, export them and install them into a user installation in `root`."""
        app = cls(root)
        repo, runtime, appdir = root / "repo", root / "runtime", root / "app"
        for d in (root / "home", root / "run", root / "shim"):
            d.mkdir(parents=True, mode=0o700)
        app._make_runtime(runtime)
        app._make_app(appdir)
        # as Flatpak's own tests run: no system bus is asked for parental controls (malcontent) as a user installs
        env = {**app.env(None), "FLATPAK_SYSTEM_HELPER_ON_SESSION": "1"}
        arch = subprocess.run(["flatpak", "--default-arch"], capture_output=True, text=True, env=env,
                              check=True).stdout.strip()
        (appdir / "metadata").write_text(f"[Application]\nname={APP}\nruntime={RUNTIME}/{arch}/{BRANCH}\n"
                                         f"sdk={RUNTIME}/{arch}/{BRANCH}\n")
        for argv in (["build-export", "--disable-sandbox", "--runtime", str(repo), str(runtime), BRANCH],
                     ["build-finish", "--command=true", str(appdir)],
                     ["build-export", "--disable-sandbox", str(repo), str(appdir), BRANCH],
                     ["--user", "remote-add", "--no-gpg-verify", "bench", f"file://{repo}"],
                     ["--user", "install", "-y", "--noninteractive", "bench", APP]):
            done = subprocess.run(["flatpak", *argv], capture_output=True, text=True, env=env)
            if done.returncode != 0:
                raise RuntimeError(f"flatpak {' '.join(argv[:2])} failed: {done.stderr.strip()[-500:]}")
        return app

    @staticmethod
    def _make_runtime(runtime: Path) -> None:
        usr = runtime / "usr"
        (usr / "bin").mkdir(parents=True)
        (usr / "lib").mkdir()
        (runtime / "files").mkdir()
        (usr / "lib64").symlink_to("lib")
        (runtime / "metadata").write_text(f"[Runtime]\nname={RUNTIME}\n")
        ldconfig = shutil.which("ldconfig.real", path="/sbin:/usr/sbin") or shutil.which(
            "ldconfig", path="/sbin:/usr/sbin")
        if ldconfig is None:
            raise RuntimeError("no ldconfig in /sbin or /usr/sbin to put in the test runtime")
        binaries = {"true": "/usr/bin/true", "ldconfig": ldconfig}
        for name, path in binaries.items():
            shutil.copy2(path, usr / "bin" / name)
            for lib in _libraries(path):
                if not (usr / "lib" / os.path.basename(lib)).exists():
                    shutil.copy2(lib, usr / "lib" / os.path.basename(lib))

    @staticmethod
    def _make_app(appdir: Path) -> None:
        (appdir / "files" / "bin").mkdir(parents=True)
        (appdir / "metadata").write_text(f"[Application]\nname={APP}\n")

    def env(self, bindir: Path | None) -> dict[str, str]:
        """The environment of a `flatpak` call in this installation; `bwrap` is found in `bindir` (None: the
        host's PATH alone; the shim directory holding a link to the host's bwrap is `self.shim()`)."""
        home = self.root / "home"
        path = f"{bindir}:{HOST_PATH}" if bindir is not None else HOST_PATH
        env = {"HOME": str(home), "PATH": path, "XDG_RUNTIME_DIR": str(self.root / "run"),
               "XDG_DATA_HOME": str(home / ".local/share"), "XDG_CACHE_HOME": str(home / ".cache"),
               "XDG_CONFIG_HOME": str(home / ".config"), "FLATPAK_SYSTEM_DIR": str(self.root / "system"),
               "FLATPAK_CONFIG_DIR": str(self.root / "config"), "FLATPAK_RUN_DIR": str(self.root / "flatpak-run"),
               "LANG": "C.UTF-8"}
        return env

    def shim(self) -> Path:
        """A directory whose `bwrap` is the host's."""
        shim = self.root / "shim"
        link = shim / "bwrap"
        if not link.is_symlink():
            bwrap = host_bwrap()
            if bwrap is None:
                raise RuntimeError("no bwrap on this host")
            link.symlink_to(bwrap)
        return shim
