"""The default seccomp policy, on in every sandbox, and why each entry is there.

`DEFAULT_POLICY_REASONS` gives the reason for every syscall the policy
denies (outright or for some arguments), `DEFAULT_POLICY_ALLOWED` for the
notable ones it leaves alone. `policy_table` lists what a policy does per
syscall; docs/hardening.md's tables ("The default policy") are these three read together, and a
unit test holds them equal.
"""

from __future__ import annotations

import errno as _errno
import termios

from .. import syscalls
from .policy import ArgRule, Seccomp

CLONE_NEWUSER = 0x10000000

_ENOSYS_FALLBACK = ("clone3", "fsopen", "fsconfig", "fsmount", "fspick", "open_tree", "move_mount",
                    "mount_setattr")
_ROOT_ONLY = "needs a capability in the initial user namespace, which a sandbox never holds; denied outright"
_MOUNT_API = ("the new mount API: recent, large code reachable from a user namespace (fsconfig's heap "
              "overflow CVE-2022-0185 was); ENOSYS, as on an older kernel, so libmount and systemd fall back "
              "to mount(2), which stays subject to capabilities")
_KEYS = ("kernel keyrings are not namespaced: the sandbox could read or plant keys of the caller's user; "
         "long history of kernel bugs")
_IO_URING = ("io_uring performs file and network operations that are not syscalls, so no seccomp rule "
             "sees them, and it has been the largest single source of kernel privilege escalations; EPERM "
             "as with kernel.io_uring_disabled=2, callers fall back to plain syscalls")

DEFAULT_POLICY_REASONS: dict[str, str] = {
    "keyctl": _KEYS,
    "add_key": _KEYS,
    "request_key": _KEYS,
    "bpf": "eBPF programs and maps are a large kernel attack surface; unprivileged use is meant to be off",
    "perf_event_open": "performance counters leak timing and kernel addresses and have a history of "
                       "privilege-escalation bugs",
    "userfaultfd": "lets a process stall the kernel at a page fault of its choosing: the usual way to win "
                   "races in kernel exploits",
    "io_uring_setup": _IO_URING,
    "io_uring_enter": _IO_URING,
    "io_uring_register": _IO_URING,
    "kexec_load": "loads a new kernel; " + _ROOT_ONLY,
    "kexec_file_load": "loads a new kernel; " + _ROOT_ONLY,
    "init_module": "loads a kernel module; " + _ROOT_ONLY,
    "finit_module": "loads a kernel module; " + _ROOT_ONLY,
    "delete_module": "unloads a kernel module; " + _ROOT_ONLY,
    "open_by_handle_at": "opens any inode of a filesystem from a file handle, bypassing the mount tree "
                         "(the 'shocker' container escape)",
    "fsopen": _MOUNT_API,
    "fsconfig": _MOUNT_API,
    "fsmount": _MOUNT_API,
    "fspick": _MOUNT_API,
    "open_tree": _MOUNT_API,
    "move_mount": _MOUNT_API,
    "mount_setattr": _MOUNT_API,
    "clone3": "its flags sit in a struct seccomp cannot read, so CLONE_NEWUSER could not be filtered; "
              "ENOSYS makes glibc fall back to clone(2), which is filtered",
    "clone": "denied only when the flags include CLONE_NEWUSER: a new user namespace grants a full capability "
             "set over fresh namespaces, the door to most unprivileged kernel exploits; fork and threads work",
    "unshare": "denied only when the flags include CLONE_NEWUSER (see clone); other namespace flags are left "
               "to capabilities",
    "personality": "only PER_LINUX (0) and the query 0xffffffff pass: other personas switch off ASLR "
                   "(ADDR_NO_RANDOMIZE), make data executable (READ_IMPLIES_EXEC) or pick legacy code paths",
    "ioctl": "TIOCSTI (0x5412) and TIOCLINUX (0x541c) are denied, compared on the low 32 bits as the kernel "
             "reads the request (CVE-2019-10063's high-bit bypass): they type into, or control, a terminal "
             "shared with the outside; every other ioctl passes",
    "acct": "process accounting writes host-wide records; " + _ROOT_ONLY,
    "swapon": "host-wide swap configuration; " + _ROOT_ONLY,
    "swapoff": "host-wide swap configuration; " + _ROOT_ONLY,
    "reboot": "reboots the host, or with CAP_SYS_BOOT in the sandbox kills its pid namespace",
    "syslog": "reads the kernel log, which leaks kernel addresses when kernel.dmesg_restrict is 0",
    "settimeofday": "sets the host clock (time is not namespaced); " + _ROOT_ONLY,
    "clock_settime": "sets the host clock (time is not namespaced); " + _ROOT_ONLY,
    "iopl": "raw I/O port access; " + _ROOT_ONLY,
    "ioperm": "raw I/O port access; " + _ROOT_ONLY,
    "lookup_dcookie": "obsolete oprofile interface",
    "quotactl": "disk quota administration of host filesystems",
    "quotactl_fd": "disk quota administration of host filesystems",
    "nfsservctl": "removed kernel NFS server interface",
    "vhangup": "hangs up the controlling terminal, which may be shared with the outside",
    "uselib": "obsolete a.out library loader with a history of bugs",
}

