"""Run one sandbox start with one syscall made to fail, and report as JSON.

    python inject.py '{"backend": "native", "world": "full", "errnos": {"pivot_root": "EIO"}, "rules": []}'

The helper process first starts one sandbox of the same world normally
(so the backend's one-time state exists: the native core's O_PATH fd of
sandbox-init, the shared pool and its threads), takes a `Ledger`, then
installs a seccomp filter on all its threads (SECCOMP_FILTER_FLAG_TSYNC)
that fails the chosen syscalls with the chosen errno. Everything it starts
afterwards inherits the filter: the native setup child (cloned from the
calling thread), bwrap and what bwrap forks, sandbox-launch and its setup
child. Then it starts the sandbox
again, records what was raised, takes the ledger again and prints both.

`rules` are ArgRule dicts (fail a syscall only for some arguments, e.g.
prctl(PR_SET_NO_NEW_PRIVS) but not other prctl calls). `refused`: the
backend refuses this world by capability (sandbox.refusal), the first start
included, and that refusal is what is checked. The command of the
sandbox carries `marker`, so the parent test can prove it never ran and no
process of it survives.
"""

from __future__ import annotations

import ctypes
import json
import sys
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))  # ledger.py; PYTHONSAFEPATH (tests/_installed.py) leaves it out
import ledger  # noqa: E402

import sandbox  # noqa: E402
from sandbox import Dir, File, Limits, Spec, Symlink, Tmpfs, netpool
from sandbox.seccomp import ArgRule, Seccomp
from sandbox.seccomp.compile import compile_policy

PR_SET_NO_NEW_PRIVS = 38
SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_TSYNC = 1
SYS_SECCOMP = 317  # x86_64
BASE = (sandbox.RoBind("/usr"), Symlink("usr/bin", "/bin"), Symlink("usr/lib", "/lib"),
        Symlink("usr/lib64", "/lib64"), sandbox.Proc(), sandbox.Dev(), Tmpfs("/tmp"))


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_filter(program: bytes) -> None:
    """Install `program` on every thread of this process (no_new_privs first, as
    an unprivileged caller must)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    buf = ctypes.create_string_buffer(program, len(program))
    prog = _SockFprog(len(program) // 8, ctypes.addressof(buf))
    rc = libc.syscall(SYS_SECCOMP, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, ctypes.byref(prog))
    if rc != 0:
        raise OSError(ctypes.get_errno(), "seccomp(SECCOMP_SET_MODE_FILTER)")


def world(name: str, backend: str) -> Spec:
    """The Spec of each world: every step a sandbox can take, used at least once."""
    env = {"PATH": "/usr/bin:/bin"}
    if name == "full":  # mounts of every kind, hostname, cwd, limits, a nested user namespace
        return Spec(mounts=(*BASE, Dir("/work"), File("/work/f", b"x"), Symlink("f", "/work/l"),
                            sandbox.Chmod("/work/f", 0o600)),
                    hostname="box", cwd="/work", env=env, limits=Limits(nofile=256), disable_userns=True)
    if name == "landlock":
        return Spec(mounts=BASE, env=env, landlock="best-effort" if backend == "bwrap" else True)
    if name == "pool":  # a leased network namespace and a forwarded port
        return Spec(mounts=BASE, env=env, network="pool", forward=((18080, 1),))
    raise ValueError(f"unknown world {name!r}")


def start(spec: Spec, backend: str, marker: str, capture: bool = True) -> sandbox.CompletedProcess:
    """Run a command that carries `marker`; captured through pipes, or with stdio on /dev/null."""
    stdio: dict[str, Any] = {"capture_output": True} if capture else {"stdout": sandbox.DEVNULL,
                                                                      "stderr": sandbox.DEVNULL}
    return sandbox.run(["sh", "-c", f"exec sleep 0 {marker}"], spec, backend=backend, timeout=60, text=True,
                       stdin=sandbox.DEVNULL, **stdio)


def outcome(exc: BaseException | None) -> dict[str, Any]:
    if exc is None:
        return {"raised": None}
    return {"raised": type(exc).__name__, "typed": isinstance(exc, sandbox.SandboxError),
            "step": getattr(exc, "step", None), "errno": getattr(exc, "errno", None),
            "path": getattr(exc, "path", None), "message": str(exc),
            "mro": [k.__name__ for k in type(exc).__mro__],
            "traceback": None if isinstance(exc, sandbox.SandboxError) else traceback.format_exc()}


def main(request: dict[str, Any]) -> dict[str, Any]:
    backend, marker = request["backend"], request.get("marker", "0.1")
    if not request.get("pool", True):  # network="none" on fresh namespaces: the sandbox brings lo up itself
        netpool.disable()
    spec = world(request["world"], backend)
    try:
        start(spec, backend, marker)  # warm: one-time state exists before the count
    except sandbox.UnavailableError as exc:
        if not request.get("refused"):
            return {"skip": f"{backend} cannot run the {request['world']} world here: {exc}"}
        # refused before anything runs, by capability: the start under the filter must be refused alike
    before = ledger.Ledger.take()
    rules = tuple(ArgRule(**r) for r in request.get("rules", ()))
    install_filter(compile_policy(Seccomp(errnos=request.get("errnos", {}), rules=rules)))
    try:
        result = start(spec, backend, marker, capture=request.get("capture", True))
        report = {"raised": None, "returncode": result.returncode, "stderr": (result.stderr or "")[-500:]}
    except BaseException as exc:  # noqa: BLE001 - what was raised is the report
        report = outcome(exc)
    after = ledger.Ledger.take()
    report["leaks"] = ledger.leaks(before, after)
    report["before"] = {"fds": len(before.fds), "threads": before.threads, "pool": before.pool}
    report["after"] = {"fds": len(after.fds), "threads": after.threads, "pool": after.pool}
    return report


if __name__ == "__main__":
    out = main(json.loads(sys.argv[1]))
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()

