"""cffi build script (out-of-line API mode) for the C core in csrc/.

The cdef is the CDEF region of csrc/core/sandbox.h, read here, never retyped.
Two tables are generated at build time: the syscall table, from the kernel
headers of the build host (the preprocessor lists the __NR_* names and the C
compiler resolves them), and the names of sandbox.h's enums (names_source;
setup.py compiles the same text into sandbox-launch). A third, for the
executables only (words_source): errno texts and signal names as this
Python words them, so that a client built with another libc (musl) prints
the Python CLI's words.
"""

from __future__ import annotations

import errno
import importlib.util
import os
import re
import signal
import subprocess
import sysconfig
from collections.abc import Callable
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
CSRC = HERE / "csrc"
# csrc/ has a folder per program: core (the library the Python module and every program but
# sandbox-init and sandbox-session link), client (sandbox-cli, sandbox-launch), template
# (sandbox-template), session (sandbox-session), init (sandbox-init). A file is named by its bare
# name (csrc_path finds its folder); every folder is on the include path.
PROGRAM_DIRS = ("core", "client", "template", "session", "init")
INCLUDE_DIRS = [CSRC / d for d in PROGRAM_DIRS]
LIB_SOURCES = [
    "util.c", "fdpass.c", "wire.c", "idmap.c", "net.c", "sources.c", "mounts.c", "limits.c", "landlock.c",
    "child.c", "vmclone.c", "spawn.c", "probe.c", "outside.c", "messages.c", "forksandbox.c", "zygote.c",
    "zygote_wire.c", "detach.c",
]
# bubblewrap's compiler discipline (its meson.build): these warnings fail the
# build, of the module and of the executables alike. bubblewrap spells one
# "-Werror=parenthesis", which no compiler knows (meson drops it); the option
# meant is -Werror=parentheses. tools/check-static.sh compiles every csrc/ file
# under these with -Werror for the rest, with gcc and clang.
WARNING_FLAGS = [
    "-Werror=shadow", "-Werror=empty-body", "-Werror=strict-prototypes", "-Werror=missing-prototypes",
    "-Werror=implicit-function-declaration", "-Werror=pointer-arith", "-Werror=init-self",
    "-Werror=missing-declarations", "-Werror=return-type", "-Werror=overflow", "-Werror=int-conversion",
    "-Werror=parentheses", "-Werror=incompatible-pointer-types", "-Werror=misleading-indentation",
    "-Werror=missing-include-dirs", "-Werror=aggregate-return", "-Werror=switch-default", "-Wswitch-enum",
    "-Wno-missing-field-initializers", "-Wno-error=missing-field-initializers",
    "-Werror=format=2", "-Werror=format-security", "-Werror=format-nonliteral",
]


def compiler() -> str:
    """The C compiler a build uses: $CC, else the one Python was built with."""
    return os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"


def uapi_dirs(cc: str) -> list[str]:
    """The directories holding the kernel's UAPI headers (linux/, asm/,
    asm-generic/) as `cc` finds them: musl-gcc searches only musl's own
    headers, which do not carry them. None if `cc` cannot find them."""
    probe = "#include <linux/types.h>\n#include <asm/types.h>\n"
    result = subprocess.run([*cc.split(), "-M", "-x", "c", "-"], input=probe, capture_output=True, text=True)
    found = re.findall(r"(\S+)/(linux|asm|asm-generic)/types\.h", result.stdout)
    return sorted({f"{base}/{name}" for base, name in found}) if result.returncode == 0 else []


def musl_flags(cc: str, links: Path) -> list[str]:
    """The options that let musl-gcc compile csrc/: an -isystem of `links`, a
    directory made here of links to the UAPI header directories of `cc`'s
    (only those: the rest of /usr/include is glibc's)."""
    links.mkdir(parents=True, exist_ok=True)
    for target in uapi_dirs(cc):
        link = links / Path(target).name
        if not link.is_symlink() or os.readlink(link) != target:
            link.unlink(missing_ok=True)
            link.symlink_to(target)
    return ["-isystem", str(links)]


def supported_flags(cc: str, flags: list[str]) -> list[str]:
    """The options of `flags` that `cc` accepts (as meson's get_supported_arguments:
    an older compiler lacks some). All of them when the compiler cannot be run:
    the build then fails on the compiler itself, saying what to install."""
    def accepts(options: list[str]) -> bool:
        try:
            return subprocess.run([*cc.split(), "-Werror", *options, "-fsyntax-only", "-x", "c", os.devnull],
                                  capture_output=True).returncode == 0
        except OSError:
            return True
    return flags if accepts(flags) else [f for f in flags if accepts([f])]


CFLAGS = ["-O2", "-Wall", "-Wextra", "-fno-strict-aliasing", *supported_flags(compiler(), WARNING_FLAGS)]
# Every header of csrc/: the module depends on them (a header-only change rebuilds it).
HEADERS = sorted(str(p.relative_to(HERE)) for p in CSRC.glob("*/*.h"))


def csrc_path(name: str) -> Path:
    """The file of csrc/ named `name` (a bare name: each is in one program's folder), as
    csrc/core/`name` if no folder has it (the caller reports it missing)."""
    return next((d / name for d in INCLUDE_DIRS if (d / name).is_file()), CSRC / "core" / name)


