"""What a process sees from inside a sandbox, printed as one JSON object.

Run INSIDE the sandbox by the conformance suite with the interpreter visible
there (Debian's /usr/bin/python3): standard library only, never `sandbox`.

    python3 -I -S probe.py '{"paths": [...], "writable": [...], "mounts": [...], "below": [...],
                             "actions": [...], "exit": 0}'

Every section is gathered independently; an error becomes {"error": "ENAME"}
instead of stopping the probe. After printing, the probe exits with
`"exit"`, kills itself with `"signal"` or spins until a limit kills it
(`"spin"`) if the request says so. `task` is the same probe as a function,
for a sandbox.WorkerPool task.

`path_info` and `writable` are also used on the host side by the test
runner (to see what a sandbox left in a host directory).
"""

from __future__ import annotations

import errno
import fcntl
import functools
import hashlib
import json
import os
import resource
import select
import signal
import socket
import stat
import struct
import sys
import time
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
        info["size"] = st.st_size
        info["sha256"] = guarded(lambda: sha256_of(path))
    elif stat.S_ISDIR(st.st_mode):
        info["entries"] = guarded(lambda: sorted(os.listdir(path)))
    return info


def sha256_of(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


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
    """The mount table; a mount stacked over another at the same point comes
    after it (the kernel lists mounts by id, and ids are reused, so a mount
    made later may have the lower id)."""
    out = []
    ids: dict[str, str] = {}  # mount id -> parent id
    for line in read_text("/proc/self/mountinfo").splitlines():
        left, right = line.split(" - ", 1)
        fields, rfields = left.split(), right.split()
        opts = set(fields[5].split(",")) | set(rfields[2].split(","))
        ids[fields[0]] = fields[1]
        out.append({"point": unescape(fields[4]), "root": unescape(fields[3]), "fstype": rfields[0],
                    "flags": sorted(f for f in MOUNT_FLAGS if f in set(fields[5].split(","))),
                    "mode": next((o[5:] for o in opts if o.startswith("mode=")), None),
                    "size": next((o[5:] for o in opts if o.startswith("size=")), None), "_id": fields[0]})
    out.sort(key=lambda m: (m["point"], depth(ids, m.pop("_id"))))
    return out


def depth(parents: dict[str, str], mount_id: str) -> int:
    """How many mounts lie beneath mount `mount_id` (`parents`: id -> parent id)."""
    n, seen = 0, set()
    while mount_id in parents and mount_id not in seen:
        seen.add(mount_id)
        mount_id, n = parents[mount_id], n + 1
    return n


def mount_info(points: list[str]) -> dict[str, Any]:
    """The topmost mount at each of `points` (None if it is not a mount point)."""
    table = mountinfo()
    found: dict[str, Any] = {}
    for point in points:
        top = [m for m in table if m["point"] == point]
        found[point] = top[-1] if top else None
    return {"points": found, "count": len(table)}


def mounts_below(prefixes: list[str]) -> dict[str, Any]:
    """For each prefix: how many mount points are at or below it, and the flags
    their visible mounts all share (a mount stacked over another hides it; the
    topmost is listed last)."""
    if not prefixes:
        return {}
    visible = {m["point"]: m for m in mountinfo()}
    out: dict[str, Any] = {}
    for prefix in prefixes:
        under = [m for p, m in visible.items() if p == prefix or p.startswith(prefix.rstrip("/") + "/")]
        common = set(MOUNT_FLAGS).intersection(*(m["flags"] for m in under)) if under else set()
        out[prefix] = {"count": len(under), "flags": sorted(common)}
    return out


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
    return {ns: guarded(functools.partial(os.readlink, f"/proc/self/ns/{ns}")) for ns in NAMESPACES}


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
            "ipv4_local": guarded(ipv4_local), "inet6": inet6,
            # the IPv4 main table (local routes live in another table) and the
            # devices the IPv6 routes go through
            "ipv4_routes": guarded(lambda: len(read_text("/proc/net/route").splitlines()[1:])),
            "ipv6_route_devs": guarded(lambda: sorted({ln.split()[-1] for ln in
                                                       read_text("/proc/net/ipv6_route").splitlines()}))}


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
    """One small experiment; "ok", its result, or the errno's name (see ACTIONS)."""
    verb, *args = action
    if verb not in ACTIONS:
        return {"error": f"unknown action {verb}"}
    try:
        result = ACTIONS[verb](*args)
    except OSError as exc:
        return err_name(exc)
    except MemoryError:
        return "MemoryError"
    return "ok" if result is None else result


