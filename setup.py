"""Build: the cffi extension (sandbox._native) and the helper executables.

sandbox-init (the pid-1 reaper, static so it execs fast and needs nothing
inside the sandbox), sandbox-launch (the native launcher used by
sandbox.compat.avatar), sandbox-template (the resident process of a
sandbox.Template) and sandbox-cli (the installed `sandbox` command, a client
of sandbox.cliserver) are compiled from csrc/ into sandbox/_bin/; the two
exec'd per command (sandbox-cli, sandbox-launch) with musl where musl-gcc is
installed (client_libc).
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py
from setuptools.errors import SetupError as DistutilsSetupError

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
if not (HERE / "build_ffi.py").is_file():
    raise SystemExit(f"{HERE}: build_ffi.py is missing: the source tree is incomplete (see MANIFEST.in)")
from build_ffi import CFLAGS as LIB_CFLAGS  # noqa: E402
from build_ffi import INCLUDE_DIRS, LIB_SOURCES, compiler, csrc_path, musl_flags, names_source, words_source  # noqa: E402

CFLAGS = [*LIB_CFLAGS, *(f"-I{d}" for d in INCLUDE_DIRS)]
# sandbox-init is freestanding on x86_64 (see csrc/init/init.c), static libc elsewhere.
INIT_FLAGS = (
    ["-static", "-nostdlib", "-fno-stack-protector", "-fno-builtin", "-fno-asynchronous-unwind-tables"]
    if platform.machine() == "x86_64"
    else ["-static", "-DSBX_INIT_LIBC"]
)


def _client_defines() -> list[str]:
    """The versions the client prints for --version, from where the package writes them."""
    found = []
    for name, var, path in (("SBX_VERSION", "__version__", "__init__.py"),
                            ("SBX_BWRAP_RELEASE", "BWRAP_RELEASE", "bwrap/__init__.py")):
        match = re.search(rf'^{var} = "([^"]+)"', (HERE / "sandbox" / path).read_text(), re.M)
        if not match:
            raise SystemExit(f"sandbox/{path}: no {var} line")
        found.append(f'-D{name}="{match[1]}"')
    return found


EXECUTABLES = {
    "sandbox-init": (["init.c"], INIT_FLAGS),
    # a sandbox.Session's pid 1, exec'd in sandbox-init's place (static: nothing of it need be inside)
    "sandbox-session": (["session.c", "session_call.c", "session_user.c", "fdpass.c"], ["-static"]),
    # exec'd per command by harnesses (sandbox.launcher, the avatar's handoff): static, as sandbox-cli
    "sandbox-launch": (["launcher.c", "handoff.c", "clirequest.c", "runplan.c", "exitlike.c", *LIB_SOURCES],
                       ["-static"]),
    # static: every sandbox is a fork-style copy of it, and fewer mappings copy and fault faster
    "sandbox-template": (["template.c", "template_request.c", "template_trees.c", "template_schedule.c", "standby.c",
                          "template_recycle.c", "template_maker.c", "template_kept.c", "template_inherited.c",
                          "resident.c", *LIB_SOURCES], ["-static"]),
    # the installed `sandbox` command (CLIENT_SCRIPT): static, it execs in a fraction of a dynamic one's time
    "sandbox-cli": (["cliclient.c", "clipeer.c", "clirequest.c", "cliplan.c", "runplan.c", "exitlike.c", *LIB_SOURCES],
                    ["-static", *_client_defines()]),
}
# Built with musl where it is installed (client_libc): glibc's start-up runs ~70 CPUID
# instructions, each a VM exit in a guest (~0.5 ms a start on a firecracker VM; musl's runs none).
CLIENT_EXECUTABLES = ("sandbox-cli", "sandbox-launch")
CLIENT_LIBC_ENV = "SANDBOX_CLIENT_LIBC"
# The console command `sandbox` is the client executable itself, installed as a script (setup() below);
# pyproject.toml's `sandbox-py` is the Python CLI it runs when it does not hand a command line off.
CLIENT_SCRIPT = Path("build") / "cli-client" / "sandbox"


class BuildError(DistutilsSetupError):
    """A build that cannot succeed here; the message says what to install."""


def toolchain_problems(cc: str) -> list[str]:
    """What is missing to build the C core: the sources, a C compiler, the
    Python headers, the kernel's UAPI headers. Each line says what to install."""
    problems = []
    sources = _with_headers({*LIB_SOURCES, *(s for srcs, _ in EXECUTABLES.values() for s in srcs)})
    missing = sorted(s for s in sources if not csrc_path(s).is_file())
    if missing:
        problems.append(f"csrc/ lacks {', '.join(missing)}: the source tree is incomplete "
                        "(an sdist must carry csrc/*.c and csrc/*.h; see MANIFEST.in)")
    if shutil.which(cc.split()[0]) is None:
        problems.append(f"no C compiler ({cc!r} is not on PATH): install gcc "
                        "(Debian/Ubuntu: apt-get install gcc libc6-dev; Fedora: dnf install gcc)")
        return problems
    include = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not include.is_file():
        problems.append(f"no Python headers ({include} is missing): install the headers of this "
                        f"Python {sys.version_info.major}.{sys.version_info.minor} "
                        "(Debian/Ubuntu: apt-get install python3-dev; Fedora: dnf install python3-devel)")
    uapi = sorted({h for s in sources for h in _includes(s, r"<((?:linux|asm)/[\w./]+)>")})
    probe = "".join(f"#include <{h}>\n" for h in uapi)
    result = subprocess.run([*cc.split(), "-E", "-x", "c", "-o", os.devnull, "-"], input=probe,
                            capture_output=True, text=True)
    if result.returncode != 0:
        first = next((ln for ln in result.stderr.splitlines() if "error" in ln), result.stderr.strip())
        problems.append(f"the kernel's UAPI headers are missing or too old ({first.strip()}); the core needs "
                        "those of Linux 5.13 or later (linux/landlock.h, linux/openat2.h, linux/mount.h): "
                        "install linux-libc-dev (Debian/Ubuntu) or kernel-headers (Fedora)")
    return problems


