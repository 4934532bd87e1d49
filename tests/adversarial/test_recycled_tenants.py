"""Attack: one tenant of a recycled Template sandbox against the next (Template(spec, recycle=True)).

A recycled sandbox serves request after request in the same namespaces; its
pid 1 resets it in between (csrc/template/template_recycle.c). Request N plants a
secret everywhere a command can write or create: files in every Tmpfs and
/dev/shm, SysV shared memory, message queues and semaphores, a POSIX message
queue, an abstract socket, a TCP listener and a connection left in
TIME_WAIT (or none: the network namespace is then kept), a setsid survivor, a SIGSTOPped process, the hostname (if it
could), its session and user keyrings (with no seccomp policy to stop it),
lowered rlimits, another cwd and umask, and a lock on a file of the
template's root. Request N+1, in the same recycled sandbox (its pid numbers
kept counting: never a fresh one's 2), finds none of it. As root and
unprivileged.
"""

from __future__ import annotations

import json
import secrets
import textwrap
import time

import pytest

import sandbox
from sandbox import Mqueue, Tmpfs, UnavailableError

from .attack import make_base_spec, require, require_template_python
from .recycled import IS_MAKER, Tenants

pytestmark = pytest.mark.integration

PLANT = textwrap.dedent("""
    import ctypes, fcntl, os, resource, signal, socket, sys, time
    secret = sys.argv[1]
    value = secret.encode()
    done = []
    libc = ctypes.CDLL(None, use_errno=True)
    for top in ("/tmp", "/dev/shm", "/var/scratch"):
        with open(f"{top}/{secret}", "wb") as f:
            f.write(value)
        done.append(top)
    if libc.shmget(0x5B7E, 4096, 0o1000 | 0o666) >= 0:
        done.append("shm")
    if libc.msgget(0x5B7E, 0o1000 | 0o666) >= 0:
        done.append("msg")
    if libc.semget(0x5B7E, 1, 0o1000 | 0o666) >= 0:
        done.append("sem")
    rt = ctypes.CDLL("librt.so.1", use_errno=True)
    rt.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    if rt.mq_open(b"/" + value, os.O_CREAT | os.O_RDWR, 0o666, None) >= 0:
        done.append("mqueue")
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract.bind("\\0" + secret)
    abstract.listen()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 47011))
    listener.listen()
    if sys.argv[2] == "time-wait":  # else the namespace is left without a socket, and kept
        client = socket.create_connection(("127.0.0.1", 47011))
        served, _ = listener.accept()
        client.close()  # the side that closes first keeps the connection in TIME_WAIT
        served.close()
    done.append("sockets")
    if os.fork() == 0:
        os.setsid()
        time.sleep(300)
        os._exit(0)
    stopped = os.fork()
    if stopped == 0:
        time.sleep(300)
        os._exit(0)
    os.kill(stopped, signal.SIGSTOP)
    try:
        socket.sethostname(secret[:60])
        done.append("hostname")
    except OSError:
        pass
    libc.syscall.restype = ctypes.c_long
    for ring in (-3, -4):  # KEY_SPEC_SESSION_KEYRING, KEY_SPEC_USER_KEYRING
        if libc.syscall(248, b"user", value, value, len(value), ring) >= 0:  # add_key
            done.append(f"key{ring}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    os.chdir("/tmp")
    os.umask(0o077)
    lock = open("/usr/bin/env", "rb")
    fcntl.flock(lock, fcntl.LOCK_EX)
    init = os.readlink("/proc/self/ns/mnt")  # which sandbox: a recycled one keeps its mount namespace
    print(init, " ".join(done), flush=True)
""")