def append(path: str, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


def read_hex(path: str, size: int) -> str:
    """Up to `size` bytes of `path`, in hex."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, size).hex()
    finally:
        os.close(fd)


def owner(path: str) -> str:
    st = os.stat(path)
    return f"{st.st_uid}:{st.st_gid}"


def run(argv: list[str]) -> list[Any]:
    """Run `argv` (no shell): [its exit status, its stdout]."""
    import subprocess

    done = subprocess.run(argv, stdout=subprocess.PIPE, text=True, timeout=30)
    return [done.returncode, done.stdout]


def pty_echo() -> list[str]:
    """Open a pseudo-terminal pair; the slave's name and what a line written
    to it reads back as on the master (the line discipline adds the \r)."""
    master, slave = os.openpty()
    try:
        name = os.ttyname(slave)
        os.write(slave, b"hi\n")
        # The line discipline hands the output over asynchronously: one read
        # may return only part of the line, so read until it has all come.
        data = b""
        deadline = time.monotonic() + 5
        while len(data) < 4 and time.monotonic() < deadline:
            if select.select([master], [], [], 0.1)[0]:
                data += os.read(master, 10)
        return [name, data.hex()]
    finally:
        os.close(master)
        os.close(slave)


def tcp_echo(host: str) -> str:
    """Connect to a listener of our own on `host` (a loopback address) and read back what was sent."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as srv:
        srv.bind((host, 0))
        srv.listen(1)
        with socket.create_connection(srv.getsockname()[:2], timeout=5) as cli:
            conn, _ = srv.accept()
            with conn:
                cli.sendall(b"ping")
                return conn.recv(4).decode()


def udp_connect(host: str) -> None:
    """A UDP connect() only looks a route up (nothing is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))


def bind_port(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, int(port)))


def allocate(size: int) -> None:
    buf = bytearray(int(size))
    del buf


def open_until_full() -> list[Any]:
    """Open / until the fd table is full: [the errno's name, the highest fd opened]."""
    fds: list[int] = []
    try:
        while True:
            fds.append(os.open("/", os.O_RDONLY))
    except OSError as exc:
        return [err_name(exc), max(fds, default=-1)]
    finally:
        for fd in fds:
            os.close(fd)


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
    """Fork `n` children that exit at once; they are reaped only at the end,
    so all `n` count against RLIMIT_NPROC together."""
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


ACTIONS: dict[str, Callable[..., Any]] = {
    "write": lambda path, size: write_all(path, int(size)),  # [path, nbytes] of "x"
    "append": append,  # [path, text]
    "mkdir": os.mkdir,  # [path]
    "rm": os.unlink,  # [path]
    "symlink": os.symlink,  # [target, path]
    "size": lambda path: os.stat(path).st_size,
    "mode": lambda path: oct(stat.S_IMODE(os.stat(path).st_mode)),
    "owner": owner,  # "uid:gid"
    "read": read_hex,  # [path, nbytes]
    "count": lambda path, size: len(bytes.fromhex(read_hex(path, int(size)))),  # how many bytes a read gets
    "pty": pty_echo,
    "run": run,  # [argv]
    "tcp_echo": tcp_echo,  # [loopback address]
    "udp_connect": udp_connect,  # [address]
    "bind": bind_port,  # [address, port]
    "alloc": allocate,  # [nbytes]
    "open_until_full": open_until_full,
    "fork": lambda n: fork_many(int(n)),
    "unshare_user": lambda: unshare_user(),  # try to make a user namespace, through libc with ctypes
    "syscalls": lambda calls: raw_syscalls(calls),  # [[nr, a0..a5], ...]
}


def current_umask() -> str:
    mask = os.umask(0)
    os.umask(mask)
    return oct(mask)


# ---------------------------------------------------------------- main

def gather(req: dict[str, Any]) -> dict[str, Any]:
    """The report for request `req`."""
    fds = open_fds()
    return {
        "paths": {p: path_info(p) for p in req.get("paths", [])},
        "writable": {p: writable(p) for p in req.get("writable", [])},
        "mounts": guarded(lambda: mount_info(req.get("mounts", []))),
        "below": guarded(lambda: mounts_below(req.get("below", []))),
        "ids": ids(),
        "proc": processes(),
        "status": guarded(proc_status),
        "ns": namespaces(),
        "hostname": socket.gethostname(),
        "net": guarded(network),
        "env": dict(os.environ),
        "cwd": guarded(os.getcwd),
        "umask": current_umask(),
        "rlimits": rlimits(),
        "fds": fds,
        "fd_types": fd_targets(fds),
        "actions": [act(a) for a in req.get("actions", [])],
    }


def finish(req: dict[str, Any]) -> int:
    """Once the report is out: spin, or kill ourselves, as `req` says; the exit status it asks for."""
    while req.get("spin"):
        pass
    if req.get("signal"):
        sig = int(req["signal"])
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    return int(req.get("exit", 0))


def main(argv: list[str]) -> int:
    req = json.loads(argv[1]) if len(argv) > 1 else {}
    sys.stdout.write(json.dumps(gather(req), sort_keys=True) + "\n")
    sys.stdout.flush()
    return finish(req)


def task(request: str) -> str:
    """The probe as a WorkerPool task function (sent by value: `request` is
    the JSON main() takes; the report comes back as the JSON main() prints).
    A request to exit, kill itself or spin ends the task as it ends the
    script: the report is printed to stdout first, then the task spins, sends
    itself the signal, and exits with the status (os._exit: no reply)."""
    req = json.loads(request)
    report = json.dumps(gather(req), sort_keys=True) + "\n"
    if not (req.get("spin") or req.get("signal") or req.get("exit")):
        return report
    sys.stdout.write(report)
    sys.stdout.flush()
    os._exit(finish(req))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
