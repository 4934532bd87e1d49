#!/usr/bin/env bash
# Set up everything and run one real sandboxed command, showing what it sees.
set -euo pipefail
src=$(cd "$(dirname "$0")" && pwd)
venv=$("$src/tools/setup-venv.sh")
py="$venv/bin/python"
echo "== what this host allows"
"$py" -m sandbox probe
echo
echo "== a shell in a sandbox: read-only /usr, private /tmp, /proc, /dev, no network but lo, no /home or /root"
set -x
"$py" -m sandbox run --ro-bind /usr /usr --symlink usr/bin /bin --symlink usr/lib /lib --symlink usr/lib64 /lib64 \
    --proc /proc --dev /dev --tmpfs /tmp --unshare-all --hostname demo --new-session --die-with-parent --close-fds \
    --clearenv --setenv PATH /usr/bin -- \
    sh -c 'echo "hostname: $(hostname)  pid: $$  id: $(id)"; echo "/: $(ls / | tr "\n" " ")"; grep -E "^ *[a-z0-9]+:" /proc/net/dev;
           ls -d /home /root /etc 2>&1; touch /usr/x 2>&1; echo hello > /tmp/x && cat /tmp/x'