def _includes(name: str, pattern: str) -> list[str]:
    """The #include targets in csrc/'s `name` that match `pattern` (none if it is missing)."""
    path = csrc_path(name)
    return re.findall(rf"^#include {pattern}", path.read_text(), re.M) if path.is_file() else []


def _with_headers(sources: set[str]) -> set[str]:
    """`sources` and every csrc/ header they include, directly or not."""
    found, todo = set(sources), list(sources)
    while todo:
        for header in _includes(todo.pop(), r'"([\w.]+)"'):
            if header not in found:
                found.add(header)
                todo.append(header)
    return found


def client_libc() -> str:
    """The libc the executables exec'd per command are built with: "musl"
    where musl-gcc is on PATH (Debian: apt-get install musl-tools), else
    "glibc" (the compiler's own); $SANDBOX_CLIENT_LIBC=glibc|musl forces one."""
    wanted = os.environ.get(CLIENT_LIBC_ENV, "")
    if wanted not in ("", "auto", "glibc", "musl"):
        raise BuildError(f"${CLIENT_LIBC_ENV}={wanted!r}: say glibc, musl or auto")
    if wanted == "musl" and shutil.which("musl-gcc") is None:
        raise BuildError(f"${CLIENT_LIBC_ENV}=musl but musl-gcc is not on PATH: install musl-tools (Debian/Ubuntu)")
    if wanted in ("", "auto"):
        return "musl" if shutil.which("musl-gcc") else "glibc"
    return wanted


