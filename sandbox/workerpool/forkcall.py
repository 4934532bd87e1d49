"""The zygote's calls of the C core's forks: loaded by path in the zygote (stdlib only).

ZygoteLoop is the zygote's serve loop (csrc/core/zygote.c: sbx_zygote_check and
sbx_zygote_serve), ForkCall one fork of sbx_fork_sandbox_ns
(csrc/core/forksandbox.c). Both are called through ctypes.PyDLL, which keeps the
GIL across the call as os.fork() does (cffi releases it around every call);
the C forks call CPython's before- and after-fork hooks themselves
(sbx_fork_python_hooks), as os.fork() does, rather than Python calling them
around them: what Python runs after a fork writes pages, each a copy-on-write
fault while the child lives.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from typing import Any

# ctypes' counterparts of the cdef's scalar types (every pointer is a c_void_p)
CTYPES_SCALARS = {"int": "c_int", "unsigned int": "c_uint", "size_t": "c_size_t", "uint32_t": "c_uint32",
                  "int32_t": "c_int32", "uint64_t": "c_uint64", "int64_t": "c_int64"}


def ctypes_prototype(ffi: Any, func: Any) -> tuple[Any, list[Any]]:
    """The ctypes restype and argtypes of `func`, a function of the C core,
    derived from its cffi type: the cdef (csrc/core/sandbox.h) is its one
    definition."""
    import ctypes

    def one(ctype: Any) -> Any:
        if ctype.kind == "pointer":
            return ctypes.c_void_p
        if ctype.cname not in CTYPES_SCALARS:
            raise TypeError(f"{ffi.typeof(func).cname}: no ctypes counterpart for {ctype.cname}")
        return getattr(ctypes, CTYPES_SCALARS[ctype.cname])

    kind = ffi.typeof(func)
    return one(kind.result), [one(arg) for arg in kind.args]


IN_TASK = 1  # what sbx_zygote_check and _serve return in a task's sandbox


def python_hooks(ffi: Any, lib: Any) -> None:
    """Have the C forks call CPython's fork hooks (PyOS_BeforeFork, _AfterFork_Parent, _AfterFork_Child)."""
    import ctypes

    api = ctypes.pythonapi
    hooks = [ffi.cast("void (*)(void)", ctypes.cast(getattr(api, name), ctypes.c_void_p).value or 0)
             for name in ("PyOS_BeforeFork", "PyOS_AfterFork_Parent", "PyOS_AfterFork_Child")]
    if lib.sbx_fork_python_hooks(*hooks) < 0:
        raise RuntimeError("CPython's fork hooks were not found")


def pydll_call(ffi: Any, lib: Any, native: str, name: str) -> Any:
    """The C core's function `name` through ctypes.PyDLL (the GIL kept), typed from the cdef."""
    import ctypes

    call = getattr(ctypes.PyDLL(native), name)
    call.restype, call.argtypes = ctypes_prototype(ffi, getattr(lib, name))
    return call


class ZygoteLoop:
    """sbx_zygote_check and sbx_zygote_serve of the core at `native` (its cffi
    `ffi` and `lib`), for the pool's task `plan` blob, on control socket fd
    `ctl`; the rest of struct sbx_zygote's settings by name."""

    def __init__(self, ffi: Any, lib: Any, native: str, plan: bytes, task_main: Callable[[int], object],
                 **settings: int) -> None:
        import ctypes

        self.ffi, self.lib, self.plan, self.task_main = ffi, lib, plan, task_main
        python_hooks(ffi, lib)
        self.z = ffi.new("struct sbx_zygote *")
        for name, value in settings.items():
            setattr(self.z, name, value)
        # a task's sandbox runs task_main(its channel) from the C loop (held here: its address is id())
        api = ctypes.pythonapi
        self.z.task_main = ffi.cast("void *", id(task_main))
        self.z.call_one, self.z.long_from = (ffi.cast("void *", ctypes.cast(getattr(api, name), ctypes.c_void_p).value)
                                             for name in ("PyObject_CallOneArg", "PyLong_FromLong"))
        self.c_plan = ffi.from_buffer(plan)
        self.z.blob, self.z.blob_len = self.c_plan, len(plan)
        self.z.task_fd = -1
        address = int(ffi.cast("uintptr_t", self.z))
        check, serve = (pydll_call(ffi, lib, native, name) for name in ("sbx_zygote_check", "sbx_zygote_serve"))
        self.check: Any = lambda: check(address)
        self.serve: Any = lambda: serve(address)

    def add_slot(self, slot: int, fds: list[int], ns_fds: list[int] | None = None) -> None:
        """A slot of INIT's: its cgroup.procs fds (and a leased namespace's), taken over."""
        both = list(fds) + list(ns_fds or [])
        if self.lib.sbx_zygote_add_slot(self.z, slot, both, len(fds), len(both) - len(fds)) < 0:
            raise MemoryError("the zygote's slots")

    def task_fd(self) -> int:
        """In a task's sandbox: its channel."""
        return int(self.z.task_fd)


class ForkCall:
    """sbx_fork_sandbox_ns of the core at `native` (its cffi `ffi` and `lib`),
    for the pool's `plan` blob and `per_slot` cgroup.procs fds per fork."""

    def __init__(self, ffi: Any, lib: Any, native: str, plan: bytes, per_slot: int) -> None:
        self.ffi, self.plan = ffi, plan
        self.call = pydll_call(ffi, lib, native, "sbx_fork_sandbox_ns")
        python_hooks(ffi, lib)  # called by the C fork itself: no call of ours after it
        self.c_plan = ffi.from_buffer(plan)
        self.c_int = {name: ffi.new("int[]", n) for name, n in
                      (("stdio", 3), ("keep", 1), ("cg", max(1, per_slot)), ("ns", 2))}
        self.a_int = {name: self.addr(array) for name, array in self.c_int.items()}

    def addr(self, cdata: Any) -> int:
        return int(self.ffi.cast("uintptr_t", cdata))

    def __call__(self, blob: bytes | mmap.mmap, stdio: list[int], keep: int, trees: list[int],
                 cgroup_fds: list[int], ns_fds: list[int]) -> tuple[int, Any]:
        """Fork a sandbox of `blob` (the plan's, or a task's own): stdio[i]
        becomes its fd i, it keeps `keep` too; `trees` for its binds, its
        cgroups' cgroup.procs fds, [userns, netns] fds of a leased namespace
        or []. (pid: 0 in the child, the child's in the parent, -1; its
        struct sbx_result); the task's random is reseeded, as after os.fork()."""
        ffi, c, a = self.ffi, self.c_int, self.a_int
        res = ffi.new("struct sbx_result *")
        c_blob = self.c_plan if blob is self.plan else ffi.from_buffer(blob)
        c_trees = ffi.new("int[]", trees) if trees else None
        c["stdio"][0:3] = stdio
        c["keep"][0] = keep
        c["cg"][0:len(cgroup_fds)] = cgroup_fds
        c["ns"][0:2] = ns_fds or (-1, -1)
        pid: int = self.call(self.addr(c_blob), len(blob), a["stdio"], a["keep"], 1,
                             self.addr(c_trees) if c_trees is not None else 0, len(trees), a["cg"],
                             len(cgroup_fds), a["ns"], self.addr(res))
        if pid != 0 and c_blob is not self.c_plan:
            ffi.release(c_blob)  # a mapped plan can be unmapped now
        return pid, res
