#!/usr/bin/env bash
# Set up (tools/setup-venv.sh: a venv with the package installed) and run one
# real sandboxed command, showing what it sees and which backend ran it.
# It runs the installed `sandbox` command, from /, so the checkout's own
# sandbox/ (the source, without its compiled core) is never what runs.
# SANDBOX_DEMO_REQUIRE_NATIVE=1 (CI) makes it fail unless the native backend can run.
set -euo pipefail
src=$(cd "$(dirname "$0")" && pwd)
venv=$("$src/tools/setup-venv.sh")
sandbox="$venv/bin/sandbox"
cd /
echo "== what this host allows (sandbox probe)"
probe=$("$sandbox" probe)
echo "$probe"
if [ -n "${SANDBOX_DEMO_REQUIRE_NATIVE:-}" ] && ! grep -q "^native backend: yes" <<<"$probe"; then
    echo "run-demo: the native backend cannot run here (see above)" >&2
    exit 1
fi
echo
echo "== a shell in a sandbox: read-only /usr, private /tmp, /proc, /dev, no network but lo, no /home or /root"
set -x
"$sandbox" run --verbose \
    --ro-bind /usr /usr --symlink usr/bin /bin --symlink usr/lib /lib --symlink usr/lib64 /lib64 \
    --proc /proc --dev /dev --tmpfs /tmp --unshare-all --hostname demo --new-session --die-with-parent --close-fds \
    --clearenv --setenv PATH /usr/bin -- \
    sh -c 'echo "hostname: $(hostname)  pid: $$  id: $(id)"; echo "pid 1: $(cat /proc/1/comm)"
           echo "/: $(ls / | tr "\n" " ")"; grep -E "^ *[a-z0-9]+:" /proc/net/dev;
           ls -d /home /root /etc 2>&1; touch /usr/x 2>&1; echo hello > /tmp/x && cat /tmp/x'
