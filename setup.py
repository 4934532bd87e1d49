"""Build: the cffi extension (sandbox._native) and the helper executables.

sandbox-init (the pid-1 reaper, static so it execs fast and needs nothing
inside the sandbox) and sandbox-launch (the native launcher used by
sandbox.compat.avatar) are compiled from csrc/ into sandbox/_bin/.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
CSRC = HERE / "csrc"
sys.path.insert(0, str(HERE))
from build_ffi import CFLAGS as LIB_CFLAGS  # noqa: E402
from build_ffi import LIB_SOURCES, names_source  # noqa: E402

CFLAGS = [*LIB_CFLAGS, f"-I{CSRC}"]
# sandbox-init is freestanding on x86_64 (see csrc/init.c), static libc elsewhere.
INIT_FLAGS = (
    ["-static", "-nostdlib", "-fno-stack-protector", "-fno-builtin", "-fno-asynchronous-unwind-tables"]
    if platform.machine() == "x86_64"
    else ["-static", "-DSBX_INIT_LIBC"]
)
EXECUTABLES = {
    "sandbox-init": (["init.c"], INIT_FLAGS),
    "sandbox-launch": (["launcher.c", *LIB_SOURCES], []),
}


class BuildWithExecutables(build_ext):
    """build_ext that also links the helper executables next to the module."""

    def run(self) -> None:
        super().run()
        out_dir = Path(self.get_ext_fullpath("sandbox._native")).parent / "_bin"
        out_dir.mkdir(parents=True, exist_ok=True)
        cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
        names = Path(self.build_temp) / "sbx_names.c"  # the generated enum names (build_ffi.names_source)
        names.parent.mkdir(parents=True, exist_ok=True)
        names.write_text(names_source())
        for name, (sources, extra) in EXECUTABLES.items():
            if not all((CSRC / s).exists() for s in sources):
                continue
            paths = [str(CSRC / s) for s in sources] + ([str(names)] if "messages.c" in sources else [])
            cmd = [*cc.split(), *CFLAGS, *extra, "-o", str(out_dir / name), *paths]
            self.announce(" ".join(cmd), level=2)
            subprocess.run(cmd, check=True)


setup(
    cffi_modules=["build_ffi.py:ffibuilder"],
    cmdclass={"build_ext": BuildWithExecutables},
    package_data={"sandbox": ["_bin/*"]},
)
