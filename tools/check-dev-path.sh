#!/usr/bin/env bash
# The README's developer path, as written, in a fresh copy of this checkout
# (its tracked and unignored files, as they are now):
#     python3 -m venv .venv && . .venv/bin/activate
#     pip install -e '.[test]'
#     python -m pytest
# Usage: tools/check-dev-path.sh [pytest args...] (default: a short selection
# that covers the CLI, the public API and the import of the in-place build;
# run-tests.sh runs everything).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
PY=${SANDBOX_PYTHON:-/usr/bin/python3}
[ $# -gt 0 ] || set -- -q -p no:cacheprovider tests/integration/test_cli.py tests/integration/test_api_surface.py \
    tests/unit/test_core_missing.py
work=$(mktemp -d /tmp/sandbox-devpath.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir "$work/sandbox"
git -C "$src" ls-files -z --cached --others --exclude-standard \
    | tar -C "$src" --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -C "$work/sandbox" -xf -
cd "$work/sandbox"
echo "== dev path: python3 -m venv .venv; pip install -e '.[test]'; python -m pytest $* (in $PWD)"
"$PY" -m venv .venv
.venv/bin/pip install -q -e '.[test]' 2> >(grep -v "^WARNING: Location" >&2)
ls sandbox/_native*.so sandbox/_bin/sandbox-init >/dev/null  # built in place, as an editable install needs
.venv/bin/python -c 'import sandbox, os; assert sandbox.__file__ == os.path.abspath("sandbox/__init__.py"), sandbox.__file__'
# A function of a module of this checkout, run by a WorkerPool: the sandbox shows the
# checkout (the editable install's package lives there) but cannot import the module by
# its name, so it must travel by value.
printf 'def answer():\n    return 42\n' > devpath_probe.py
.venv/bin/python -c '
import sys; sys.path.insert(0, ".")
import devpath_probe, sandbox
spec = sandbox.Spec(mounts=[sandbox.RoBind("/usr"), sandbox.Symlink("usr/lib", "/lib"),
                            sandbox.Symlink("usr/lib64", "/lib64"), sandbox.Proc(), sandbox.Dev()])
with sandbox.WorkerPool(spec, 1) as pool:
    assert pool.submit(devpath_probe.answer).result(timeout=60) == 42
print("a checkout module ran in a WorkerPool task")'
rm devpath_probe.py
.venv/bin/python -m pytest "$@"