def _cdef_reader() -> Callable[[Path], str]:
    """sandbox/_core/cdef.py's read_cdef, loaded by path: the package is not importable while it is built."""
    spec = importlib.util.spec_from_file_location("_sandbox_cdef", HERE / "sandbox" / "_core" / "cdef.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    reader: Callable[[Path], str] = module.read_cdef
    return reader


read_cdef = _cdef_reader()  # the one reader of a CDEF region


def enum_members(header: Path, enum: str) -> list[str]:
    """The member names of `enum <enum>` in `header`, in order."""
    text = re.sub(r"/\*.*?\*/", "", header.read_text(), flags=re.S)
    match = re.search(rf"enum {enum}\s*{{(.*?)}};", text, re.S)
    if not match:
        raise RuntimeError(f"{header}: no enum {enum}")
    return re.findall(r"\b(SBX_\w+)\s*=", match.group(1))


def names_table(header: Path, enum: str, prefix: str, table: str, count: str) -> str:
    """C definitions of `table` (value -> lower-case name, e.g. "uid_map") and `count` for `enum`."""
    items = ",\n    ".join(f'[{m}] = "{m[len(prefix):].lower()}"' for m in enum_members(header, enum))
    return (f"const char *const {table}[] = {{\n    {items}\n}};\n"
            f"const int {count} = sizeof {table} / sizeof *{table};\n")


def names_source(header: Path = CSRC / "core" / "sandbox.h") -> str:
    """The C source of sbx_step_names and sbx_op_kind_names, from `header`'s enums."""
    return (f'#include "{header.name}"\n'
            + names_table(header, "sbx_step", "SBX_STEP_", "sbx_step_names", "sbx_n_steps")
            + names_table(header, "sbx_op_kind", "SBX_OP_", "sbx_op_kind_names", "sbx_n_op_kinds"))


def _c_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def words_source() -> str:
    """C definitions of sbx_errno_texts (errno -> os.strerror's text, for the
    errnos Python knows) and sbx_signal_names (number -> signal.Signals'
    name, "SIGRTMIN" included): the Python CLI's words, which come from the
    libc Python runs on (glibc's here), for executables built with another
    libc (csrc/core/errtext.h)."""
    texts = ",\n    ".join(f"[{n}] = {_c_string(os.strerror(n))}" for n in sorted(set(errno.errorcode)))
    names = ",\n    ".join(f'[{int(s)}] = "{s.name}"' for s in sorted(set(signal.Signals), key=int))
    return ("#include \"errtext.h\"\n"
            f"const char *const sbx_errno_texts[] = {{\n    {texts}\n}};\n"
            "const int sbx_n_errno_texts = sizeof sbx_errno_texts / sizeof *sbx_errno_texts;\n"
            f"const char *const sbx_signal_names[] = {{\n    {names}\n}};\n"
            "const int sbx_n_signal_names = sizeof sbx_signal_names / sizeof *sbx_signal_names;\n")


def syscall_names(cc: str) -> list[str]:
    """Names of this architecture's syscalls, from <asm/unistd.h>."""
    out = subprocess.run(
        [*cc.split(), "-E", "-dM", "-include", "asm/unistd.h", "-x", "c", os.devnull],
        check=True, capture_output=True, text=True,
    ).stdout
    return sorted({m.group(1) for m in re.finditer(r"^#define __NR_(\w+)\s+\S", out, re.M)})


def syscall_table_source(names: list[str]) -> str:
    """C definitions of sbx_syscall_names/numbers for `names`."""
    quoted = ",\n    ".join(f'"{n}"' for n in names)
    numbers = ",\n    ".join(f"__NR_{n}" for n in names)
    return (
        "#include <asm/unistd.h>\n"
        f"const char *const sbx_syscall_names[] = {{\n    {quoted}\n}};\n"
        f"const int sbx_syscall_numbers[] = {{\n    {numbers}\n}};\n"
        f"const int sbx_n_syscalls = {len(names)};\n"
    )


def syscall_table_or_error(cc: str) -> str:
    """`syscall_table_source` of this host's syscalls; where the compiler or the
    kernel headers are missing, an `#error` instead. setup.py's build_ext
    checks the toolchain before compiling and says what to install, so this
    only lets an sdist be made (cffi runs this script even then)."""
    try:
        return syscall_table_source(syscall_names(cc))
    except (OSError, subprocess.CalledProcessError) as exc:
        return f'#error "cannot list the syscalls with {cc}: {exc}"\n'


def make_ffibuilder() -> FFI:
    """The FFI builder for `sandbox._native`."""
    cc = compiler()
    builder = FFI()
    builder.cdef(read_cdef(CSRC / "core" / "sandbox.h"))
    builder.set_source(
        "sandbox._native",
        # cffi defines the module's init function without a prototype (-Werror=missing-prototypes)
        "PyMODINIT_FUNC PyInit__native(void);\n" + names_source() + syscall_table_or_error(cc),
        sources=[str(csrc_path(s).relative_to(HERE)) for s in LIB_SOURCES],
        include_dirs=[f"csrc/{d}" for d in PROGRAM_DIRS],
        depends=HEADERS,
        extra_compile_args=CFLAGS,
    )
    return builder


ffibuilder = make_ffibuilder()

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
