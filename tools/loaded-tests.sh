#!/usr/bin/env bash
# Run a pytest selection (default: the whole suite) the way a busy shared CI host runs it: started as a
# background job (SIGINT and SIGQUIT ignored), beside other work started the same way at `nice 19`:
#   - a CPU hog per CPU;
#   - a loop that mounts and unmounts a tmpfs, in a mount namespace of its own (unshare -m); as root,
#     on a folder shared with the namespace the tests run in, so that its mounts come and go in the
#     tests' own mount table as another job's fuse mount does (the tests then run in a private mount
#     namespace made for this run: nothing of it reaches the host's);
#   - a loop that forks short-lived processes.
# All of them are stopped (by their process group) and their folder removed by the trap, whatever
# happens. Usage: tools/loaded-tests.sh [pytest args...]   (paths relative to the checkout)
# The venv is tools/setup-venv.sh's ($SANDBOX_VENV, or as it chooses); it is not reinstalled here.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
if [ "$(id -u)" = 0 ]; then venv=${SANDBOX_VENV:-/opt/sandbox-venv}; else venv=${SANDBOX_VENV:-$HOME/.cache/sandbox-venv}; fi
[ -x "$venv/bin/python" ] || venv=$("$src/tools/setup-venv.sh")
[ $# -gt 0 ] || set -- -q -ra tests
say() { echo "loaded-tests: $*" >&2; }

if [ "$(id -u)" = 0 ] && [ -z "${SANDBOX_LOADED_NS:-}" ]; then
    # A private mount namespace for the whole run: the mount loop's mounts reach the tests, not the host.
    SANDBOX_LOADED_NS=1 exec unshare --mount --propagation private -- "$0" "$@"
fi

work=$(mktemp -d /tmp/loaded-tests.XXXXXX)
groups=()
stop() {
    local g
    for g in "${groups[@]}"; do kill -KILL -- "-$g" 2>/dev/null || true; done
    for g in "${groups[@]}"; do wait "$g" 2>/dev/null || true; done
    if [ -n "${SANDBOX_LOADED_NS:-}" ]; then umount -R "$work/shared" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap stop EXIT
trap 'exit 130' INT TERM

background() {  # background CMD...: in a session (and process group) of its own, SIGINT/SIGQUIT ignored, nice 19
    setsid nice -n 19 bash -c 'trap "" INT QUIT; exec "$@"' bash "$@" </dev/null >/dev/null 2>&1 &
    groups+=($!)
}

for _ in $(seq "$(nproc)"); do
    background bash -c 'while :; do :; done'
done
mkdir "$work/shared"
if [ -n "${SANDBOX_LOADED_NS:-}" ]; then
    mount --bind "$work/shared" "$work/shared"
    mount --make-shared "$work/shared"
    mounter=(unshare --mount --propagation unchanged)  # its mounts on the shared folder propagate here
else
    mounter=(unshare --user --map-root-user --mount)  # load only: its mounts stay in its namespace
fi
background "${mounter[@]}" bash -c 'mkdir -p "$0/m"; while :; do
    mount -t tmpfs loaded-tests "$0/m" && sleep 0.05 && umount "$0/m"; sleep 0.02; done' "$work/shared"
background bash -c 'while :; do for _ in 1 2 3 4 5 6 7 8; do sleep 0.01 & done; wait; done'
say "load: ${#groups[@]} background jobs (CPU hogs, a mount loop$([ -n "${SANDBOX_LOADED_NS:-}" ] &&
    echo ' visible to the tests'), a fork loop); running pytest $*"

set +e
(cd "$src" && trap '' INT QUIT && exec "$venv/bin/python" -m pytest -p no:cacheprovider "$@") </dev/null
rc=$?
set -e
exit $rc
