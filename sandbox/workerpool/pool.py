"""WorkerPool: a concurrent.futures.Executor whose every task runs in a sandbox of its own."""

from __future__ import annotations

import errno
import itertools
import os
import resource
import socket
import sys
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor
from typing import Any, ParamSpec, TypeVar

from .. import _native, backends, cgroups
from .. import spec as S
from .._core.binding import ffi, lib
from .._core.blob import serialize
from .._core.report import setup_error
from ..backends.walls import new_cgroup
from ..errors import SandboxError, SetupError, SpecError
from ..host import HostInfo
from ..netpool.factory import FACTORY_PATH
from ..output import check_cap
from ..plan import NETWORK_CAPS, compile_mount, compile_plan
from ..probe import image_python
from ..process import SandboxProcess
from ..refusal import refusal
from ..validate import check_env
from ..warm_plan import task_plan, with_task_binds, zygote_plan
from . import channel as ch
from .calls import pickle_call
from .engine import Engine
from .interpreter import CLOUDPICKLE_ROOT, ZYGOTE_SCRIPT, own_root, zygote_spec
from .results import BrokenWorkerPool, ReplyLoader, TaskFuture
from .task import Task
from .traits import TRAITS as TRAITS  # re-exported: the WorkerPool's traits were defined here

P = ParamSpec("P")
T = TypeVar("T")
MiB = 1 << 20
DEFAULT_MAX_REPLY = 64 * MiB
DEFAULT_MAX_OUTPUT = 16 * MiB

# A task is forked by the zygote, which the native backend starts: the native
# backend's capabilities but the process-wide pool's network namespaces (the
# zygote never uses its own, and holds no capability over that pool's owner:
# its tasks lease from the WorkerPool's own supply, slots.py, or make a fresh one).
_POOLS = object()  # a per-task cap left to the pool's
# Set to 0 to give every task a fresh network namespace (benchmarks/workerpool.py's "before").
LEASE_ENV = "SANDBOX_WORKERPOOL_NETNS_POOL"


