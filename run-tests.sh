#!/usr/bin/env bash
# Set up everything and run the whole test suite: once as the calling user
# and, when that is root, again as an unprivileged user (most users of the
# sandbox are not root). Usage: ./run-tests.sh [pytest args...]
#
# The package is installed (not editable) into a venv made with the system
# python3, in a world-readable place, and the tests run from a staged copy,
# so the unprivileged run imports exactly what a user would.
set -euo pipefail
src=$(cd "$(dirname "$0")" && pwd)
PY=${SANDBOX_PYTHON:-/usr/bin/python3}
if [ "$(id -u)" = 0 ]; then venv=${SANDBOX_VENV:-/opt/sandbox-venv}; else venv=${SANDBOX_VENV:-$HOME/.cache/sandbox-venv}; fi
test_user=${SANDBOX_TEST_USER:-sbxtest}

if [ "$(id -u)" = 0 ] && ! command -v bwrap >/dev/null; then
    apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null
fi
[ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip >/dev/null
"$venv/bin/pip" install -q "$src" pytest hypothesis

stage=$(mktemp -d /tmp/sandbox-tests.XXXXXX)
trap 'rm -rf "$stage"' EXIT
cp -r "$src/tests" "$src/pyproject.toml" "$stage/"
chmod -R a+rX "$stage" "$venv"
chmod 755 "$stage"

run_pytest() {  # run_pytest LABEL [runner...] -- pytest args
    local label=$1; shift
    echo "=== tests as $label ==="
    set +e
    (cd "$stage" && "$@")
    local rc=$?
    set -e
    if [ $rc = 5 ]; then echo "no tests ran as $label" >&2; return 1; fi
    return $rc
}

rc=0
run_pytest "$(id -un) (uid $(id -u))" "$venv/bin/python" -m pytest -p no:cacheprovider "${@:--q}" tests || rc=1
if [ "$(id -u)" = 0 ] && [ -z "${SANDBOX_SKIP_UNPRIVILEGED:-}" ]; then
    id "$test_user" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$test_user"
    run_pytest "$test_user (unprivileged)" runuser -u "$test_user" -- env HOME="$stage" \
        "$venv/bin/python" -m pytest -p no:cacheprovider "${@:--q}" tests || rc=1
fi
exit $rc
