"""What a process sees from inside a sandbox, printed as one JSON object.

Run INSIDE the sandbox by the conformance suite with the interpreter visible
there (Debian's /usr/bin/python3): standard library only, never `sandbox`.

    python3 -I -S probe.py '{"paths": [...], "writable": [...], "mounts": [...], "actions": [...], "exit": 0}'

Every section is gathered independently; an error becomes {"error": "ENAME"}
instead of stopping the probe. After printing, the probe exits with
`"exit"` or kills itself with `"signal"` if the request says so.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import resource
import signal
import socket
import stat
import struct
import sys
from collections.abc import Callable
from typing import Any

SIOCGIFFLAGS = 0x8913
IFF = {"UP": 0x1, "LOOPBACK": 0x8, "RUNNING": 0x40}
RLIMITS = {"cpu": resource.RLIMIT_CPU, "as": resource.RLIMIT_AS, "fsize": resource.RLIMIT_FSIZE,
           "nofile": resource.RLIMIT_NOFILE, "nproc": resource.RLIMIT_NPROC}
NAMESPACES = ("user", "mnt", "pid", "net", "ipc", "uts", "cgroup")
MOUNT_FLAGS = ("ro", "rw", "nosuid", "nodev", "noexec")
STATUS_KEYS = ("NoNewPrivs", "Seccomp", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "SigIgn", "SigBlk")


def err_name(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, str(exc.errno))


def guarded(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except OSError as exc:
        return {"error": err_name(exc)}


def read_text(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


# ---------------------------------------------------------------- filesystem

def kind_of(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "link"), (stat.S_ISDIR, "dir"), (stat.S_ISREG, "file"),
                       (stat.S_ISCHR, "char"), (stat.S_ISBLK, "block"), (stat.S_ISFIFO, "fifo"),
                       (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "other"


def path_info(path: str) -> dict[str, Any]:
    """Type, permission bits, link target and (small files) content of `path`."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return {"exists": False, "error": err_name(exc)}
    info: dict[str, Any] = {"exists": True, "type": kind_of(st.st_mode), "mode": oct(stat.S_IMODE(st.st_mode))}
    if stat.S_ISLNK(st.st_mode):
        info["target"] = os.readlink(path)
        info["resolves"] = os.path.exists(path)
    elif stat.S_ISREG(st.st_mode) and st.st_size <= 4096:
        info["content"] = guarded(lambda: read_text(path))
    elif stat.S_ISDIR(st.st_mode):
        info["entries"] = guarded(lambda: sorted(os.listdir(path)))
    return info


def writable(path: str) -> str:
    """'yes' if `path` can be written (a new file in a directory, an append to a
    file; nothing is changed), else the errno name."""
    try:
        if os.path.isdir(path):
            name = os.path.join(path, f".probe-{os.getpid()}")
            fd = os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            os.close(fd)
            os.unlink(name)
        else:
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
    except OSError as exc:
        return err_name(exc)
    return "yes"


def unescape(field: str) -> str:
    """mountinfo's octal escapes (\\040 for a space)."""
    return field.encode().decode("unicode_escape").encode("latin-1").decode(errors="replace")


def mountinfo() -> list[dict[str, Any]]:
    out = []
    for line in read_text("/proc/self/mountinfo").splitlines():
        left, right = line.split(" - ", 1)
        fields, rfields = left.split(), right.split()
        opts = set(fields[5].split(",")) | set(rfields[2].split(","))
        out.append({"point": unescape(fields[4]), "fstype": rfields[0],
                    "flags": sorted(f for f in MOUNT_FLAGS if f in set(fields[5].split(","))),
                    "mode": next((o[5:] for o in opts if o.startswith("mode=")), None),
                    "size": next((o[5:] for o in opts if o.startswith("size=")), None)})
    return out


def mount_info(points: list[str]) -> dict[str, Any]:
    """The topmost mount at each of `points` (None if it is not a mount point)."""
    table = mountinfo()
    found: dict[str, Any] = {}
    for point in points:
        top = [m for m in table if m["point"] == point]
        found[point] = top[-1] if top else None
    return {"points": found, "count": len(table)}


# ---------------------------------------------------------------- identity and processes

def ids() -> dict[str, Any]:
    return {
        "uid": os.getuid(), "gid": os.getgid(), "euid": os.geteuid(), "egid": os.getegid(),
        "groups": sorted(os.getgroups()),
        "uid_map": guarded(lambda: read_text("/proc/self/uid_map").split()),
        "gid_map": guarded(lambda: read_text("/proc/self/gid_map").split()),
        "setgroups": guarded(lambda: read_text("/proc/self/setgroups").strip()),
    }


def processes() -> dict[str, Any]:
    return {
        "pid": os.getpid(), "ppid": os.getppid(),
        "pid1_cmdline": guarded(lambda: read_text("/proc/1/cmdline").split("\0")[:-1]),
        "visible_pids": guarded(lambda: sorted(int(p) for p in os.listdir("/proc") if p.isdigit())),
        "sid_is_pid": os.getsid(0) == os.getpid(),
        "pgrp_is_pid": os.getpgrp() == os.getpid(),
        "tty": tty_state(),
    }


def tty_state() -> str:
    try:
        os.close(os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY))
    except OSError as exc:
        return err_name(exc)
    return "opens"


