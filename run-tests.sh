#!/usr/bin/env bash
# Set up everything and run the whole test suite: once as the calling user
# and, when that is root, again as an unprivileged user (most users of the
# sandbox are not root). Usage: ./run-tests.sh [pytest args...]
#
# The package is installed (not editable) into a venv made with the system
# python3 (tools/setup-venv.sh says where, and what else it changes). The
# first run is the developer's `pip install . && python -m pytest` from this
# checkout: the tests import the installed package, not the checkout's
# uncompiled sandbox/ (tests/_installed.py). The unprivileged run, as
# $SANDBOX_TEST_USER (default sbxtest, a system user created if missing),
# runs a world-readable staged copy of the tests.
# SANDBOX_SKIP_UNPRIVILEGED=1 skips it. The unprivileged run gets a delegated
# cgroup subtree (tools/cgroup-delegate.py, named by $SANDBOX_CGROUP_PARENT),
# unless SANDBOX_NO_CGROUP_DELEGATION=1 (then its limits fall back to rlimits).
set -euo pipefail
src=$(cd "$(dirname "$0")" && pwd)
test_user=${SANDBOX_TEST_USER:-sbxtest}
[ $# -gt 0 ] || set -- -q -ra  # default pytest options
venv=$("$src/tools/setup-venv.sh")

run_pytest() {  # run_pytest LABEL DIR [runner...] -- pytest args
    local label=$1 dir=$2; shift 2
    echo "=== tests as $label ==="
    set +e
    (cd "$dir" && "$@")
    local rc=$?
    set -e
    if [ $rc = 5 ]; then echo "no tests ran as $label" >&2; return 1; fi
    return $rc
}

rc=0
run_pytest "$(id -un) (uid $(id -u))" "$src" "$venv/bin/python" -m pytest -p no:cacheprovider "$@" || rc=1
if [ "$(id -u)" = 0 ] && [ -z "${SANDBOX_SKIP_UNPRIVILEGED:-}" ]; then
    stage=$(mktemp -d /tmp/sandbox-tests.XXXXXX)
    cgroups=""
    trap 'rm -rf "$stage"; [ -z "$cgroups" ] || python3 "$src/tools/cgroup-delegate.py" remove "$cgroups"' EXIT
    cp -r "$src/tests" "$src/pyproject.toml" "$src/README.md" "$src/docs" "$stage/"  # README, docs/: tests compare their examples and tables
    chmod -R a+rX "$stage"
    chmod 755 "$stage"
    id "$test_user" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$test_user"
    # A Session's users (tests/integration/test_session_users.py): the user gets a subordinate id range
    # (mapped by newuidmap: Debian's uidmap), and sbxnoids, a user without one, covers the one-id case.
    command -v newuidmap >/dev/null || { command -v apt-get >/dev/null && apt-get install -y -qq uidmap >&2; } || true
    id sbxnoids >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin sbxnoids
    for f in /etc/subuid /etc/subgid; do  # a range of 65536 above every range there, if the user has none
        grep -qs "^$test_user:" "$f" ||
            echo "$test_user:$(awk -F: 'BEGIN { m = 100000 } $2 + $3 > m { m = $2 + $3 } END { print m }' \
                "$f" 2>/dev/null || echo 100000):65536" >> "$f"
    done
    # A delegated cgroup subtree for the user, as systemd's Delegate=yes gives one: the sandboxes'
    # cgroups go below it ($SANDBOX_CGROUP_PARENT, sandbox/cgroups.py); on v2 the user's process lives
    # inside it (runner). Removed at exit, whatever happens (the trap).
    cg_env=() runner=""
    if [ -z "${SANDBOX_NO_CGROUP_DELEGATION:-}" ] &&
        out=$(python3 "$src/tools/cgroup-delegate.py" create "$test_user" "sandbox-tests.$$"); then
        cgroups=$(sed -n 1p <<<"$out") runner=$(sed -n 2p <<<"$out")
        cg_env=(SANDBOX_CGROUP_PARENT="$cgroups")
    fi
    enter=(env)  # moves the unprivileged run into its v2 cgroup first (as root), then runs it
    [ -z "$runner" ] || enter=(sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$runner")
    run_pytest "$test_user (unprivileged)" "$stage" "${enter[@]}" runuser -u "$test_user" -- env HOME="$stage" \
        PATH=/usr/local/bin:/usr/bin:/bin "${cg_env[@]}" "$venv/bin/python" -m pytest -p no:cacheprovider "$@" || rc=1
fi
exit $rc