CHECK = textwrap.dedent(f"""
    import ctypes, fcntl, glob, json, os, resource, socket, sys
    secret = sys.argv[1]
    found = []
    for top in ("/tmp", "/dev/shm", "/var/scratch"):
        found += [p for p in glob.glob(f"{{top}}/*") if secret in p]
    for name in ("shm", "msg", "sem"):
        found += [f"sysv {{name}}: {{line}}" for line in open(f"/proc/sysvipc/{{name}}").readlines()[1:]]
    found += [f"mqueue {{n}}" for n in os.listdir("/dev/mqueue")]
    found += [f"unix {{line}}" for line in open("/proc/net/unix") if secret in line]
    for line in open("/proc/net/tcp").readlines()[1:]:
        found.append(f"tcp {{line.split()[1]}} state {{line.split()[3]}}")
    is_maker = {IS_MAKER}
    found += [f"process {{p}}" for p in os.listdir("/proc")
              if p.isdigit() and int(p) not in (1, os.getpid()) and not is_maker(p)]
    if secret[:60] in socket.gethostname():
        found.append("hostname")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    for ring in (-3, -4):  # KEYCTL_SEARCH (10) the session and user keyrings, as a planter's key would be
        if libc.syscall(250, 10, ring, b"user", secret.encode(), 0) >= 0:
            found.append(f"key in {{ring}}")
        # KEYCTL_READ (11): the ids of every key in it, whether this process may search them or not
        held = libc.syscall(250, 11, ring, None, 0)
        if held > 0:
            found.append(f"{{held // 4}} keys in {{ring}}")
    try:
        fcntl.flock(open("/usr/bin/env", "rb"), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        found.append(f"lock {{e}}")
    umask = os.umask(0o022)
    print(os.readlink("/proc/self/ns/mnt"), json.dumps({{"found": found, "pid": os.getpid(), "cwd": os.getcwd(),
          "umask": umask, "nofile": resource.getrlimit(resource.RLIMIT_NOFILE), "host": socket.gethostname()}}))
""")


def spec(**fields: object) -> sandbox.Spec:
    # the base world's /dev (its /dev/shm and devpts are kept by a reset when unchanged), a Tmpfs, an mqueue
    return make_base_spec(Tmpfs("/var/scratch"), Mqueue("/dev/mqueue"), hostname="tenant",
                          **fields)  # type: ignore[arg-type]


def check(tenants: Tenants, secret: str, recycled: bool = True) -> dict[str, object]:
    """What CHECK finds: in a recycled sandbox (one that served a request before), or in whichever serves it."""
    found = tenants.recycled(CHECK, secret) if recycled else tenants.run(CHECK, secret)[1]
    return json.loads(found)  # type: ignore[no-any-return]


@pytest.mark.parametrize("net", ["time-wait", "listener-only"])
@pytest.mark.parametrize("seccomp", ["default", "none"])
def test_the_next_tenant_of_a_recycled_sandbox_finds_nothing(seccomp: str, net: str) -> None:
    require_template_python()
    fields = {"seccomp": None} if seccomp == "none" else {}
    with sandbox.Template(spec(**fields), recycle=True) as t:
        tenants = Tenants(t)
        baseline = check(tenants, "nothing", recycled=False)  # a fresh sandbox's view
        assert baseline["found"] == [] and baseline["host"] == "tenant"
        for _ in range(2):  # each standby planted in, recycled, planted in again
            secret = "SBXRECYCLE" + secrets.token_hex(8)
            for done in map(str.split, tenants.in_each(PLANT, secret, net)):
                assert {"/tmp", "/dev/shm", "/var/scratch", "shm", "msg", "sem", "mqueue", "sockets"} <= set(done)
                if seccomp == "none":
                    assert {"key-3", "key-4"} <= set(done)  # the keyrings were open to it
            seen = check(tenants, secret)
            assert seen["found"] == [], seen
            for key in ("cwd", "umask", "nofile", "host"):
                assert seen[key] == baseline[key], (key, seen, baseline)


def test_what_a_recycled_sandbox_cannot_reset_is_refused_with_the_reason() -> None:
    require("template")
    for fields, why in (({"as_pid_1": True}, "as_pid_1"), ({"limits": sandbox.Limits(nproc=64)}, "cgroup limits")):
        try:
            made = sandbox.Template(spec(**fields), recycle=True)
        except UnavailableError as exc:
            assert why in str(exc) and "recycle=True" in str(exc)
            continue
        made.close()
        assert why == "cgroup limits", why  # nproc falls back to an rlimit where no cgroup is given
    with pytest.raises(sandbox.SpecError, match="recycle"):
        sandbox.Template(spec(), recycle="yes")  # type: ignore[arg-type]


def test_a_finished_sandboxs_handle_never_signals_the_next_tenant() -> None:
    """Its pid 1 serves the next request: a kill() through the old handle (not waited for yet) must not reach it."""
    require("template")
    with sandbox.Template(spec(), recycle=True) as t:
        first = t.spawn(["/bin/true"])
        time.sleep(0.3)  # its status is in, its pid 1 reset
        others = []
        for _ in range(20):
            nxt = t.spawn(["sleep", "30"])
            if nxt.pid == first.pid:  # the same pid 1, recycled
                break
            others.append(nxt)
            time.sleep(0.1)
        else:
            pytest.fail("the first sandbox's pid 1 never served again")
        for other in others:
            other.kill()
            other.wait()
        first.kill()  # late: the sandbox it names has ended
        time.sleep(0.2)
        assert nxt.poll() is None, nxt.returncode  # the next tenant runs on
        assert first.wait() == 0
        nxt.kill()
        assert nxt.wait() == -9


