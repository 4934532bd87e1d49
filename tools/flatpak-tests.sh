#!/bin/bash
# Flatpak's installed tests (Debian's flatpak-tests, run by gnome-desktop-testing-runner) with
# our `sandbox` as the `bwrap` first on PATH, compared with the real bwrap file by file.
#
#   tools/flatpak-tests.sh [-u USER] [-p JOBS] [-o DIR] [-t SECONDS] [-f REGEX | -c] [MODE...]
#
# MODE: bwrap (the real /usr/bin/bwrap), served (our client, its CLI server allowed), direct
# (SANDBOX_CLI_SERVER=0); default: all three. -u runs them as USER (runuser; default: the caller);
# -f only the test files whose name matches REGEX (grep -E); -c only CI's subset ($ci_subset below:
# one file per way Flatpak starts an app, about 2 minutes a mode on 2 CPUs).
# Each mode's results are DIR/MODE.results ("PASS: name" / "FAIL: name" lines; a file killed at
# its timeout, default 900 s, is "TIMEOUT: name"), each file's wall time DIR/MODE.seconds and its
# logs DIR/MODE/. The exit status is 1 if a test file that passes with bwrap does not pass (fails,
# times out or gives no result) with one of ours, or if bwrap passes none: a comparison with
# nothing proves nothing.
# Debian's flatpak runs the `bwrap` it finds on PATH (FLATPAK_BWRAP unset). Needs:
# apt-get install flatpak flatpak-tests gnome-desktop-testing. The installation tested is the
# venv of $SANDBOX_VENV (default: the `sandbox` on PATH).
set -euo pipefail

# test-run: `flatpak run` with --args FD, --file and --ro-bind-data over /.flatpak-info, --lock-file,
# --seccomp FD, --sync-fd; test-run-custom: run with a custom runtime and --command; test-bundle: a
# bundle installed and run; test-extensions: extension mounts; test-override: overrides' filesystem,
# env and socket options; test-seccomp: the filter's effect, syscall by syscall (try-syscall)
ci_subset='^test-(run@user,nodeltas|run-custom@user|bundle@user|extensions|override|seccomp)\.'
user="" jobs=3 out="" timeout=900 only="."
while getopts "u:p:o:t:f:c" opt; do
    case $opt in
        u) user=$OPTARG ;;
        p) jobs=$OPTARG ;;
        o) out=$OPTARG ;;
        t) timeout=$OPTARG ;;
        f) only=$OPTARG ;;
        c) only=$ci_subset ;;
        *) sed -n '2,17p' "$0" >&2; exit 2 ;;
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
        xargs -P "$jobs" -I{} sh -c 's=$(date +%s); "$@" > "$0/{}.log" 2>&1; echo "$(($(date +%s) - s)) {}" > "$0/{}.seconds"' "$out/$mode" \
        "${runner[@]}" -u FLATPAK_BWRAP HOME="$home" PATH="$shim:/usr/local/bin:/usr/bin:/bin" "${env[@]}" \
        gnome-desktop-testing-runner -t "$timeout" "Flatpak/{}") || true
    cat "$out/$mode"/*.log > "$out/$mode.log" 2>/dev/null || true
    sort -rn "$out/$mode"/*.seconds > "$out/$mode.seconds" 2>/dev/null || true
    grep -hE '^(PASS|FAIL|SKIP(PED)?): ' "$out/$mode"/*.log | sed -e 's/^FAIL\(: .*\) (Child process killed by signal 9)$/TIMEOUT\1/' \
        -e 's/ (.*//' | sort -u -k2 > "$out/$mode.results" || true
    echo "flatpak-tests: $mode${user:+ as $user}: $(grep -c '^PASS' "$out/$mode.results") of" \
        "$(wc -l < "$out/$mode.results") files pass ($((SECONDS - start)) s; slowest: $(head -1 "$out/$mode.seconds"))"
}

for mode in "$@"; do
    run_mode "$mode"
done
rc=0
if [ -f "$out/bwrap.results" ]; then
    if ! grep -q '^PASS' "$out/bwrap.results"; then
        echo "flatpak-tests: bwrap passes none of the files matching '$only': nothing to compare with"
        rc=1
    fi
    for mode in "$@"; do
        [ "$mode" != bwrap ] || continue
        # every file bwrap passes, and whatever ours made of it (nothing: it gave no result)
        lost=$(join -j 2 -a 1 -e NONE -o 0,2.1 <(grep '^PASS' "$out/bwrap.results" | sort -k2) \
            <(sort -k2 "$out/$mode.results") | { grep -v ' PASS:$' || true; } | cut -d' ' -f1,2)
        if [ -n "$lost" ]; then
            echo "flatpak-tests: $mode does not pass where bwrap passes:" $lost
            rc=1
        fi
    done
fi
echo "flatpak-tests: results in $out"
exit $rc
