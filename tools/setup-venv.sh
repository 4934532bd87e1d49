#!/usr/bin/env bash
# Install the package (and the test tools) into a venv made with the system
# python3, in a place every user can read; print the venv's path.
# Used by run-demo.sh and run-tests.sh. Needs gcc and the Python headers
# (Debian: python3-dev python3-venv); as root it installs bubblewrap too.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
PY=${SANDBOX_PYTHON:-/usr/bin/python3}
if [ "$(id -u)" = 0 ]; then venv=${SANDBOX_VENV:-/opt/sandbox-venv}; else venv=${SANDBOX_VENV:-$HOME/.cache/sandbox-venv}; fi
if [ "$(id -u)" = 0 ] && ! command -v bwrap >/dev/null; then
    apt-get update -qq >&2 && apt-get install -y -qq bubblewrap >&2
fi
[ -x "$venv/bin/python" ] || "$PY" -m venv "$venv" >&2
"$venv/bin/pip" install -q --upgrade pip >&2
"$venv/bin/pip" install -q "$src" pytest hypothesis >&2
chmod -R a+rX "$venv"
echo "$venv"
