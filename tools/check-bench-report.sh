#!/usr/bin/env bash
# Check that the benchmark report runs and writes its files: `python -m
# benchmarks --quick` (about half a minute) into a temporary folder, then every
# file of the report must be there and non-empty. The numbers are not checked
# (a short run on a shared machine says little). Needs the venv with the
# `bench` extra (SANDBOX_EXTRAS=test,bench tools/setup-venv.sh); $SANDBOX_VENV
# as in setup-venv.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ]; then venv=${SANDBOX_VENV:-/opt/sandbox-venv}; else venv=${SANDBOX_VENV:-$HOME/.cache/sandbox-venv}; fi
out=$(mktemp -d /tmp/sandbox-bench.XXXXXX)
trap 'rm -rf "$out"' EXIT
echo "== python -m benchmarks --quick --out $out"
"$venv/bin/python" -m benchmarks --quick --no-progress --out "$out"
for f in report.md raw.json latency.png throughput.png scaling.png python_tasks.png stages.png; do
    [ -s "$out/$f" ] || { echo "check-bench-report: $f was not written" >&2; exit 1; }
done
grep -q "^## Spawn+wait latency" "$out/report.md" || { echo "check-bench-report: report.md lacks its tables" >&2; exit 1; }
echo "check-bench-report: the report and its 5 plots were written"