# The roots of the empty Tmpfs mounts only: no file (a file would make its Tmpfs be made again anyway),
# but what its owner may change on the root itself (the command's uid may be mapped to the owner's).
PLANT_ROOTS = textwrap.dedent("""
    import os, sys
    value, what = sys.argv[1].encode(), sys.argv[2]
    done = []
    for top in ("/tmp", "/dev/shm", "/var/scratch"):
        change = {"mode": lambda: os.chmod(top, 0o701), "xattr": lambda: os.setxattr(top, "user.sbx", value),
                  "times": lambda: os.utime(top, (1, 1))}[what]
        try:
            change()
            done.append(f"{top}:{what}")
        except OSError:
            pass
    init = os.readlink("/proc/self/ns/mnt")  # which sandbox: a recycled one keeps its mount namespace
    print(init, " ".join(done), flush=True)
""")

CHECK_ROOTS = textwrap.dedent("""
    import json, os
    seen = {}
    for top in ("/tmp", "/dev/shm", "/var/scratch"):
        st = os.stat(top)
        seen[top] = [oct(st.st_mode), st.st_mtime_ns, sorted(os.listxattr(top)), sorted(os.listdir(top))]
    print(os.readlink("/proc/self/ns/mnt"), json.dumps({"roots": seen}))
""")


def test_a_kept_tmpfs_root_carries_nothing_to_the_next_tenant() -> None:
    """A Tmpfs the command left empty and unchanged is kept (not made again); one whose root it
    changed (mode, an xattr or its times, one at a time: nothing written inside) is made again."""
    require_template_python()

    def roots() -> dict[str, object]:
        return json.loads(tenants.recycled(CHECK_ROOTS))["roots"]  # type: ignore[no-any-return]

    with sandbox.Template(spec(), recycle=True) as t:
        tenants = Tenants(t)
        tenants.run(CHECK_ROOTS)
        for what in ("mode", "times", "xattr"):
            baseline = roots()
            secret = "SBXROOT" + secrets.token_hex(8)
            if not any(f"/var/scratch:{what}" in done.split() for done in tenants.in_each(PLANT_ROOTS, secret, what)):
                continue  # not this uid's to change (an xattr needs a kernel whose tmpfs has them)
            seen = roots()
            for top, (mode, _mtime, xattrs, names) in seen.items():
                assert xattrs == [] and names == [], (top, seen)
                assert mode == baseline[top][0], (top, seen, baseline)  # type: ignore[index]
                assert _mtime != 1_000_000_000, (top, seen)


# One IPC object at a time (the reset keeps an IPC namespace that holds none: each kind is counted on its own).
PLANT_IPC = textwrap.dedent("""
    import ctypes, os, sys
    kind, value = sys.argv[1], sys.argv[2].encode()
    libc = ctypes.CDLL(None, use_errno=True)
    if kind == "shm":
        made = libc.shmget(0x5B7F, 4096, 0o1000 | 0o666)
    elif kind == "msg":
        made = libc.msgget(0x5B7F, 0o1000 | 0o666)
    elif kind == "sem":
        made = libc.semget(0x5B7F, 1, 0o1000 | 0o666)
    else:
        rt = ctypes.CDLL("librt.so.1", use_errno=True)
        rt.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
        made = rt.mq_open(b"/" + value, os.O_CREAT | os.O_RDWR, 0o666, None)
        if kind == "mqueue-unlinked" and made >= 0:  # made and removed: the namespace's queues changed
            rt.mq_unlink(b"/" + value)
    init = os.readlink("/proc/self/ns/mnt")  # which sandbox: a recycled one keeps its mount namespace
    print(init, "made" if made >= 0 else f"errno {ctypes.get_errno()}", flush=True)
""")

CHECK_IPC = textwrap.dedent("""
    import ctypes, json, os, sys
    value = sys.argv[1].encode()
    found = []
    for name in ("shm", "msg", "sem"):
        found += [f"sysv {name}: {line}" for line in open(f"/proc/sysvipc/{name}").readlines()[1:]]
    rt = ctypes.CDLL("librt.so.1", use_errno=True)
    rt.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    if rt.mq_open(b"/" + value, os.O_RDWR, 0, None) >= 0:
        found.append("mqueue")
    print(os.readlink("/proc/self/ns/mnt"), json.dumps({"found": found}))
""")


