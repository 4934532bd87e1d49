"""Attack: one tenant of a warm path against the next, and a task against its caller.

A warm path (a WorkerPool's zygote, a Template's template process, the task
layer's workers) serves task after task from state it keeps. Task N is
hostile: it plants a secret everywhere it can write or allocate (its
environment, its heap, files in /tmp and /dev/shm, System V shared memory and
message queues, an abstract socket) and is given secrets by its caller (env,
arguments, a bind whose host path names the secret). Task N+1 searches its
whole world and its own memory for them and must find nothing.

The secret is PREFIX + 32 hex digits; the searcher is given only the PREFIX
and the digits' sha256, so its own memory holds no copy to find.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

import sandbox
from sandbox import Bind, Namespaces
from sandbox.task import Sandbox, worker_pool
from sandbox.workerpool import TaskExit, TaskLimitError, UnsafeResultError

from .attack import PYTHON, make_base_spec, require, run

pytestmark = pytest.mark.integration

PREFIX = "SBXTENANT-"
SYSV_KEY = 0x5B7E


def new_secret() -> tuple[str, str]:
    """(the secret, the sha256 of its digits)."""
    digits = secrets.token_hex(16)
    return PREFIX + digits, hashlib.sha256(digits.encode()).hexdigest()


# ---------------------------------------------------------------- the tenants, as task functions

def plant(secret: str) -> str:
    """Leave `secret` everywhere a task can: env, heap, files, SysV IPC, an abstract socket."""
    import ctypes
    import os as _os
    import socket

    value = secret.encode()
    _os.environ["PLANTED"] = secret
    kept = [value * 8, bytearray(value) * 8]  # heap
    for top in ("/tmp", "/dev/shm"):
        with open(f"{top}/planted", "wb") as f:
            f.write(value)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    shmid = libc.shmget(SYSV_KEY, 4096, 0o1000 | 0o666)  # IPC_CREAT
    if shmid >= 0:
        addr = libc.shmat(shmid, None, 0)
        if addr not in (None, ctypes.c_void_p(-1).value):
            ctypes.memmove(addr, value, len(value))
    qid = libc.msgget(SYSV_KEY, 0o1000 | 0o666)
    if qid >= 0:
        message = ctypes.create_string_buffer(8 + len(value))
        ctypes.memmove(ctypes.addressof(message), (1).to_bytes(8, "little") + value, 8 + len(value))
        libc.msgsnd(qid, message, len(value), 0)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + secret)
    listener.listen()
    kept.append(listener)  # type: ignore[arg-type]
    return "planted"


def readable_memory(maps: IO[str], mem: IO[bytes]) -> Iterator[tuple[str, bytes]]:
    """Each readable mapping of a process, from its /proc/PID/maps and mem (open): (its line of maps, its
    bytes). What cannot be read is passed over. (A task's code: sent by value with search.)"""
    for line in maps:
        fields = line.split()
        start, end = (int(x, 16) for x in fields[0].split("-"))
        if not fields[1].startswith("r") or fields[-1] in ("[vvar]", "[vsyscall]", "[vvar_vclock]"):
            continue
        try:
            mem.seek(start)
            data = mem.read(end - start)
        except OSError:
            continue
        yield line.strip(), data


def search(prefix: str, digest: str) -> list[str]:
    """Every place in this task's world and memory where PREFIX + digits with sha256 `digest` is found."""
    import hashlib as _hashlib
    import os as _os
    import re

    pattern = re.compile(re.escape(prefix.encode()) + rb"([0-9a-f]{32})")

    def holds(data: bytes) -> bool:
        return any(_hashlib.sha256(m.group(1)).hexdigest() == digest for m in pattern.finditer(data))

    found = [f"env {k}" for k, v in _os.environ.items() if holds(f"{k}={v}".encode())]
    with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", buffering=0) as mem:
        found += [f"memory {line}" for line, data in readable_memory(maps, mem) if holds(data)]
    for top in ("/tmp", "/dev/shm", "/run", "/var/tmp"):
        for root, _, files in _os.walk(top):
            for name in files:
                path = _os.path.join(root, name)
                try:
                    with open(path, "rb") as f:
                        if holds(path.encode()) or holds(f.read(1 << 20)):
                            found.append(f"file {path}")
                except OSError:
                    pass
    for name in ("shm", "msg", "sem"):
        with open(f"/proc/sysvipc/{name}") as f:
            entries = f.read().splitlines()[1:]
        found += [f"sysvipc {name}: {e.split()[0]}" for e in entries]
    with open("/proc/net/unix", "rb") as f:
        if holds(f.read().replace(b"@", b"")):
            found.append("abstract socket")
    return found


def tenant_source() -> str:
    """plant() and search() (with readable_memory) as a script for python3 inside a sandbox: argv[1] picks one."""
    import inspect

    return "\n".join([
        "from __future__ import annotations",  # readable_memory's annotations name what the script lacks
        f"PREFIX, SYSV_KEY = {PREFIX!r}, {SYSV_KEY}", inspect.getsource(plant), inspect.getsource(readable_memory),
        inspect.getsource(search),
        "import sys",
        "if sys.argv[1] == 'plant':\n    print(plant(sys.argv[2]))\n    import time; time.sleep(0.2)",
        "else:\n    print('\\n'.join(search(sys.argv[2], sys.argv[3])) or 'clean')",
    ])


# ---------------------------------------------------------------- WorkerPool and the task layer

@pytest.fixture
def native() -> None:
    if not sandbox.probe().native:
        pytest.skip("WorkerPool needs the native backend")


def hand_over(pool: Any, tmp_path: Path) -> list[str]:
    """Task N gets secrets from its caller and plants its own; task N+1 searches: what it found."""
    given, given_digest = new_secret()
    own, own_digest = new_secret()
    holder = tmp_path / given  # a bind whose host path is the caller's secret
    holder.mkdir()
    done = pool.submit_task(plant, (own,), env={"API_KEY": given}, binds=[Bind(str(holder), "/tmp/mnt")])
    assert done.result(timeout=60) == "planted"
    assert pool.submit_task(plant, (given,), env={"API_KEY": given}).result(timeout=60) == "planted"
    found = []
    for digest in (given_digest, own_digest):
        found += pool.submit(search, PREFIX, digest).result(timeout=120)
    return found


@pytest.mark.usefixtures("native")
@pytest.mark.parametrize("spares", [0, 2], ids=["zygote-forked", "spares"])
def test_workerpool_task_finds_nothing_of_the_last(spares: int, tmp_path: Path) -> None:
    with sandbox.WorkerPool(make_base_spec(), 1, spares=spares) as pool:
        found = hand_over(pool, tmp_path)
    assert found == [], f"a task found an earlier task's secrets: {found}"


def zygote_holds(pool: sandbox.WorkerPool, needle: str) -> list[str]:
    """The mappings of the pool's zygote (the child of its sandbox's pid 1)
    that hold `needle`, read from outside through /proc/PID/mem."""
    (zygote,) = Path(f"/proc/{pool.pid}/task/{pool.pid}/children").read_text().split()
    hits = []
    try:
        maps, mem = open(f"/proc/{zygote}/maps"), open(f"/proc/{zygote}/mem", "rb", buffering=0)
    except PermissionError as exc:
        pytest.skip(f"this user cannot read the zygote's memory: {exc}")
    with maps, mem:
        hits += [line for line, data in readable_memory(maps, mem) if needle.encode() in data]
    return hits


@pytest.mark.usefixtures("native")
@pytest.mark.parametrize("spares", [0, 2], ids=["zygote-forked", "spares"])
def test_nothing_of_a_task_enters_the_zygotes_memory(spares: int, tmp_path: Path) -> None:
    """What every later task inherits holds no byte of a task's env, arguments or binds' paths."""
    with sandbox.WorkerPool(make_base_spec(), 1, spares=spares) as pool:
        for _ in range(3):
            env_secret, arg_secret, bind_secret = (new_secret()[0] for _ in range(3))
            (tmp_path / bind_secret).mkdir()
            done = pool.submit_task(len, (arg_secret,), env={"API_KEY": env_secret},
                                    binds=[Bind(str(tmp_path / bind_secret), "/tmp/mnt")])
            assert done.result(timeout=60) == len(arg_secret)
            for name, secret in (("env", env_secret), ("argument", arg_secret), ("bind", bind_secret)):
                assert zygote_holds(pool, secret) == [], f"the zygote's memory holds a task's {name}"


@pytest.mark.usefixtures("native")
def test_task_layer_worker_finds_nothing_of_the_last(tmp_path: Path) -> None:
    with worker_pool(Sandbox(), max_workers=1, spares=0) as pool:
        found = hand_over(pool, tmp_path)
    assert found == [], f"a task-layer worker found an earlier task's secrets: {found}"


@pytest.mark.parametrize("pid_ns", [True], ids=["pidns"])
def test_template_sandbox_finds_nothing_of_the_last(pid_ns: bool) -> None:
    require("template")
    if not os.access(PYTHON, os.X_OK):
        pytest.skip(f"{PYTHON} is needed inside the sandbox")
    spec = make_base_spec(namespaces=Namespaces(pid=pid_ns))
    source = tenant_source()
    found = []
    for _ in range(2):
        secret, digest = new_secret()
        planted = run([PYTHON, "-I", "-S", "-c", source, "plant", secret], spec.replace(env={"API_KEY": secret}),
                      "template", capture_output=True, text=True, timeout=60)
        assert planted.stdout.strip() == "planted", planted.stderr
        searched = run([PYTHON, "-I", "-S", "-c", source, "search", PREFIX, digest], spec, "template",
                       capture_output=True, text=True, timeout=120)
        assert searched.returncode == 0, searched.stderr
        found += [line for line in searched.stdout.splitlines() if line != "clean"]
    assert found == [], f"a Template sandbox found an earlier one's secrets: {found}"


# ---------------------------------------------------------------- a task against its caller

class Amplified:
    """Pickles as a call the loader would make with a size the task chose."""

    def __init__(self, make: Any, *args: Any) -> None:
        self.make, self.args = make, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.make, self.args


def amplified(kind: str) -> Amplified:
    return {"list": Amplified(list, range(3_000_000)), "bytes": Amplified(bytes, 100_000_000),
            "set": Amplified(set, range(3_000_000))}[kind]


def big_reply(size: int) -> bytes:
    return b"x" * size


def loud(size: int) -> str:
    import sys

    sys.stdout.write("y" * size)
    sys.stdout.flush()
    return "done"


def raise_base(kind: str) -> None:
    raise {"exit": SystemExit(3), "interrupt": KeyboardInterrupt(), "generator": GeneratorExit()}[kind]


class ExitsWhenPickled:
    def __reduce__(self) -> Any:
        raise SystemExit(5)


def exits_when_pickled() -> ExitsWhenPickled:
    return ExitsWhenPickled()


@pytest.fixture(params=["workerpool", "task-layer"])
def pool(request: pytest.FixtureRequest) -> Iterator[sandbox.WorkerPool]:
    """A pool with 1 MiB caps: a WorkerPool of the base world, or the task layer's workers."""
    if not sandbox.probe().native:
        pytest.skip("WorkerPool needs the native backend")
    caps = {"max_reply": 1 << 20, "max_output": 1 << 20}
    if request.param == "workerpool":
        made = sandbox.WorkerPool(make_base_spec(), 2, **caps)
    else:
        made = worker_pool(Sandbox(), max_workers=2, **caps)
    with made as p:
        yield p


@pytest.mark.parametrize("kind", ["list", "bytes", "set"])
def test_a_tiny_reply_cannot_make_the_caller_build_a_large_one(pool: sandbox.WorkerPool, kind: str) -> None:
    future = pool.submit(amplified, kind)
    with pytest.raises(UnsafeResultError, match="more than it sent"):
        future.result(timeout=60)
    assert pool.submit(len, "ok").result(timeout=60) == 2  # the pool goes on


@pytest.mark.parametrize(("fn", "limit"), [(big_reply, "max_reply"), (loud, "max_output")])
def test_caps_bound_what_a_task_makes_the_caller_hold(pool: sandbox.WorkerPool, fn: Any, limit: str) -> None:
    assert pool.submit(fn, 1000).result(timeout=60) in (b"x" * 1000, "done")
    with pytest.raises(TaskLimitError) as info:
        pool.submit(fn, 4 << 20).result(timeout=60)
    assert info.value.limit == limit and info.value.cap == 1 << 20 and limit in str(info.value)
    assert pool.submit_task(fn, (2 << 20,), **{limit: 8 << 20}).result(timeout=60) in (b"x" * (2 << 20), "done")
    assert pool.submit(len, "ok").result(timeout=60) == 2


@pytest.mark.parametrize("kind", ["exit", "interrupt", "generator"])
def test_a_tasks_base_exception_never_escapes_as_itself(pool: sandbox.WorkerPool, kind: str) -> None:
    try:
        pool.submit(raise_base, kind).result(timeout=60)
    except Exception as exc:  # what a caller's loop catches
        assert isinstance(exc, TaskExit)
        assert not isinstance(exc.exception, Exception)
        assert "raise_base" in str(exc.__cause__)  # the remote traceback
    else:
        pytest.fail("no error")


def test_system_exit_while_pickling_the_result_comes_back(pool: sandbox.WorkerPool) -> None:
    with pytest.raises(TaskExit) as info:
        pool.submit(exits_when_pickled).result(timeout=60)
    assert isinstance(info.value.exception, SystemExit) and info.value.exception.code == 5