class BuildWithExecutables(build_ext):
    """build_ext that checks the toolchain first and also links the helper
    executables next to the module. Nothing is skipped: a missing source or
    tool fails the build with what to install."""

    def run(self) -> None:
        cc = compiler()
        problems = toolchain_problems(cc)
        if problems:
            raise BuildError("cannot build sandbox's C core:\n  - " + "\n  - ".join(problems))
        target = Path(self.get_ext_fullpath("sandbox._native"))
        for other in target.parent.glob("_native.*so"):
            if other.name != target.name:  # e.g. a per-version build would shadow the abi3 module
                other.unlink()
        super().run()
        out_dir = target.parent / "_bin"
        out_dir.mkdir(parents=True, exist_ok=True)
        names = Path(self.build_temp) / "sbx_names.c"  # the generated enum names (build_ffi.names_source)
        names.parent.mkdir(parents=True, exist_ok=True)
        names.write_text(names_source())
        words = names.with_name("sbx_words.c")  # errno texts and signal names as this Python words them
        words.write_text(words_source())
        libc = client_libc()
        self.announce(f"sandbox: {', '.join(CLIENT_EXECUTABLES)} built with {libc} "
                      f"(${CLIENT_LIBC_ENV}=glibc|musl chooses; musl: musl-gcc, from musl-tools)", level=3)
        musl = ["musl-gcc", *musl_flags(cc, Path(self.build_temp) / "musl-uapi")] if libc == "musl" else []
        for name, (sources, extra) in EXECUTABLES.items():
            paths = [str(csrc_path(s)) for s in sources] + ([str(names), str(words)] if "messages.c" in sources else [])
            compile_with = musl if name in CLIENT_EXECUTABLES and musl else cc.split()
            cmd = [*compile_with, *CFLAGS, *extra, "-o", str(out_dir / name), *paths]
            self.announce(" ".join(cmd), level=2)
            if subprocess.run(cmd).returncode != 0:
                raise BuildError(f"linking {name} failed (the compiler's message is above): {' '.join(cmd)}")
        shutil.copy(csrc_path("cliwire.h"), out_dir / "cliwire.h")  # the client's wire, read by sandbox._core.cliwire
        (HERE / CLIENT_SCRIPT).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(out_dir / "sandbox-cli", HERE / CLIENT_SCRIPT)


class BuildPyWithoutStaleModules(build_py):
    """build_py that first removes the modules an earlier build left in build/lib
    that the source tree no longer has (pip builds in the tree's build/ and
    reuses it: a moved or deleted module would be packaged again)."""

    def run(self) -> None:
        current = {Path(self.build_lib, *package.split("."), Path(path).name)
                   for package, _, path in self.find_all_modules()}
        root = Path(self.build_lib, "sandbox")
        for stale in [p for p in root.rglob("*.py") if p not in current] if root.is_dir() else []:
            stale.unlink()
        super().run()


class BuildScriptsWithClient(Distribution().get_command_class("build_scripts")):  # type: ignore[misc]
    """build_scripts for the one script, CLIENT_SCRIPT: an executable (built by
    build_ext, which runs first), copied as it is (the stock command would
    read it as a Python script to fix its `#!` line)."""

    def run(self) -> None:
        self.mkpath(self.build_dir)
        target = Path(self.build_dir) / CLIENT_SCRIPT.name
        self.copy_file(str(HERE / CLIENT_SCRIPT), str(target))
        target.chmod(0o755)


setup(
    cffi_modules=["build_ffi.py:ffibuilder"],
    cmdclass={"build_ext": BuildWithExecutables, "build_py": BuildPyWithoutStaleModules,
              "build_scripts": BuildScriptsWithClient},
    package_data={"sandbox": ["_bin/*", "py.typed"]},
    scripts=[str(CLIENT_SCRIPT)],
    # The module uses only the stable ABI (cffi defines Py_LIMITED_API): one
    # wheel, tagged cp311-abi3, serves every CPython from 3.11 on.
    options={"bdist_wheel": {"py_limited_api": "cp311"}},
)