@pytest.mark.parametrize("mqueue_mounted", [True, False])
def test_a_kept_ipc_namespace_holds_nothing_of_the_last_tenant(mqueue_mounted: bool) -> None:
    """An IPC namespace the command left without an object is kept; one SysV segment, queue or
    semaphore set, or POSIX queue (made, or made and removed again) has it made again."""
    require_template_python()
    extra = (Mqueue("/dev/mqueue"),) if mqueue_mounted else ()
    with sandbox.Template(make_base_spec(*extra), recycle=True) as t:
        tenants = Tenants(t)
        for kind in ("shm", "msg", "sem", "mqueue", "mqueue-unlinked"):
            secret = "SBXIPC" + secrets.token_hex(8)
            for done in tenants.in_each(PLANT_IPC, kind, secret):
                assert done == "made", (kind, done)
            for _ in range(2):  # the first check left nothing: its sandbox's IPC namespace may be kept
                seen = json.loads(tenants.recycled(CHECK_IPC, secret))
                assert seen["found"] == [], (kind, seen)


# A devpts the command left unchanged is kept: what it could change there.
PLANT_PTS = textwrap.dedent("""
    import array, os, socket, sys
    what = sys.argv[1]
    done = []
    if what in ("/dev/pts/ptmx", "/dev/pts"):  # one at a time: the root's stat does not show its ptmx's
        try:
            os.chmod(what, 0o600 if what.endswith("ptmx") else 0o711)
            done.append(what)
        except OSError:
            pass
    else:  # a pty whose master outlives every process, in flight in a socket that holds itself, until the
        # kernel collects that socket: the reset counts the ptys left (whether or not one is by then)
        master = os.open("/dev/pts/ptmx", os.O_RDWR | os.O_NOCTTY)
        os.write(master, b"left for the next tenant\\n")
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        b.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [master, a.fileno()]))])
        done.append("pty")
    init = os.readlink("/proc/self/ns/mnt")  # which sandbox: a recycled one keeps its mount namespace
    print(init, " ".join(done), flush=True)
""")

CHECK_PTS = textwrap.dedent("""
    import json, os, stat
    print(os.readlink("/proc/self/ns/mnt"), json.dumps({"entries": sorted(os.listdir("/dev/pts")),
                      "modes": [oct(stat.S_IMODE(os.stat(p).st_mode)) for p in ("/dev/pts", "/dev/pts/ptmx")]}))
""")


def test_a_kept_devpts_carries_nothing_to_the_next_tenant() -> None:
    """A devpts the command left as it was is kept; one whose root or ptmx it changed, or where a pty
    outlives the command (its master in flight in a socket), is made again."""
    require_template_python()

    def look() -> dict[str, object]:
        return json.loads(tenants.recycled(CHECK_PTS))  # type: ignore[no-any-return]

    with sandbox.Template(make_base_spec(), recycle=True) as t:
        tenants = Tenants(t)
        tenants.run(CHECK_PTS)
        baseline = look()
        assert baseline["entries"] == ["ptmx"], baseline
        for what in ("/dev/pts/ptmx", "/dev/pts", "pty"):
            if not any(tenants.in_each(PLANT_PTS, what)):
                continue  # not this uid's to change
            seen = look()
            assert seen["entries"] == baseline["entries"] and seen["modes"] == baseline["modes"], (what, seen)



# When /dev/pts was mounted: its root's ctime, set when the devpts is made. A stat moves no time (mount
# ids, from the kernel's lowest free, would come back the same for one made again).
PTS_MADE = textwrap.dedent("""
    import os
    print(os.readlink("/proc/self/ns/mnt"), os.stat("/dev/pts").st_ctime_ns)
""")


def test_an_untouched_devpts_is_kept_from_one_request_to_the_next() -> None:
    """Commands that never look at /dev/pts find the same devpts request after request: the reset's own
    check (it lists the root's entries) must not move what its next check compares (the root's atime),
    or the devpts is unmounted and mounted again every other request. A sandbox's first reset makes it
    again (nothing was recorded before it): the devpts from its second request on are compared."""
    require_template_python()
    with sandbox.Template(make_base_spec(), recycle=True) as t:
        tenants = Tenants(t)
        seen: dict[str, list[str]] = {}
        for _ in range(16):
            where, made, _ = tenants.run(PTS_MADE)
            seen.setdefault(where, []).append(made)
            time.sleep(0.01)  # the kernel's coarse clock moves on: a devpts made again has another ctime
    assert max(len(made) for made in seen.values()) >= 4, seen
    for where, made in seen.items():
        assert len(set(made[1:])) <= 1, (where, made)