def proc_status() -> dict[str, str]:
    out = {}
    for line in read_text("/proc/self/status").splitlines():
        key, _, value = line.partition(":")
        if key in STATUS_KEYS:
            out[key] = value.strip()
    return out


def namespaces() -> dict[str, Any]:
    return {ns: guarded(lambda ns=ns: os.readlink(f"/proc/self/ns/{ns}")) for ns in NAMESPACES}


# ---------------------------------------------------------------- network

def interface_flags(name: str) -> list[str] | dict[str, str]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            raw = fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, struct.pack("16sH14x", name.encode(), 0))
        except OSError as exc:
            return {"error": err_name(exc)}
    flags = struct.unpack("16sH14x", raw)[1]
    return sorted(k for k, bit in IFF.items() if flags & bit)


def ipv4_local() -> list[str]:
    """Addresses the kernel lists as LOCAL in /proc/net/fib_trie."""
    lines = read_text("/proc/net/fib_trie").splitlines()
    out = set()
    for prev, line in zip(lines, lines[1:], strict=False):
        if "/32 host LOCAL" in line:
            out.add(prev.split()[-1])
    return sorted(out)


def network() -> dict[str, Any]:
    names = sorted(line.split(":", 1)[0].strip() for line in read_text("/proc/net/dev").splitlines()[2:])
    inet6 = guarded(lambda: sorted({ln.split()[5] + "/" + ln.split()[0] for ln in
                                    read_text("/proc/net/if_inet6").splitlines() if ln.strip()}))
    return {"interfaces": names, "flags": {n: interface_flags(n) for n in names},
            "ipv4_local": guarded(ipv4_local), "inet6": inet6}


# ---------------------------------------------------------------- limits and fds

def rlimits() -> dict[str, list[int]]:
    return {name: list(resource.getrlimit(res)) for name, res in RLIMITS.items()}


def open_fds() -> list[int]:
    """Every open fd (found with F_GETFD, so /proc is not needed)."""
    limit = min(resource.getrlimit(resource.RLIMIT_NOFILE)[0], 4096)
    out = []
    for fd in range(limit):
        try:
            fcntl.fcntl(fd, fcntl.F_GETFD)
        except OSError:
            continue
        out.append(fd)
    return out


def fd_targets(fds: list[int]) -> dict[str, str]:
    out = {}
    for fd in fds:
        try:
            out[str(fd)] = kind_of(os.fstat(fd).st_mode)
        except OSError as exc:
            out[str(fd)] = err_name(exc)
    return out


# ---------------------------------------------------------------- actions

def act(action: list[Any]) -> Any:
    """Small experiments: ["write", path, nbytes], ["mkdir", path], ["symlink", target, path], ["fork", n],
    ["unshare_user"] (try to make a user namespace, through libc with ctypes)."""
    verb, *args = action
    try:
        if verb == "write":
            write_all(args[0], int(args[1]))
        elif verb == "mkdir":
            os.mkdir(args[0])
        elif verb == "symlink":
            os.symlink(args[0], args[1])
        elif verb == "fork":
            return fork_many(int(args[0]))
        elif verb == "unshare_user":
            return unshare_user()
        elif verb == "syscalls":
            return raw_syscalls(args[0])
        else:
            return {"error": f"unknown action {verb}"}
    except OSError as exc:
        return err_name(exc)
    return "ok"


def write_all(path: str, size: int) -> None:
    """Write `size` bytes to a new `path`, to the end (a short write is retried,
    so a full filesystem or a file size limit shows as its errno)."""
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    try:
        view = memoryview(b"x" * size)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def raw_syscalls(calls: list[list[int]]) -> list[str]:
    """Make each raw syscall [nr, a0..a5]; report "ok" or the errno's name."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    out = []
    for nr, *args in calls:
        ctypes.set_errno(0)
        ret = libc.syscall(ctypes.c_long(nr), *[ctypes.c_ulong(a) for a in args])
        err = ctypes.get_errno()
        out.append(errno.errorcode.get(err, str(err)) if ret == -1 else "ok")
    return out


def unshare_user() -> str:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x10000000) != 0:  # CLONE_NEWUSER
        return errno.errorcode.get(ctypes.get_errno(), "?")
    return "ok"


def fork_many(n: int) -> Any:
    pids = []
    try:
        for _ in range(n):
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            pids.append(pid)
    except OSError as exc:
        return err_name(exc)
    finally:
        for pid in pids:
            os.waitpid(pid, 0)
    return "ok"


# ---------------------------------------------------------------- main

def main(argv: list[str]) -> int:
    req = json.loads(argv[1]) if len(argv) > 1 else {}
    fds = open_fds()
    report = {
        "paths": {p: path_info(p) for p in req.get("paths", [])},
        "writable": {p: writable(p) for p in req.get("writable", [])},
        "mounts": guarded(lambda: mount_info(req.get("mounts", []))),
        "ids": ids(),
        "proc": processes(),
        "status": guarded(proc_status),
        "ns": namespaces(),
        "hostname": socket.gethostname(),
        "net": guarded(network),
        "env": dict(os.environ),
        "cwd": guarded(os.getcwd),
        "rlimits": rlimits(),
        "fds": fds,
        "fd_types": fd_targets(fds),
        "actions": [act(a) for a in req.get("actions", [])],
    }
    sys.stdout.write(json.dumps(report, sort_keys=True) + "\n")
    sys.stdout.flush()
    if req.get("signal"):
        sig = int(req["signal"])
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    return int(req.get("exit", 0))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