class WorkerPool(Executor):
    """Run Python functions, each in a fresh sandbox of `spec`, forked from a warm interpreter.

        with sandbox.WorkerPool(spec, 4, preload=["json"]) as pool:
            print(pool.submit(json.dumps, {"a": 1}).result())

    A fresh interpreter (the caller's own executable, never a fork of the
    caller: no memory, secret or thread of the caller reaches it) starts once
    in a sandbox of `spec`'s root with the interpreter's standard library and
    site directories bound read-only, imports `preload`, and forks one
    sandbox per task: new user, mount, pid, ipc and uts namespaces, a
    loopback-only network namespace leased from the pool's own supply (used
    again only if the last task left nothing in it; a fresh one when the
    Spec keeps a network capability), fresh tmpfs for every Tmpfs of the
    Spec and for /dev/shm, its own /proc, the root read-only, capabilities
    dropped, NO_NEW_PRIVS, and the Spec's seccomp, Landlock and limits. Nothing one task writes is seen
    by another, except through a writable bind of the Spec.

    `submit(fn, *args, **kwargs)` returns a TaskFuture (its `stdout` and
    `stderr` hold what the task wrote); `submit_task` adds a per-task
    `timeout` (the task's whole sandbox is killed), extra `binds` (their
    destinations must exist in the Spec's tree, e.g. a Dir, or lie in one of
    its Tmpfs) and `env`. Functions defined in `__main__`, closures and
    functions of modules the sandbox cannot import are sent by value
    (cloudpickle). An exception comes back as itself, with the remote
    traceback as its `__cause__`, but a BaseException that is not an
    Exception (SystemExit, KeyboardInterrupt) comes back as TaskExit, which
    is one; a task that dies without a result fails with TaskError
    (TaskTimeoutError on timeout).

    A task's env, arguments and binds' paths go straight to its own sandbox,
    never through the zygote, whose memory later tasks inherit. What a task
    can make this process hold is capped: its reply by `max_reply` bytes
    (default 64 MiB; past it the sandbox is killed and the future raises
    TaskLimitError), each of its stdout and stderr by `max_output` (default
    16 MiB), with `on_overflow` saying what happens past it
    (sandbox.output): "raise" (the default: the sandbox is killed, the
    future raises TaskLimitError carrying what was kept), "kill" (killed,
    killed_by "output"; the future has its result if the reply was in, else
    TaskError), "tail" or "head" (the task runs on; the future's `stdout`
    keeps the last or first bytes and `stdout_dropped` counts the rest).
    None: no cap; submit_task can set each per task. At interpreter exit,
    tasks already submitted are waited for.

    `spares` sandboxes (default: 2 per worker, at most 4) are forked ahead
    of their tasks, each set up and waiting for one task, so a task needing
    no plan of its own (no per-task binds) starts without waiting for a fork;
    a spare serves one task only. Once half of them are gone, the missing
    ones are forked back to back (forks in a row cost the zygote fewer
    copy-on-write faults than forks apart); when the pool is quiet, any.

    Replies are pickled inside the sandbox, so they are loaded with an
    allowlist (plain data and exception classes already imported here) unless
    `trust_results=True`; `result_types` allows more classes.

    Raises SpecError for what tasks cannot be given (see
    interpreter.check_spec), UnavailableError where the native backend
    cannot run, SandboxError if the zygote fails to start.
    """

    def __init__(self, spec: S.Spec, max_workers: int | None = None, *, preload: Sequence[str] = (),
                 timeout: float | None = None, spares: int | None = None, trust_results: bool = False,
                 result_types: Iterable[type] = (), startup_timeout: float = 60.0,
                 max_reply: int | None = DEFAULT_MAX_REPLY, max_output: int | None = DEFAULT_MAX_OUTPUT,
                 on_overflow: str = "raise") -> None:
        if not isinstance(spec, S.Spec):
            raise SpecError("spec", spec, "must be a sandbox.Spec")
        if max_workers is None:
            max_workers = os.cpu_count() or 1
        if not isinstance(max_workers, int) or isinstance(max_workers, bool):
            raise SpecError("max_workers", max_workers, "must be an int (the preload modules are keyword-only)")
        if max_workers <= 0:
            raise ValueError("max_workers must be greater than 0")
        if isinstance(preload, str):
            raise SpecError("preload", preload, "must be a sequence of module names, not one string")
        self._caps = (_check_cap("max_reply", max_reply), _check_cap("max_output", max_output))
        check_cap(max_output, on_overflow)
        self._on_overflow = on_overflow
        self._timeout = timeout
        self._ids = itertools.count(1)
        backends.choose("native")
        host = HostInfo.current(TRAITS)
        plan = compile_plan(zygote_spec(spec), host)
        refused = refusal(plan, host)
        if refused is not None:
            raise refused
        python = _zygote_python(spec, _native_path())
        zygote = zygote_plan(plan)
        self._task_plan = task_plan(plan, zygote)
        self._task_blob = serialize(self._task_plan, "/")
        spares = min(4, 2 * max_workers) if spares is None else spares
        make_cgroup = _cgroup_maker(self._task_plan.cgroup)
        # the first fork (the check) and each spare wanted take a cgroup made ahead
        slots = {n: make_cgroup() for n in range(1, max(1, spares) + 1)} if make_cgroup is not None else {}
        try:
            ctl, zstderr, self._zygote, netns = _start_zygote(zygote, self._task_blob, list(preload), spares,
                                                              startup_timeout, slots, _leases(self._task_plan, spec),
                                                              python)
        except BaseException:
            for cgroup in slots.values():
                cgroup.close_fds()
                cgroup.remove(attempts=40)
            raise
        self._engine = Engine(ctl, zstderr, max_workers, ReplyLoader(trust_results, result_types),
                              on_closed=_reaper(self._zygote), make_cgroup=make_cgroup, slots=slots,
                              mechanism=self._task_plan.limits_mechanism,
                              cpu_s=dict(self._task_plan.rlimits).get(resource.RLIMIT_CPU), netns=netns,
                              spares=spares)
        self._engine.task_blob = self._task_blob
        self._finalizer = weakref.finalize(self, self._engine.shutdown, False)

    @property
    def pid(self) -> int:
        """Host pid of the zygote's sandbox (its pid 1); every task is a descendant."""
        return self._zygote.pid

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> TaskFuture[T]:
        """Run `fn(*args, **kwargs)` in a new sandbox (the pool's default timeout)."""
        return self.submit_task(fn, args, kwargs)

    def submit_task(self, fn: Callable[..., T], /, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None,
                    *, timeout: float | None = None, binds: Sequence[S.Bind] = (),
                    env: Mapping[str, str] | None = None, max_reply: int | None | object = _POOLS,
                    max_output: int | None | object = _POOLS, on_overflow: str | None = None) -> TaskFuture[T]:
        """Run `fn(*args, **kwargs)` in a new sandbox with a `timeout` in seconds
        (default: the pool's), extra `binds` on top of the Spec's mounts, `env`
        added to its os.environ, and caps in bytes on its reply and on each
        output stream, with what happens past the latter (`on_overflow`;
        default: the pool's; None: no cap)."""
        submitted = time.monotonic()
        pairs = check_env("env", env) if env is not None else ()
        reply_cap = self._caps[0] if max_reply is _POOLS else _check_cap("max_reply", max_reply)
        output_cap = self._caps[1] if max_output is _POOLS else _check_cap("max_output", max_output)
        overflow = self._on_overflow if on_overflow is None else on_overflow
        check_cap(output_cap, overflow)
        payload, sources = pickle_call(fn, tuple(args), dict(kwargs or {}))
        future: TaskFuture[T] = TaskFuture()
        task = Task(id=next(self._ids), future=future, payload=payload,
                    timeout=self._timeout if timeout is None else timeout, env=dict(pairs) if pairs else None,
                    max_reply=reply_cap, max_output=output_cap, on_overflow=overflow, sources=sources,
                    submitted=submitted)
        if binds:
            self._add_binds(task, binds)
        try:
            self._engine.submit(task)
        except BaseException:
            for fd in task.trees:
                os.close(fd)
            raise
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Accept no more tasks; with `cancel_futures`, cancel those not started;
        with `wait`, return once every task has ended and the zygote is gone."""
        self._engine.shutdown(cancel_futures)
        if wait:
            self._engine.thread.join()

    # ------------------------------------------------------------ helpers

    def _add_binds(self, task: Task, binds: Sequence[S.Bind]) -> None:
        """Clone each bind's host tree (a detached mount; a missing optional
        source is skipped, as bwrap's -try) and give the task its own plan."""
        kept: list[S.Bind] = []
        try:
            for i, bind in enumerate(binds):
                if not isinstance(bind, S.Bind):
                    raise SpecError(f"binds[{i}]", bind, "must be a Bind, RoBind or DevBind")
                op = compile_mount(i, bind, True)
                res = ffi.new("struct sbx_result *")
                fd = lib.sbx_detach_tree(os.fsencode(op.src), int(op.flags), res)
                if fd < 0 and res.err == errno.ENOENT and bind.optional:
                    continue
                if fd < 0:
                    raise SetupError(f"Can't find source path {op.src}: {os.strerror(res.err)}", step="source",
                                     path=op.src, errno=res.err, backend="native")
                task.trees.append(fd)
                kept.append(bind)
        except BaseException:
            for fd in task.trees:
                os.close(fd)
            raise
        task.blob = serialize(with_task_binds(self._task_plan, kept), "/")


