"""The executables exec'd per command (the installed `sandbox` client and sandbox-launch) are static, built
with musl where musl-gcc is installed (setup.py's client_libc), and word their failures as the Python CLI
does whatever libc they were built with.

musl's start-up runs no CPUID instruction (glibc's runs ~70, a VM exit each in a guest: ~0.5 ms a start),
but musl's strerror words errnos its own way ("Symbolic link loop" for ELOOP, "Out of memory" for ENOMEM):
the client and the launcher take the Python CLI's words from a table generated at build time.
"""

from __future__ import annotations

import errno
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import cli_install, cli_served  # noqa: F401  (the fixtures `install` and `served`)

import sandbox
from sandbox.launcher import launcher_argv, launcher_path

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
EXECUTABLES = {"sandbox": BIN / "sandbox", "sandbox-launch": Path(launcher_path())}
SYSTEM = ["--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
          "--symlink", "usr/lib64", "/lib64"]
PT_INTERP = 3


def elf_facts(path: Path) -> tuple[bool, set[str]]:
    """Whether the 64-bit little-endian ELF `path` names a dynamic loader (a PT_INTERP
    segment), and its section names."""
    data = path.read_bytes()
    assert data[:6] == b"\x7fELF\x02\x01", f"{path}: not a 64-bit little-endian ELF"
    phoff, shoff = struct.unpack_from("<QQ", data, 0x20)
    phentsize, phnum, shentsize, shnum, shstrndx = struct.unpack_from("<HHHHH", data, 0x36)
    interp = any(struct.unpack_from("<I", data, phoff + i * phentsize)[0] == PT_INTERP for i in range(phnum))
    strtab_off = struct.unpack_from("<Q", data, shoff + shstrndx * shentsize + 0x18)[0]
    names = set()
    for i in range(shnum):
        name_off = struct.unpack_from("<I", data, shoff + i * shentsize)[0]
        start = strtab_off + name_off
        names.add(data[start:data.index(b"\0", start)].decode())
    return interp, names


def expected_libc() -> str:
    """What setup.py's client_libc chose, were the package built in this environment."""
    forced = os.environ.get("SANDBOX_CLIENT_LIBC", "auto")
    if forced in ("glibc", "musl"):
        return forced
    return "musl" if shutil.which("musl-gcc") else "glibc"


@pytest.mark.parametrize("name", list(EXECUTABLES))
def test_the_executables_run_per_command_are_static_and_of_the_chosen_libc(name):
    """glibc's crt1.o carries the .note.ABI-tag note ("for GNU/Linux 3.2.0"); musl's has none. CI installs
    musl-tools, so there this proves the installed client and launcher are the musl ones."""
    interp, sections = elf_facts(EXECUTABLES[name])
    assert not interp, f"{name} is dynamically linked"
    built_with = "glibc" if ".note.ABI-tag" in sections else "musl"
    assert built_with == expected_libc(), f"{name} is built with {built_with}"


def test_the_launcher_words_a_setup_failure_as_the_python_backend(tmp_path):
    """A bind source that is a symbolic link loop: ELOOP, which musl words otherwise."""
    loop = tmp_path / "a"
    loop.symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(loop)
    tmp_path.chmod(0o755)
    spec = sandbox.Spec(mounts=[sandbox.RoBind("/usr", "/usr"), sandbox.Symlink("usr/bin", "/bin"),
                                sandbox.Symlink("usr/lib", "/lib"), sandbox.Symlink("usr/lib64", "/lib64"),
                                sandbox.RoBind(str(loop), "/x")])
    with pytest.raises(sandbox.SetupError) as raised:
        sandbox.run(["true"], spec)
    argv = launcher_argv(spec, ["true"], "/")
    assert argv[0] == str(EXECUTABLES["sandbox-launch"]), "the native launcher is not what runs here"
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd="/")
    assert str(raised.value).endswith(f": {os.strerror(errno.ELOOP)}")
    assert (result.returncode, result.stderr) == (125, f"sandbox: {raised.value}\n")


def test_the_client_words_a_failed_exec_as_the_python_cli(tmp_path):
    """The client's own message (cliclient.c: it cannot exec its sandbox-py) against Python's words."""
    root = tmp_path / "bin"
    root.mkdir()
    shutil.copy2(EXECUTABLES["sandbox"], root / "sandbox")
    (root / "sandbox-py").symlink_to(root / "loop")  # a loop where it execs its Python CLI
    (root / "loop").symlink_to(root / "sandbox-py")
    result = subprocess.run([str(root / "sandbox"), "probe"], capture_output=True, text=True, timeout=60,
                            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    assert (result.returncode, result.stderr) == (
        125, f"sandbox: can't run {root}/sandbox-py: {os.strerror(errno.ELOOP)}\n")


# A caller that blocked signal 34 (glibc's SIGRTMIN; one of musl's own, which musl's first sigaction()
# with a handler unblocks in the process): the command's mask is still the Python backend's.
MASKED_CALLER = """
import signal, subprocess, sys
import sandbox
from sandbox.launcher import launcher_argv
signal.pthread_sigmask(signal.SIG_BLOCK, {33, 34, 40, signal.SIGUSR1})
spec = sandbox.Spec(mounts=[sandbox.RoBind("/", "/")])
argv = ["grep", "^SigBlk", "/proc/self/status"]
print(subprocess.run(launcher_argv(spec, argv, "/"), capture_output=True, text=True).stdout, end="")
print(sandbox.run(argv, spec, capture_output=True, text=True).stdout, end="")
print(subprocess.run([sys.argv[1], "run", "--ro-bind", "/", "/", *argv], capture_output=True, text=True).stdout, end="")
"""


def test_a_callers_blocked_signals_reach_the_command_as_with_the_python_backend(served):
    """sandbox-launch, the Python backend and a served client's plan (its server: the fixture's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_")}
    result = subprocess.run([sys.executable, "-c", MASKED_CALLER, str(served.client)], capture_output=True,
                            text=True, timeout=60, env=env, cwd="/")
    lines = result.stdout.splitlines()
    assert len(lines) == 3 and len(set(lines)) == 1, (result.stdout, result.stderr)
    assert served.plans() == 1
