"""Seccomp, disable_userns and Landlock, attacked from inside real sandboxes (native backend).

The syscall battery runs a Python script inside (Debian's /usr/bin/python3 is
under /usr) that makes raw syscalls with ctypes and reports what the kernel
answered; the expected answer for every syscall comes from evaluating the very
BPF program we installed, so the kernel and our compiler are checked against
each other.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

import sandbox
from sandbox import Bind, Dir, RoBind, SpecError
from sandbox.seccomp import (
    DEFAULT_POLICY,
    SECCOMP_RET_ERRNO,
    Seccomp,
    compile_policy,
    evaluate,
)
from sandbox.syscalls import table

pytestmark = pytest.mark.integration

PY = "/usr/bin/python3"
CLONE_NEWUSER = 0x10000000
TIOCSTI = 0x5412

PROBE = textwrap.dedent("""
    import ctypes, json, sys
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    out = []
    for nr, args in json.loads(sys.argv[1]):
        ctypes.set_errno(0)
        ret = libc.syscall(ctypes.c_long(nr), *[ctypes.c_ulong(a) for a in args])
        out.append([ret, ctypes.get_errno()])
    print(json.dumps(out))
""")


def syscall_calls(policy: Seccomp) -> list[tuple[str, list[int]]]:
    """(name, args) for every syscall the policy denies, with harmless arguments,
    plus argument-filtered cases and a few that must stay allowed."""
    calls: list[tuple[str, list[int]]] = []
    skip = {"vhangup", "reboot"}  # pointless to risk; still denied by the same table entry
    for name in (*policy.deny, *policy.errno_map):
        if name not in skip and (name, [0] * 6) not in calls:
            calls.append((name, [0] * 6))
    calls += [
        ("unshare", [CLONE_NEWUSER, 0, 0, 0, 0, 0]),
        ("ioctl", [0, TIOCSTI, 0, 0, 0, 0]),
        ("ioctl", [0, (1 << 32) | TIOCSTI, 0, 0, 0, 0]),  # the high-bit bypass, CVE-2019-10063
        ("ioctl", [0, 0x541C, 0, 0, 0, 0]),  # TIOCLINUX
        ("personality", [0xFFFFFFFF, 0, 0, 0, 0, 0]),  # query: allowed
        ("personality", [0x0008, 0, 0, 0, 0, 0]),  # ADDR_NO_RANDOMIZE-ish change: denied
        ("getpid", [0] * 6),
        ("getcwd", [0, 0, 0, 0, 0, 0]),
    ]
    return calls


def run_probe(spec: sandbox.Spec, calls: list[tuple[str, list[int]]]) -> list[tuple[int, int]]:
    nums = table()
    payload = json.dumps([[nums[name], args] for name, args in calls])
    done = sandbox.run([PY, "-I", "-S", "-c", PROBE, payload], spec, capture_output=True, timeout=60,
                       backend="native")
    assert done.returncode == 0, done.stderr.decode()
    return [tuple(x) for x in json.loads(done.stdout)]


def test_every_denied_syscall_gets_the_declared_errno(base_spec) -> None:
    calls = syscall_calls(DEFAULT_POLICY)
    got = run_probe(base_spec(), calls)
    prog = compile_policy(DEFAULT_POLICY)
    nums = table()
    for (name, args), (ret, err) in zip(calls, got, strict=True):
        action = evaluate(prog, nums[name], tuple(args))
        if action & 0xFFFF0000 == SECCOMP_RET_ERRNO:
            assert (ret, err) == (-1, action & 0xFFFF), f"{name}{tuple(args)}: {ret}, {errno.errorcode.get(err)}"
        else:  # allowed: whatever the kernel answers, it is not a denial
            assert not (ret == -1 and err == errno.EPERM), f"{name}{tuple(args)} was denied"


def test_tiocsti_is_denied_including_the_high_bit_variant(base_spec) -> None:
    calls = [("ioctl", [0, TIOCSTI, 0, 0, 0, 0]), ("ioctl", [0, (1 << 32) | TIOCSTI, 0, 0, 0, 0]),
             ("ioctl", [0, 0x5413, 0, 0, 0, 0])]  # TIOCGWINSZ stays allowed (ENOTTY on a pipe)
    got = run_probe(base_spec(), calls)
    assert got[0] == (-1, errno.EPERM)
    assert got[1] == (-1, errno.EPERM)
    assert got[2][1] != errno.EPERM


def test_without_seccomp_the_same_calls_reach_the_kernel(base_spec) -> None:
    got = run_probe(base_spec(seccomp=None), [("ioctl", [0, TIOCSTI, 0, 0, 0, 0]), ("keyctl", [0] * 6)])
    assert got[0][1] != errno.EPERM  # ENOTTY: stdin is not a terminal
    assert got[1][1] != errno.EPERM or got[1][0] != -1  # keyctl(0, ...) reaches the kernel


def test_unshare_user_fails_inside(base_spec, run_sh) -> None:
    done = run_sh("unshare -U true; echo rc=$?", base_spec())
    assert "rc=1" in done.stdout
    assert "Operation not permitted" in done.stderr


def _package_world(base_spec, **fields):
    """The base world plus the interpreter and this package, read-only, so a
    nested `python -m sandbox run` can start inside."""
    pkg_root = Path(sandbox.__file__).resolve().parent.parent
    paths = {sys.prefix, sys.base_prefix, str(pkg_root), os.path.realpath(sys.executable)}
    extra = [RoBind(p) for p in sorted(paths) if not p.startswith("/usr/")]
    return base_spec(*extra, **fields)


def test_nested_sandbox_fails_under_the_default_policy(base_spec) -> None:
    spec = _package_world(base_spec)
    nested = [sys.executable, "-m", "sandbox", "run", "--ro-bind", "/usr", "/usr", "--unshare-all", "--", "true"]
    done = sandbox.run(nested, spec, capture_output=True, text=True, timeout=60, backend="native")
    assert done.returncode == 125, (done.stdout, done.stderr)
    assert done.stderr.startswith("sandbox:")


def test_disable_userns_blocks_nested_namespaces_even_without_seccomp(base_spec, run_sh) -> None:
    done = run_sh("unshare -U true; echo rc=$?", base_spec(seccomp=None, disable_userns=True))
    assert "rc=1" in done.stdout
    assert "No space left on device" in done.stderr
    control = run_sh("unshare -U true; echo rc=$?", base_spec(seccomp=None))
    assert "rc=0" in control.stdout


def test_ordinary_programs_work_under_the_default_policy(base_spec, run_sh) -> None:
    script = textwrap.dedent("""
        import subprocess, threading
        out = []
        ts = [threading.Thread(target=lambda i=i: out.append(i * i)) for i in range(8)]
        [t.start() for t in ts]; [t.join() for t in ts]
        sub = subprocess.run(["sh", "-c", "echo $((6*7)) | cat"], capture_output=True, text=True)
        print(sorted(out)[-1], sub.stdout.strip())
    """)
    done = run_sh(f"ls / >/dev/null && sort </proc/self/status | grep -c . >/dev/null && "
                  f"grep Seccomp: /proc/self/status && {PY} -c '{script}'", base_spec())
    assert done.returncode == 0, done.stderr
    assert "Seccomp:\t2" in done.stdout
    assert "49 42" in done.stdout


def test_custom_denylist_allowlist_and_raw(base_spec, run_sh) -> None:
    deny = Seccomp(deny=("mkdir", "mkdirat"), errno=errno.EACCES)
    done = run_sh("mkdir /tmp/x; echo rc=$?", base_spec(seccomp=deny))
    assert "rc=1" in done.stdout and "Permission denied" in done.stderr

    everything = sorted(set(table()) - {"getcwd"})
    allow = Seccomp(allow=tuple(everything), default="errno", errno=errno.ENOSYS)
    done = run_sh(f"{PY} -I -S -c 'import os; os.getcwd()'; echo rc=$?", base_spec(seccomp=allow))
    assert "Function not implemented" in done.stderr and "rc=1" in done.stdout

    raw = Seccomp(raw=compile_policy(Seccomp(deny=("getcwd",), errno=errno.EXDEV)))
    done = run_sh(f"{PY} -I -S -c 'import os; os.getcwd()'; echo rc=$?", base_spec(seccomp=raw))
    assert "Invalid cross-device link" in done.stderr and "rc=1" in done.stdout


def test_unknown_syscall_names_are_refused_before_anything_runs() -> None:
    with pytest.raises(SpecError) as info:
        Seccomp(deny=("mkdir", "no_such_call", "other_bogus"))
    assert "no_such_call" in str(info.value) and "other_bogus" in str(info.value)


def test_landlock_blocks_writes_the_mounts_would_allow(base_spec, run_sh, tmp_path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    spec = base_spec(Bind(str(work), "/work"), Dir("/data"), landlock=True)
    # The root is a writable tmpfs as far as the mounts go: the control run proves it.
    control = run_sh("echo x > /newfile && echo made", spec.replace(landlock=False))
    assert "made" in control.stdout
    done = run_sh("echo x > /newfile; echo a > /work/a && echo work-ok; echo b > /tmp/b && echo tmp-ok; "
                  "ls / >/dev/null 2>&1 || echo root-unreadable; ls /data >/dev/null 2>&1 || echo data-unreadable; "
                  "cat /usr/lib/os-release >/dev/null && echo usr-readable", spec)
    assert "Permission denied" in done.stderr
    for word in ("work-ok", "tmp-ok", "root-unreadable", "data-unreadable", "usr-readable"):
        assert word in done.stdout, (word, done.stdout, done.stderr)
    assert (work / "a").read_text() == "a\n"


def test_landlock_abi_is_reported_inside(base_spec) -> None:
    code = ("import ctypes; l=ctypes.CDLL(None, use_errno=True); l.syscall.restype=ctypes.c_long; "
            "print(l.syscall(444, None, 0, 1))")
    done = sandbox.run([PY, "-I", "-S", "-c", code], base_spec(landlock=True), capture_output=True, text=True,
                       backend="native", timeout=60)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) >= 1
    assert done.isolation["landlock_abi"] == int(done.stdout)  # the ABI applied is the best available


def test_landlock_setting_is_validated() -> None:
    with pytest.raises(SpecError):
        sandbox.Spec(landlock="sometimes")


def test_landlock_is_refused_by_the_bwrap_backend_unless_best_effort(base_spec) -> None:
    if not sandbox.probe().bwrap:
        pytest.skip("bwrap is not available")
    with pytest.raises(sandbox.UnavailableError, match="the bwrap backend has no Landlock support"):
        sandbox.run(["true"], base_spec(landlock=True), backend="bwrap")
    done = sandbox.run(["true"], base_spec(landlock="best-effort"), backend="bwrap", timeout=60)
    assert done.returncode == 0 and done.backend == "bwrap"


def test_the_default_policy_is_enforced_by_bwrap_too(base_spec, run_sh) -> None:
    if not sandbox.probe().bwrap:
        pytest.skip("bwrap is not available")
    for backend in ("native", "bwrap"):
        done = sandbox.run(["sh", "-c", "grep Seccomp: /proc/self/status; unshare -U true; echo rc=$?"],
                           base_spec(), capture_output=True, text=True, backend=backend, timeout=60)
        assert "Seccomp:\t2" in done.stdout and "rc=1" in done.stdout, (backend, done.stdout, done.stderr)
        assert "Operation not permitted" in done.stderr, backend