def _leases(task_plan: Any, spec: S.Spec) -> bool:
    """Whether the tasks run in namespaces leased from the pool's own supply:
    when they get a loopback-only one, and keep no network capability (which
    works only in a namespace of their own: its owner is theirs)."""
    return bool(task_plan.net_ns) and not NETWORK_CAPS & set(spec.cap_add) and os.environ.get(LEASE_ENV) != "0"


def _check_cap(name: str, value: object) -> int | None:
    """A cap in bytes: a positive int, or None for none."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise SpecError(name, value, "must be a positive number of bytes, or None for no cap")
    return value


def _cgroup_maker(limits: cgroups.CgroupLimits | None) -> Callable[[], cgroups.SandboxCgroup] | None:
    """What makes a task's cgroup with the pool's limits (None: the tasks have rlimits only)."""
    if limits is None:
        return None
    info = cgroups.host_cgroups()  # where the pool's plan was compiled for
    return lambda: new_cgroup(limits, TRAITS.name, info)


def _start_zygote(template: Any, task_blob: bytes, preload: list[str], spares: int, startup_timeout: float,
                  slots: Mapping[int, cgroups.SandboxCgroup], net_ns: bool, python: str = sys.executable,
                  ) -> tuple[socket.socket, int, SandboxProcess, socket.socket | None]:
    """Start the zygote through the native backend, send INIT (with the cgroups
    of `slots`: their cgroup.procs fds, closed here once sent), wait for READY;
    with `net_ns`, READY brings the channel of its namespace factory."""
    ctl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    argv = [python, "-I", ZYGOTE_SCRIPT, str(theirs.fileno())]
    try:
        launched = backends.get("native").launch(template, argv, (devnull, devnull, err_w), (theirs.fileno(),))
    except BaseException:
        for fd in (err_r, err_w, devnull):
            os.close(fd)
        ctl.close()
        theirs.close()
        raise
    proc = SandboxProcess(argv, launched, backend="native", network=template.network)
    for fd in (err_w, devnull):
        os.close(fd)
    theirs.close()
    try:
        blob_fd = os.memfd_create("sandbox-task-plan", os.MFD_CLOEXEC)
        try:
            os.write(blob_fd, task_blob)
            per_slot = [len(c.procs_fds) for c in slots.values()]
            ch.send(ctl, ch.INIT, {"native": _native_path(), "preload": preload, "path": [CLOUDPICKLE_ROOT],
                                 "spares": spares, "cgroups": per_slot[0] if per_slot else 0, "slots": list(slots),
                                 "netns": str(FACTORY_PATH) if net_ns else None},
                    [blob_fd, *(fd for c in slots.values() for fd in c.procs_fds)])
        finally:
            os.close(blob_fd)
            for cgroup in slots.values():
                cgroup.close_fds()
        ctl.settimeout(startup_timeout)
        message = ch.recv(ctl)
        ctl.settimeout(None)
        if message is not None and "failure" in message[1]:
            res = ffi.new("struct sbx_result *")
            for name, value in message[1]["failure"].items():
                setattr(res, name, value)
            raise setup_error(res, task_blob, ["<task>"])
        if message is None or message[0] != ch.READY:
            detail = message[1].get("message", "") if message is not None else _drain(err_r)
            raise SandboxError(f"the WorkerPool's zygote failed to start:\n{detail.strip()}")
        factory = None
        for fd in message[2]:  # received without close-on-exec: set it before anything is spawned
            os.set_inheritable(fd, False)
        if message[1].get("netns") and message[2]:
            factory = socket.socket(fileno=message[2].pop(0))
        for fd in message[2]:
            os.close(fd)
    except BaseException as exc:
        ctl.close()
        proc.kill()
        proc.wait()
        os.close(err_r)
        if isinstance(exc, (TimeoutError, OSError)) and not isinstance(exc, SandboxError):
            raise BrokenWorkerPool(f"the WorkerPool's zygote did not start: {exc}") from exc
        raise
    return ctl, err_r, proc, factory


def _zygote_python(spec: S.Spec, native: str) -> str:
    """The interpreter the zygote of `spec` runs: the caller's own; in a root
    of its own (an image: sandbox.images.python), that root's Python of the
    caller's version, once a real start there showed it loads the C core
    (`native`), else UnavailableError saying why not (sandbox.probe.image_python)."""
    if not own_root(spec):
        return sys.executable
    return image_python(zygote_spec(spec), native, (CLOUDPICKLE_ROOT,))


def _native_path() -> str:
    """The compiled core's file, which the zygote loads by path."""
    path: str | None = getattr(_native, "__file__", None)
    assert path is not None
    return path


def _drain(fd: int) -> str:
    chunks: list[bytes] = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks).decode(errors="replace")
        chunks.append(chunk)


def _reaper(proc: SandboxProcess) -> Callable[[], None]:
    """Wait for the zygote's sandbox once its control socket is closed (kill it if it lingers)."""
    def reap() -> None:
        try:
            proc.wait(timeout=5)
        except Exception:  # noqa: BLE001 - a zygote that does not leave is killed
            proc.kill()
            proc.wait()
    return reap