_SANDBOX_PIDS = ("with the default pid namespace the sandbox addresses only its own processes, none of which "
                 "shares memory with the outside, so debuggers and strace work; with namespaces.pid=False it "
                 "could reach the caller's other same-uid processes, as kill(2) could")
_MOUNTS = ("fails with EPERM without CAP_SYS_ADMIN in the sandbox's user namespace; with cap_add it acts on "
           "the sandbox's own mount namespace only (including its own read-only binds: that is what the "
           "capability means), never on the caller's")

DEFAULT_POLICY_ALLOWED: dict[str, str] = {
    "ptrace": _SANDBOX_PIDS,
    "process_vm_readv": _SANDBOX_PIDS,
    "process_vm_writev": _SANDBOX_PIDS,
    "pidfd_getfd": _SANDBOX_PIDS,
    "kcmp": _SANDBOX_PIDS,
    "mount": _MOUNTS,
    "umount2": _MOUNTS,
    "pivot_root": _MOUNTS,
    "chroot": "needs CAP_SYS_CHROOT in the sandbox's user namespace and cannot reach above the sandbox's root",
    "setns": "joining a namespace needs CAP_SYS_ADMIN over it, which the sandbox never has over the "
             "caller's namespaces",
    "name_to_handle_at": "only encodes a handle for a path the caller can already open; using a handle "
                         "needs open_by_handle_at, which is denied",
    "adjtimex": "with modes 0 it only reads the clock state (ntp_gettime); setting the clock needs "
                "CAP_SYS_TIME in the initial user namespace",
    "clock_adjtime": "as adjtimex",
    "seccomp": "a process may stack filters of its own; filters only ever restrict",
}


def _default_policy() -> Seccomp:
    """The policy every sandbox gets unless its Spec says otherwise.

    It denies whatever reaches kernel code that is not namespaced or is widely
    exploited. The reasons are in DEFAULT_POLICY_REASONS. Errors are EPERM,
    except ENOSYS where callers have a fallback for a missing syscall (clone3,
    the new mount API). It leaves alone what capabilities already decide.
    mount, umount2, pivot_root and chroot stay allowed: with the capabilities
    dropped they fail anyway. A caller who adds CAP_SYS_ADMIN or
    CAP_SYS_CHROOT asked for them, and then they act only on the sandbox's
    own mount namespace. Denying them would just break that choice. The new
    mount API is denied even so. It is young code, it is reachable from a
    user namespace (CVE-2022-0185), and it has a clean ENOSYS fallback to
    mount(2). DEFAULT_POLICY_ALLOWED explains the other notable syscalls
    left allowed (ptrace, setns, ...).

    The filter belongs last in setup, right before execve. The sandbox's own
    unshare(CLONE_NEWUSER) and mounts come before it.
    """
    tiocs = (termios.TIOCSTI, termios.TIOCLINUX)
    rules = (
        *(ArgRule("ioctl", 1, "eq", req) for req in tiocs),
        ArgRule("clone", 0, "has_bits", CLONE_NEWUSER),
        ArgRule("unshare", 0, "has_bits", CLONE_NEWUSER),
        ArgRule("personality", 0, "eq", 0, action="allow"),
        ArgRule("personality", 0, "eq", 0xFFFFFFFF, action="allow"),
    )
    conditional = {r.syscall for r in rules} - {"personality"}
    deny = tuple(n for n in DEFAULT_POLICY_REASONS if n not in conditional)
    return Seccomp(deny=deny, rules=rules, errnos={n: _errno.ENOSYS for n in _ENOSYS_FALLBACK})


DEFAULT_POLICY: Seccomp = _default_policy()


def policy_table(policy: Seccomp = DEFAULT_POLICY) -> list[tuple[str, str]]:
    """(syscall, effect) for every syscall a policy treats specially, sorted by name.

    e.g. ("ioctl", "ERRNO(EPERM) if args[1] == 0x5412 (low 32 bits); ...; else ALLOW").
    Pair with DEFAULT_POLICY_REASONS / DEFAULT_POLICY_ALLOWED to print the table of docs/hardening.md.
    """
    # lazy: the compiler and the disassembler only for a table: 1.1 ms (import timed, median of 7)
    from .compile import _blocks
    from .debug import describe_action

    nums = syscalls.table()
    blocks = _blocks(policy)
    rows = []
    for name in sorted(n for n in nums if nums[n] in blocks):
        block = blocks[nums[name]]
        parts = [r.describe(policy.errno) for r in block.rules]
        base = describe_action(block.word)
        rows.append((name, "; ".join([*parts, f"else {base}"]) if parts else base))
    return rows

