#!/usr/bin/env bash
# Run bubblewrap's own test suite (tests/ of a bubblewrap checkout, tag
# v0.8.0: test-run.sh, test-specifying-userns.sh, test-specifying-pidns.sh,
# test-seccomp.py) against `python -m sandbox run`, or against any bwrap.
#
#   tools/run-bwrap-suite.sh TESTS_DIR [ours|ours-bwrap|ours-warm|bwrap|/path/to/bwrap-like]
#
# ours: our CLI (auto backend: native where the host allows it); ours-bwrap:
# our CLI with --backend bwrap; ours-warm: the installed `sandbox` command
# (the CLI server's client, csrc/client/cliclient.c) under the name bwrap, as a
# drop-in is installed, so every command goes through the warm server once
# one runs (its notes, in the socket's directory, say which did); bwrap:
# the real bwrap on PATH.
#
# The suite is not part of this repository (CI cannot fetch it): get a copy
# with `git archive v0.8.0 tests | tar -x` in a bubblewrap clone. Run it as
# root and as an unprivileged user (`runuser -u sbxtest -- tools/...`).
#
# test-run.sh stops at its first failure, so this runs a copy that keeps
# going: a failed command or assertion marks the current point `not ok` and
# the script carries on to the next `ok` line. The summary counts passed,
# failed and skipped points of each script. Python: $SUITE_PYTHON, else
# /opt/sandbox-venv*/bin/python as found, else python3.
set -uo pipefail
tests=$(cd "${1:?usage: $0 TESTS_DIR [ours|ours-bwrap|bwrap|PATH]}" && pwd)
which=${2:-ours}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /var/tmp/bwrap-suite.XXXXXX)
chmod 755 "$work"
trap 'rm -rf "$work"' EXIT

# BWRAP must be one word that names an executable (the suite runs
# `${BWRAP}` unquoted and nests it inside sandboxes), so ours gets a script
# named bwrap: the CLI then speaks as bwrap (`bwrap: ` messages, failures
# exit 1, the help names it; see sandbox/cli.py), as a drop-in is installed.
case $which in
ours|ours-bwrap)
    py=${SUITE_PYTHON:-}
    if [ -z "$py" ]; then
        for p in /opt/sandbox-venv*/bin/python; do [ -x "$p" ] && py=$p && break; done
    fi
    : "${py:=$(command -v python3)}"
    backend=auto; [ "$which" = ours-bwrap ] && backend=bwrap
    printf '#!%s -P\nimport sys\nfrom sandbox.cli import main\nsys.argv[1:1] = ["--backend", "%s"]\nsys.exit(main())\n' \
        "$py" "$backend" > "$work/bwrap"
    chmod 755 "$work/bwrap"
    bwrap=$work/bwrap ;;
ours-warm)
    py=${SUITE_PYTHON:-}
    if [ -z "$py" ]; then
        for p in /opt/sandbox-venv*/bin/python; do [ -x "$p" ] && py=$p && break; done
    fi
    client=$(dirname "${py:?ours-warm needs SUITE_PYTHON or an /opt/sandbox-venv}")/sandbox
    ln -s "$client" "$work/bwrap"
    bwrap=$work/bwrap ;;
bwrap) bwrap=$(command -v bwrap) ;;
*) bwrap=$which ;;
esac

# The keep-going copy: errexit off, failures noted by an ERR trap and by a
# non-exiting fatal(), each `echo "ok ...` line reporting what came before.
cp -r "$tests" "$work/tests"
cat > "$work/tests/keepgoing.sh" <<'EOF'
set +e
_failed=0
trap '_failed=1' ERR
fatal() { echo "FAILED: $*" >&2; _failed=1; return 1; }
point() {
    if [ "$_failed" = 0 ]; then echo "$*"; else echo "not $*"; fi
    _failed=0
}
EOF
for t in test-run.sh test-specifying-userns.sh test-specifying-pidns.sh; do
    sed -e 's/^set -xeuo pipefail/set -uo pipefail/' \
        -e 's|^\(\. .*libtest.sh"\?\)$|\1; . "${srcd}/keepgoing.sh"|' \
        -e 's/^\( *\)echo "ok/\1point "ok/' \
        -e 's|\./lockf-n.py \./lock wait|timeout 60 ./lockf-n.py ./lock wait|' \
        -e 's|while ! test -f \([a-z0-9-]*\); do sleep 1; done|for _i in $(seq 30); do test -f \1 \&\& break; sleep 1; done|' \
        -e 's|^    echo foo > donepipe|    timeout 10 sh -c "echo foo > donepipe"|' \
        "$tests/$t" > "$work/tests/$t"
    chmod 755 "$work/tests/$t"
done
if [ -f "$tests/try-syscall.c" ] && command -v cc >/dev/null; then
    cc -o "$work/tests/try-syscall" "$tests/try-syscall.c" 2>/dev/null
fi

syspy=/usr/bin/python3  # test-seccomp.py needs libseccomp's bindings (python3-seccomp)
[ -x "$syspy" ] || syspy=python3
total_pass=0
total_fail=0
for t in test-run.sh test-specifying-userns.sh test-specifying-pidns.sh test-seccomp.py; do
    out=$work/$t.out
    (cd "$work" && BWRAP=$bwrap BWRAP_MUST_WORK=1 timeout 900 $([ "$t" = test-seccomp.py ] && echo "$syspy") "$work/tests/$t" $([ "$t" = test-seccomp.py ] && echo -v) > "$out" 2> "$work/$t.err")
    rc=$?
    if [ "$t" = test-seccomp.py ]; then  # unittest's summary: Ran N tests, FAILED (failures=F, errors=E, skipped=S)
        n=$(sed -n 's/^Ran \([0-9]*\) tests\?.*/\1/p' "$work/$t.err")
        f=0; for k in failures errors; do
            f=$((f + $(grep -o "$k=[0-9]*" "$work/$t.err" | tail -1 | cut -d= -f2 | grep . || echo 0))); done
        s=$(grep -o "skipped=[0-9]*" "$work/$t.err" | tail -1 | cut -d= -f2 | grep . || echo 0)
        grep -E '^(FAIL|ERROR): ' "$work/$t.err" | sed 's/^/not ok - /' > "$out"
        for _ in $(seq $(( ${n:-0} - f ))); do echo "ok -" >> "$out"; done
        for _ in $(seq "$s"); do echo "ok - # SKIP" >> "$out"; done
    fi
    pass=$(grep -c '^ok ' "$out" | tr -d ' ')
    skip=$(grep -c '^ok .*# *SKIP' "$out" | tr -d ' ')
    fail=$(grep -c '^not ok' "$out" | tr -d ' ')
    pass=$((pass - skip))
    echo "$t: $pass passed, $fail failed, $skip skipped (exit $rc)"
    grep '^not ok' "$out" | sed 's/^/    /'
    [ -n "${SUITE_VERBOSE:-}" ] && sed 's/^/    | /' "$work/$t.err"
    total_pass=$((total_pass + pass))
    total_fail=$((total_fail + fail))
done
echo "total ($which, uid $(id -u)): $total_pass passed, $total_fail failed"
