"""Attack: one tenant of a recycled Template sandbox against the next (Template(spec, recycle=True)).

A recycled sandbox serves request after request in the same namespaces; its
pid 1 resets it in between (csrc/template_recycle.c). Request N plants a
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
import os
import secrets
import textwrap
import time

import pytest

import sandbox
from sandbox import Dev, Mqueue, Tmpfs, UnavailableError

from .attack import PYTHON, make_base_spec, require

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
    print(" ".join(done), flush=True)
""")

CHECK = textwrap.dedent("""
    import ctypes, fcntl, glob, json, os, resource, socket, sys
    secret = sys.argv[1]
    found = []
    for top in ("/tmp", "/dev/shm", "/var/scratch"):
        found += [p for p in glob.glob(f"{top}/*") if secret in p]
    for name in ("shm", "msg", "sem"):
        found += [f"sysv {name}: {line}" for line in open(f"/proc/sysvipc/{name}").readlines()[1:]]
    found += [f"mqueue {n}" for n in os.listdir("/dev/mqueue")]
    found += [f"unix {line}" for line in open("/proc/net/unix") if secret in line]
    for line in open("/proc/net/tcp").readlines()[1:]:
        found.append(f"tcp {line.split()[1]} state {line.split()[3]}")
    found += [f"process {p}" for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, os.getpid())]
    if secret[:60] in socket.gethostname():
        found.append("hostname")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    for ring in (-3, -4):  # KEYCTL_SEARCH (10) the session and user keyrings, as a planter's key would be
        if libc.syscall(250, 10, ring, b"user", secret.encode(), 0) >= 0:
            found.append(f"key in {ring}")
        # KEYCTL_READ (11): the ids of every key in it, whether this process may search them or not
        held = libc.syscall(250, 11, ring, None, 0)
        if held > 0:
            found.append(f"{held // 4} keys in {ring}")
    try:
        fcntl.flock(open("/usr/bin/env", "rb"), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        found.append(f"lock {e}")
    umask = os.umask(0o022)
    print(json.dumps({"found": found, "pid": os.getpid(), "cwd": os.getcwd(), "umask": umask,
                      "nofile": resource.getrlimit(resource.RLIMIT_NOFILE), "host": socket.gethostname()}))
""")


def spec(**fields: object) -> sandbox.Spec:
    return make_base_spec(Tmpfs("/var/scratch"), Dev("/dev"), Mqueue("/dev/mqueue"), hostname="tenant",
                          **fields)  # type: ignore[arg-type]


def check(t: sandbox.Template, secret: str) -> dict[str, object]:
    r = t.run([PYTHON, "-I", "-S", "-c", CHECK, secret], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def recycled_check(t: sandbox.Template, secret: str) -> dict[str, object]:
    """A check in a recycled sandbox: a fresh one's command is pid 2, a recycled one's counts on."""
    for _ in range(100):
        seen = check(t, secret)
        if seen["pid"] != 2:
            return seen
        time.sleep(0.02)  # both standbys were still being reset: the server made a fresh sandbox
    raise AssertionError("no request was served by a recycled sandbox")


@pytest.mark.parametrize("net", ["time-wait", "listener-only"])
@pytest.mark.parametrize("seccomp", ["default", "none"])
def test_the_next_tenant_of_a_recycled_sandbox_finds_nothing(seccomp: str, net: str) -> None:
    require("template")
    if not os.access(PYTHON, os.X_OK):
        pytest.skip(f"{PYTHON} is needed inside the sandbox")
    fields = {"seccomp": None} if seccomp == "none" else {}
    with sandbox.Template(spec(**fields), recycle=True) as t:
        baseline = check(t, "nothing")  # a fresh sandbox's view
        assert baseline["found"] == [] and baseline["host"] == "tenant"
        for _ in range(4):  # enough rounds that both standbys are planted in and recycled
            secret = "SBXRECYCLE" + secrets.token_hex(8)
            planted = t.run([PYTHON, "-I", "-S", "-c", PLANT, secret, net], capture_output=True, text=True,
                            timeout=60)
            assert planted.returncode == 0, planted.stderr
            done = set(planted.stdout.split())
            assert {"/tmp", "/dev/shm", "/var/scratch", "shm", "msg", "sem", "mqueue", "sockets"} <= done
            if seccomp == "none":
                assert {"key-3", "key-4"} <= done  # the keyrings were open to it
            seen = recycled_check(t, secret)
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
    print(" ".join(done), flush=True)
""")

CHECK_ROOTS = textwrap.dedent("""
    import json, os
    seen = {}
    for top in ("/tmp", "/dev/shm", "/var/scratch"):
        st = os.stat(top)
        seen[top] = [oct(st.st_mode), st.st_mtime_ns, sorted(os.listxattr(top)), sorted(os.listdir(top))]
    print(json.dumps({"roots": seen, "pid": os.getpid()}))
""")


def test_a_kept_tmpfs_root_carries_nothing_to_the_next_tenant() -> None:
    """A Tmpfs the command left empty and unchanged is kept (not made again); one whose root it
    changed (mode, an xattr or its times, one at a time: nothing written inside) is made again."""
    require("template")
    if not os.access(PYTHON, os.X_OK):
        pytest.skip(f"{PYTHON} is needed inside the sandbox")

    def roots() -> dict[str, object]:
        for _ in range(100):
            r = t.run([PYTHON, "-I", "-S", "-c", CHECK_ROOTS], capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stderr
            seen = json.loads(r.stdout)
            if seen["pid"] != 2:  # a recycled sandbox
                return seen["roots"]  # type: ignore[no-any-return]
            time.sleep(0.02)
        raise AssertionError("no request was served by a recycled sandbox")

    with sandbox.Template(spec(), recycle=True) as t:
        for what in ("mode", "times", "xattr") * 2:  # both standbys planted in and recycled
            baseline = roots()
            secret = "SBXROOT" + secrets.token_hex(8)
            planted = t.run([PYTHON, "-I", "-S", "-c", PLANT_ROOTS, secret, what], capture_output=True, text=True,
                            timeout=60)
            assert planted.returncode == 0, planted.stderr
            if f"/var/scratch:{what}" not in planted.stdout.split():
                continue  # not this uid's to change (an xattr needs a kernel whose tmpfs has them)
            seen = roots()
            for top, (mode, _mtime, xattrs, names) in seen.items():
                assert xattrs == [] and names == [], (top, seen)
                assert mode == baseline[top][0], (top, seen, baseline)  # type: ignore[index]
                assert _mtime != 1_000_000_000, (top, seen)
