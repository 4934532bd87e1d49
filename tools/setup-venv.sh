#!/usr/bin/env bash
# Install the package with its test extra (or $SANDBOX_EXTRAS, e.g.
# "test,ray,bench" as CI has it) into a venv made with the system
# python3, in a place every user can read; print the venv's path on stdout
# (progress goes to stderr). Used by run-demo.sh and run-tests.sh.
#
# What it changes on this machine:
# - as root, without bwrap: `apt-get install bubblewrap` (the fallback backend);
# - as root, without musl-gcc, where apt-get is: `apt-get install musl-tools`
#   (the client and sandbox-launch are then built with musl; if it cannot be
#   installed, they are built with glibc and this says so);
# - the venv: /opt/sandbox-venv as root, ~/.cache/sandbox-venv otherwise, or
#   $SANDBOX_VENV; made once (pip is upgraded then, not on every run) and
#   made world-readable (the tests run again as an unprivileged user);
# - this checkout's build/ (pip builds the C core there; stale modules are
#   dropped and a changed header rebuilds the core, see setup.py).
# Needs gcc, the Python headers and the kernel headers (Debian: gcc
# python3-dev python3-venv linux-libc-dev); a missing one fails the build
# with what to install. With musl-gcc (Debian: musl-tools) the `sandbox`
# client and sandbox-launch are built with musl, ~0.5 ms faster a command
# on a VM (setup.py, docs/install.md). $SANDBOX_PYTHON picks another interpreter.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
PY=${SANDBOX_PYTHON:-/usr/bin/python3}
if [ "$(id -u)" = 0 ]; then venv=${SANDBOX_VENV:-/opt/sandbox-venv}; else venv=${SANDBOX_VENV:-$HOME/.cache/sandbox-venv}; fi
say() { echo "setup-venv: $*" >&2; }
if [ "$(id -u)" = 0 ] && ! command -v bwrap >/dev/null; then
    say "installing bubblewrap (apt-get)"
    apt-get update -qq >&2 && apt-get install -y -qq bubblewrap >&2
fi
if [ "$(id -u)" = 0 ] && ! command -v musl-gcc >/dev/null && command -v apt-get >/dev/null; then
    say "installing musl-tools (apt-get): the sandbox client and sandbox-launch start ~0.5 ms sooner built with musl"
    { apt-get update -qq && apt-get install -y -qq musl-tools; } >&2 \
        || say "musl-tools could not be installed: the client and sandbox-launch are built with glibc"
fi
if [ ! -x "$venv/bin/python" ]; then
    say "creating the venv $venv with $PY"
    "$PY" -m venv "$venv" >&2
    "$venv/bin/pip" install -q --upgrade pip >&2
fi
extras=${SANDBOX_EXTRAS:-test}
from=$src
if [ ! -w "$src" ]; then
    # pip builds in the source tree (its egg-info, build/): from a checkout this user cannot write (another
    # user's, or root's, as with run-demo.sh run unprivileged) it would fail there; build a copy instead.
    from=$(mktemp -d "${TMPDIR:-/tmp}/sandbox-build.XXXXXX")
    trap 'rm -rf "$from"' EXIT
    say "$src is not writable by $(id -un): building from a copy of it in $from"
    (cd "$src" && cp -r setup.py pyproject.toml build_ffi.py README.md LICENSE MANIFEST.in csrc sandbox "$from/")
fi
say "building the C core and installing sandbox[$extras] from $src into $venv (about 20 s)"
"$venv/bin/pip" install -q "$from[$extras]" >&2
chmod -R a+rX "$venv"
say "ready: $("$venv/bin/sandbox" --version)"
echo "$venv"
