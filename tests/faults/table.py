"""The faults: one syscall made to fail per entry, and what each backend must raise.

Each `Fault` names the syscall (or, with `rules`, the one use of it) that a
seccomp filter fails with EIO (`errno`), the world (tests/faults/inject.py)
whose start makes that call, and per backend the exception class and the
SetupError step expected, the step names being the native core's
(csrc/core/sandbox.h SBX_STEP_*, op kinds for operations). `None` for a backend
means it never makes that call: the start must then simply succeed (the
filter is no excuse for anything else to break).

The blob executor (sandbox-launch, sandbox/backends/blob) runs the same C
core in a process of its own, so its column is the native one unless
written out: calls the caller's Python makes natively that the launcher
never makes (its plans lease no pooled network namespace, so the setup
child makes a fresh one and brings its loopback up itself), calls of the
launcher's own (its posix_spawn, its report pipe), and the worlds it
refuses before anything runs (`REFUSED`: sandbox.refusal, by capability).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

O_ACCMODE, O_WRONLY = 3, 1
FD_CLOEXEC = 1
MS_NOSUID = 2
SIGCHLD = 17
PR_SET_PDEATHSIG, PR_SET_SECCOMP, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 22, 24, 38
CLONE_NEWUSER = 0x10000000
SIOCSIFFLAGS = 0x8914
AF_INET, AF_NETLINK = 2, 16
EIO, EMFILE = 5, 24

Expect = tuple[str, str | None] | None  # (exception class, SetupError.step), or None: not called


@dataclass(frozen=True)
class Fault:
    name: str
    native: Expect
    bwrap: Expect
    blob: Expect | Literal["native"] = "native"  # by default the same as `native`
    errnos: tuple[str, ...] = ()  # these syscalls fail, whatever their arguments
    rules: tuple[dict[str, Any], ...] = ()  # ArgRule fields: fail one use of a syscall
    world: str = "full"
    pool: bool = True  # False: network "none" sandboxes get fresh namespaces (no pool)
    capture: bool = True  # False: stdio on /dev/null (no pipes of the caller's)
    errno: int = EIO
    unreported: tuple[str, ...] = ()  # backends whose error carries no errno (a launcher's own exit, 125)
    extra: dict[str, Any] = field(default_factory=dict)

    def request(self, backend: str, marker: str) -> dict[str, Any]:
        return {"backend": backend, "marker": marker, "world": self.world, "pool": self.pool,
                "capture": self.capture, "errnos": {name: self.errno for name in self.errnos},
                "rules": [{"errno": self.errno or None, **rule} for rule in self.rules],
                "refused": self.expect(backend) == REFUSED}

    def expected_errno(self, backend: str) -> int:
        """The errno the error must carry (0 for a kill: it is no errno)."""
        return 0 if backend in self.unreported else self.errno

    def expect(self, backend: str) -> Expect:
        if backend == "blob":
            return self.native if isinstance(self.blob, str) else self.blob
        return self.native if backend == "native" else self.bwrap


def _arg(syscall: str, index: int, value: int, op: str = "eq", **more: Any) -> dict[str, Any]:
    return {"syscall": syscall, "arg_index": index, "op": op, "value": value, **more}


SETUP = "SetupError"
# refused before anything runs (sandbox.refusal): the warm-up start already raises it
REFUSED: Expect = ("UnavailableError", "refused")
FAULTS: tuple[Fault, ...] = (
    # namespaces: bwrap that can make none means the backend is unusable here
    Fault("clone(CLONE_NEWUSER)", (SETUP, "clone"), ("UnavailableError", None),
          rules=(_arg("clone", 0, CLONE_NEWUSER, "has_bits"),)),
    # blob plans lease no pooled namespace: the setup child makes one and brings its loopback up
    Fault("setns (a leased namespace)", (SETUP, "join_netns"), None, None, errnos=("setns",)),
    Fault("setns (forwarding into the pool's namespace)", (SETUP, "join_netns"), (SETUP, "forward"), REFUSED,
          errnos=("setns",), world="pool"),
    Fault("unshare (nested user namespace)", (SETUP, "nested_userns"), (SETUP, "nested_userns"),
          errnos=("unshare",)),
    # the id maps: the first file opened for writing is /proc/self/setgroups (native) or,
    # with disable_userns, the user namespace limit (bwrap)
    Fault("openat(O_WRONLY)", (SETUP, "setgroups"), (SETUP, "disable_userns"),
          rules=(_arg("openat", 2, O_WRONLY, "masked_eq", mask=O_ACCMODE),)),
    # the mount tree
    Fault("mount(MS_NOSUID) (the new root's tmpfs)", (SETUP, "newroot"), (SETUP, "newroot"),
          rules=(_arg("mount", 3, MS_NOSUID, "has_bits"),)),
    Fault("mount (making / a slave)", (SETUP, "mount_private"), (SETUP, "mount_private"), errnos=("mount",)),
    Fault("open_tree", (SETUP, "source"), None, errnos=("open_tree",)),
    Fault("mount_setattr", (SETUP, "source"), None, errnos=("mount_setattr",)),
    Fault("move_mount", (SETUP, "bind"), None, errnos=("move_mount",)),
    Fault("fsopen", (SETUP, "proc"), None, errnos=("fsopen",)),
    Fault("fsconfig", (SETUP, "proc"), None, errnos=("fsconfig",)),
    Fault("fsmount", (SETUP, "proc"), None, errnos=("fsmount",)),
    Fault("openat2", (SETUP, "bind"), None, errnos=("openat2",)),
    Fault("mkdir", (SETUP, "bind"), (SETUP, "newroot"), errnos=("mkdir", "mkdirat")),
    Fault("symlink", (SETUP, "symlink"), (SETUP, "symlink"), errnos=("symlink", "symlinkat")),
    Fault("chmod", (SETUP, "chmod"), (SETUP, "chmod"), errnos=("chmod", "fchmod", "fchmodat")),
    Fault("pivot_root", (SETUP, "pivot"), (SETUP, "pivot"), errnos=("pivot_root",)),
    Fault("umount2 (the old root)", (SETUP, "pivot"), (SETUP, "pivot"), errnos=("umount2",)),
    Fault("fchdir", (SETUP, "pivot"), (SETUP, "pivot"), errnos=("fchdir",)),
    # the rest of the world
    Fault("sethostname", (SETUP, "hostname"), (SETUP, "hostname"), errnos=("sethostname",)),
    Fault("ioctl(SIOCSIFFLAGS) (lo up)", (SETUP, "loopback"), None, rules=(_arg("ioctl", 1, SIOCSIFFLAGS),),
          pool=False),
    Fault("socket(AF_NETLINK) (lo up)", None, (SETUP, "loopback"), rules=(_arg("socket", 0, AF_NETLINK),),
          pool=False),
    Fault("socket(AF_INET) (a forwarded port)", (SETUP, "forward"), (SETUP, "forward"), REFUSED,
          rules=(_arg("socket", 0, AF_INET),), world="pool"),
    Fault("prlimit64 (setting a limit)", (SETUP, "rlimit"), (SETUP, "rlimit"),
          rules=(_arg("prlimit64", 2, 0, "ne"),)),
    # the process; for blob, first the launcher's: its report pipe, its stdio (posix_spawn's dup2s)
    Fault("pipe2", (SETUP, "pipe"), (SETUP, "pipe"), (SETUP, "launch"), errnos=("pipe2",), capture=False,
          errno=EMFILE),
    Fault("dup2/dup3 (stdio)", (SETUP, "stdio"), (SETUP, "exec_init"), (SETUP, "launch"), errnos=("dup2", "dup3")),
    Fault("close_range", (SETUP, "fds"), None, errnos=("close_range",)),
    Fault("setsid", (SETUP, "session"), (SETUP, "session"), errnos=("setsid",)),
    Fault("prctl(PR_SET_PDEATHSIG)", (SETUP, "pdeathsig"), (SETUP, "pdeathsig"),
          rules=(_arg("prctl", 0, PR_SET_PDEATHSIG),)),
    Fault("prctl(PR_CAPBSET_DROP)", (SETUP, "caps"), (SETUP, "caps"), rules=(_arg("prctl", 0, PR_CAPBSET_DROP),)),
    Fault("capset", (SETUP, "caps"), (SETUP, "caps"), errnos=("capset",)),
    Fault("prctl(PR_SET_NO_NEW_PRIVS)", (SETUP, "no_new_privs"), (SETUP, "no_new_privs"),
          rules=(_arg("prctl", 0, PR_SET_NO_NEW_PRIVS),)),
    Fault("landlock_create_ruleset", (SETUP, "landlock"), None, errnos=("landlock_create_ruleset",),
          world="landlock"),
    Fault("landlock_add_rule", (SETUP, "landlock"), None, errnos=("landlock_add_rule",), world="landlock"),
    Fault("landlock_restrict_self", (SETUP, "landlock"), None, errnos=("landlock_restrict_self",),
          world="landlock"),
    Fault("prctl(PR_SET_SECCOMP)", (SETUP, "seccomp"), (SETUP, "seccomp"), rules=(_arg("prctl", 0, PR_SET_SECCOMP),)),
    Fault("execveat (the reaper)", (SETUP, "exec_init"), None, errnos=("execveat",)),
    Fault("clone(SIGCHLD) (the reaper forks the command)", (SETUP, "fork"), None, rules=(_arg("clone", 0, SIGCHLD),)),
    # calls of sandbox-launch alone: it dies ("sandbox: ..." and 125) before the core runs
    Fault("fcntl(F_SETFD, FD_CLOEXEC) (the launcher's report fd)", None, None, (SETUP, "launch"),
          rules=(_arg("fcntl", 2, FD_CLOEXEC),), unreported=("blob",)),
    # the setup process killed (SECCOMP_RET_KILL_PROCESS) instead of a failing call
    Fault("sethostname kills (SIGSYS)", (SETUP, "crashed"), (SETUP, "crashed"),
          rules=(_arg("sethostname", 0, 0, "ne", action="kill"),), errno=0),
    # blob: the launcher itself killed, before any record (the report pipe's end of file)
    Fault("prctl(PR_SET_PDEATHSIG) kills (SIGSYS)", (SETUP, "crashed"), (SETUP, "crashed"), (SETUP, "launch"),
          rules=(_arg("prctl", 0, PR_SET_PDEATHSIG, action="kill"),), errno=0),
    Fault("execve (the command; bwrap itself; sandbox-launch itself)", ("ExecError", None), (SETUP, "exec_init"),
          (SETUP, "launch"), errnos=("execve",)),
    # stderr not a pipe of the caller's: bwrap's message is learned by a re-run (bwrap's messages.py)
    Fault("capset, stderr on /dev/null", (SETUP, "caps"), (SETUP, "caps"), errnos=("capset",), capture=False),
    Fault("prctl(PR_SET_PDEATHSIG), stderr on /dev/null", (SETUP, "pdeathsig"), (SETUP, "pdeathsig"),
          rules=(_arg("prctl", 0, PR_SET_PDEATHSIG),), capture=False),
    Fault("sethostname, stderr on /dev/null", (SETUP, "hostname"), (SETUP, "hostname"), errnos=("sethostname",),
          capture=False),
)
