#!/usr/bin/env bash
# The static stage: what can be found without building or running anything,
# in seconds, so that CI (.ci/run) fails on it before its slow stages.
#   1. C: every csrc/*/*.c, the generated enum-name table and the cffi module's
#      generated C (sandbox._native), checked with gcc and with clang
#      (-fsyntax-only) under the build's flags (build_ffi.CFLAGS: bubblewrap's
#      -Werror= set) and -Werror for every other warning; sandbox-init both
#      freestanding and with libc, as setup.py builds it on and off x86_64;
#      and every csrc/*/*.c again against musl (musl-gcc, and clang with musl's
#      headers), as setup.py builds the client and the launcher where
#      musl-gcc is installed;
#   2. ruff check . (pyproject.toml [tool.ruff]);
#   3. mypy --strict -p sandbox, and the README's examples as a user of the
#      package would write them (tests/typing/readme_examples.py; the test
#      suite checks them against the installed package too);
#   4. commit subjects of at most 72 characters (tools/check-subjects.sh),
#      for every commit since the rule was enforced.
# Usage: tools/check-static.sh [C|ruff|mypy|subjects...] (default: all four). Runs with
# the venv of tools/setup-venv.sh ($SANDBOX_VENV, else its default), made with
# it when it lacks ruff or mypy (the test extra has both); needs gcc, clang and
# musl-gcc (Debian: musl-tools).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
cd "$src"
if [ "$(id -u)" = 0 ]; then venv=${SANDBOX_VENV:-/opt/sandbox-venv}; else venv=${SANDBOX_VENV:-$HOME/.cache/sandbox-venv}; fi
if [ ! -x "$venv/bin/ruff" ] || [ ! -x "$venv/bin/mypy" ]; then
    venv=$(tools/setup-venv.sh)
fi
py=$venv/bin/python
[ $# -gt 0 ] || set -- C ruff mypy subjects
say() { echo "== check-static: $*"; }
failed=()
start=$EPOCHREALTIME
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

check_c() {
    local work cc
    for cc in gcc clang; do
        command -v "$cc" >/dev/null || { echo "check-static: $cc is missing (Debian: apt-get install $cc)" >&2; return 1; }
    done
    command -v musl-gcc >/dev/null || { echo "check-static: musl-gcc is missing (Debian: apt-get install musl-tools)" >&2; return 1; }
    work=$(mktemp -d /tmp/sandbox-static.XXXXXX)
    # build_ffi's own flags (per compiler, as a build filters them), the generated sources, Python's headers
    "$py" - "$work" > /dev/null <<'EOF'
import subprocess, sys, sysconfig
from pathlib import Path
import build_ffi
work = Path(sys.argv[1])
musl = build_ffi.musl_flags("gcc", work / "musl-uapi")  # the kernel's headers, which musl's lack
search = subprocess.run(["musl-gcc", "-E", "-Wp,-v", "-x", "c", "/dev/null"], capture_output=True, text=True).stderr
musl_include = search.split("search starts here:")[-1].split()[0]  # musl's own headers, first
resources = subprocess.run(["clang", "-print-resource-dir"], capture_output=True, text=True).stdout.strip()
for cc, compiler, extra in (
        ("gcc", "gcc", []), ("clang", "clang", []), ("gcc-musl", "musl-gcc", musl),
        # musl's CMSG_NXTHDR compares a signed and an unsigned length: gcc keeps quiet in a system
        # header's macro, clang does not
        ("clang-musl", "clang", ["--target=x86_64-linux-musl", "-nostdinc", "-isystem", f"{resources}/include",
                                 "-isystem", musl_include, *musl, "-Wno-sign-compare"])):
    flags = ["-O2", "-Wall", "-Wextra", "-fno-strict-aliasing", *build_ffi.supported_flags(compiler, build_ffi.WARNING_FLAGS)]
    (work / f"{cc}.flags").write_text("\n".join([compiler, *flags, *extra]) + "\n")
(work / "sbx_names.c").write_text(build_ffi.names_source())
(work / "sbx_words.c").write_text(build_ffi.words_source())
build_ffi.ffibuilder.emit_c_code(str(work / "sandbox._native.c"))
(work / "include").write_text(sysconfig.get_paths()["include"])
EOF
    local jobs=() f
    for cc in gcc clang gcc-musl clang-musl; do
        for f in csrc/*/*.c "$work/sbx_names.c" "$work/sbx_words.c"; do
            jobs+=("$cc|$f|")
        done
        jobs+=("$cc|csrc/init/init.c|-DSBX_INIT_LIBC")
    done
    jobs+=("gcc|$work/sandbox._native.c|-I$(cat "$work/include")" "clang|$work/sandbox._native.c|-I$(cat "$work/include")")
    # one compiler run per line, as many at a time as there are CPUs; a failure names its command
    printf '%s\n' "${jobs[@]}" | CSRC="$src/csrc" WORK="$work" xargs -d '\n' -n 1 -P "$(nproc)" bash -c '
        IFS="|" read -r cc file extra <<< "$1"
        mapfile -t flags < "$WORK/$cc.flags"  # the compiler, then its options
        cmd=("${flags[@]}" -Werror -I"$CSRC"/{core,client,template,session,init} ${extra:+"$extra"} -fsyntax-only "$file")
        "${cmd[@]}" || { echo "FAILED: ${cmd[*]}" >&2; exit 1; }' _
    local rc=$?
    rm -rf "$work"
    return $rc
}

for stage in "$@"; do
    t0=$EPOCHREALTIME
    case $stage in
        C) say "C: csrc/*/*.c and the generated C, gcc and clang, glibc and musl, bubblewrap's -Werror= set and -Werror"
           check_c || failed+=(C) ;;
        ruff) say "ruff check ."
           "$venv/bin/ruff" check . || failed+=(ruff) ;;
        mypy) say "mypy --strict -p sandbox -m readme_examples (tests/typing/readme_examples.py)"
           # one run, one cache (.mypy_cache: a second run takes under a second)
           MYPYPATH=tests/typing "$py" -m mypy --strict -p sandbox -m readme_examples || failed+=(mypy) ;;
        subjects) say "commit subjects of at most 72 characters"
           tools/check-subjects.sh || failed+=(subjects) ;;
        *) echo "check-static: unknown stage $stage (C, ruff, mypy, subjects)" >&2; exit 2 ;;
    esac
    echo "   ($stage: $(since "$t0") s)"
done
say "$(since "$start") s in all"
if [ ${#failed[@]} -gt 0 ]; then
    echo "check-static: FAILED: ${failed[*]}" >&2
    exit 1
fi
echo "check-static: clean"
