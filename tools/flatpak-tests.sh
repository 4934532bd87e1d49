#!/bin/bash
# Flatpak's installed tests (Debian's flatpak-tests, run by gnome-desktop-testing-runner) with
# our `sandbox` as the `bwrap` first on PATH, compared with the real bwrap file by file.
#
#   tools/flatpak-tests.sh [-u USER] [-p JOBS] [-o DIR] [-t SECONDS] [-f REGEX] [MODE...]
#
# MODE: bwrap (the real /usr/bin/bwrap), served (our client, its CLI server allowed), direct
# (SANDBOX_CLI_SERVER=0); default: all three. -u runs them as USER (runuser; default: the caller);
# -f only the test files whose name matches REGEX (grep -E).
# Each mode's results are DIR/MODE.results ("PASS: name" / "FAIL: name" lines; a file killed at
# its timeout, default 900 s, is "TIMEOUT: name") and its logs DIR/MODE/; the exit status is 1 if
# a test file that passes with bwrap fails (not times out) with one of ours.
# Debian's flatpak runs the `bwrap` it finds on PATH (FLATPAK_BWRAP unset). Needs:
# apt-get install flatpak flatpak-tests gnome-desktop-testing. The installation tested is the
# venv of $SANDBOX_VENV (default: the `sandbox` on PATH).
set -euo pipefail

user="" jobs=3 out="" timeout=900 only="."
while getopts "u:p:o:t:f:" opt; do
    case $opt in
        u) user=$OPTARG ;;
        p) jobs=$OPTARG ;;
        o) out=$OPTARG ;;
        t) timeout=$OPTARG ;;
        f) only=$OPTARG ;;
        *) sed -n '2,14p' "$0" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -gt 0 ] || set -- bwrap served direct
command -v gnome-desktop-testing-runner >/dev/null && [ -d /usr/share/installed-tests/Flatpak ] || {
    echo "flatpak-tests: needs flatpak, flatpak-tests and gnome-desktop-testing installed" >&2; exit 2; }
if [ -n "${SANDBOX_VENV:-}" ]; then client=$SANDBOX_VENV/bin/sandbox; else client=$(command -v sandbox); fi
[ -x "$client" ] || { echo "flatpak-tests: no sandbox client at ${client:-PATH}" >&2; exit 2; }
out=${out:-$(mktemp -d /tmp/flatpak-tests.XXXXXX)}
mkdir -p "$out"
chmod 755 "$out"

run_mode() {  # run_mode MODE: the whole suite with that bwrap, its results in $out/MODE.results
    local mode=$1 shim="$out/$1.bin" home="$out/$1.home" env=()
    rm -rf "$shim" "$home" "$out/$mode"
    mkdir -p "$shim" "$home"
    case $mode in
        bwrap) ln -s /usr/bin/bwrap "$shim/bwrap" ;;
        served) ln -s "$client" "$shim/bwrap" ;;
        direct) ln -s "$client" "$shim/bwrap"; env=(SANDBOX_CLI_SERVER=0) ;;
        *) echo "flatpak-tests: unknown mode $mode" >&2; return 2 ;;
    esac
    local runner=(env)
    if [ -n "$user" ]; then
        chown "$user" "$home"
        runner=(runuser -u "$user" -- env)
    fi
    local start=$SECONDS
    mkdir -p "$out/$mode"
    # one runner per test file, JOBS at once: a file that hangs or kills its group takes no other with it
    (cd "$home" && ls /usr/share/installed-tests/Flatpak/ | grep '\.test$' | grep -E -- "$only" |
        xargs -P "$jobs" -I{} sh -c 'exec "$@" > "$0/{}.log" 2>&1' "$out/$mode" \
        "${runner[@]}" -u FLATPAK_BWRAP HOME="$home" PATH="$shim:/usr/local/bin:/usr/bin:/bin" "${env[@]}" \
        gnome-desktop-testing-runner -t "$timeout" "Flatpak/{}") || true
    cat "$out/$mode"/*.log > "$out/$mode.log"
    grep -hE '^(PASS|FAIL|SKIP(PED)?): ' "$out/$mode"/*.log | sed -e 's/^FAIL\(: .*\) (Child process killed by signal 9)$/TIMEOUT\1/' \
        -e 's/ (.*//' | sort -u -k2 > "$out/$mode.results" || true
    echo "flatpak-tests: $mode${user:+ as $user}: $(grep -c '^PASS' "$out/$mode.results") of" \
        "$(wc -l < "$out/$mode.results") files pass ($((SECONDS - start)) s)"
}

for mode in "$@"; do
    run_mode "$mode"
done
rc=0
if [ -f "$out/bwrap.results" ]; then
    for mode in "$@"; do
        [ "$mode" != bwrap ] || continue
        lost=$(join -j 2 <(grep '^PASS' "$out/bwrap.results") <(grep '^FAIL' "$out/$mode.results") | cut -d' ' -f1)
        if [ -n "$lost" ]; then
            echo "flatpak-tests: $mode fails where bwrap passes:" $lost
            rc=1
        fi
    done
fi
echo "flatpak-tests: results in $out"
exit $rc
