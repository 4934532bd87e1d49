"""What covers a sandbox's /proc: the entries bound read-only or masked below a Proc mount.

Decided here for every executor (sandbox.plan puts the covers on each Proc
op; the native core and bwrap apply them). Pure: the running kernel's
root-only files come in from HostInfo.proc_root_only.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

__all__ = ["BWRAP_PROC_READ_ONLY", "PROC_MASKED", "PROC_MASKED_FOR_ROOT", "PROC_READ_ONLY", "Cover", "proc_covers"]


class Cover(enum.Enum):
    """How an entry below a Proc mount is covered (the letter is its tag on the wire)."""

    READ_ONLY = "r"  # bound read-only over itself, with everything below it
    MASK = "m"  # hidden: the host's /dev/null bound over it, without device access, so it cannot be opened


# What a Proc gets, in this order, on every backend; an entry this kernel
# does not have is skipped. Read-only: the entries that reconfigure the kernel
# or hardware. A root caller's sandbox runs as uid 0 of the host (without
# capabilities), which owns them, so mode bits alone do not stop its writes
# (bwrap 0.8.0 leaves /proc/sys writable: its access(W_OK) test always fails
# on that directory). Masked for every sandbox: the kernel keyrings as the
# caller sees them, the network namespace's TCP Fast Open key, latency
# statistics. Masked where the sandbox is uid 0 of the host (a root caller,
# whatever uid it has inside): every top-level file only root may read on the
# running kernel (HostInfo.proc_root_only: kernel memory layout and timers,
# the aids of heap exploits, page flags, and whatever a kernel build adds),
# and these names wherever a kernel makes them readable to root alone in a
# directory or under another mode.
PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus", "fs", "acpi", "asound", "scsi", "driver")
PROC_MASKED = ("keys", "key-users", "latency_stats", "sys/net/ipv4/tcp_fastopen_key")
PROC_MASKED_FOR_ROOT = ("slabinfo", "vmallocinfo", "pagetypeinfo", "timer_list", "timer_stats", "sched_debug",
                        "kpagecount", "kpageflags", "kpagecgroup")

# A Proc(covers="bwrap") gets bubblewrap 0.8.0's covers, where bwrap makes
# them: it binds these read-only over themselves where its access(W_OK) test
# passes, which is for a root caller (the files belong to the host's root,
# which no other caller's sandbox is). Nothing is covered for anybody else,
# and so a user namespace made inside can mount a procfs of its own (as
# `unshare --user --pid --mount-proc` does): the kernel allows that only
# where a procfs with nothing mounted over its entries is already visible
# (fs/namespace.c, mnt_already_visible; "mount too revealing"), and every
# cover would be such a mount. For a root caller that nested mount fails
# under bwrap too (its covers of irq and bus are enough), so this package
# costs nothing there by doing more than bwrap: /proc/sys is read-only
# (bwrap's access() test always fails on that directory, leaving the host's
# sysctls writable by uid 0 of the host), and the root-only files are hidden
# as in the strict set.
BWRAP_PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus")


def proc_covers(host_uid: int, root_only: Iterable[str] = (),
                cover_set: str = "strict") -> tuple[tuple[str, Cover], ...]:
    """The covers of a Proc whose `covers` is `cover_set` ("strict" or "bwrap",
    see S.Proc), in a sandbox whose caller has `host_uid`, on a kernel whose
    root-only /proc files are `root_only`."""
    root_masked = PROC_MASKED_FOR_ROOT + tuple(sorted(set(root_only) - set(PROC_MASKED_FOR_ROOT)))
    read_only: tuple[str, ...]
    masked: tuple[str, ...]
    if cover_set == "bwrap":
        if host_uid != 0:
            return ()
        read_only, masked = BWRAP_PROC_READ_ONLY, ("sys/net/ipv4/tcp_fastopen_key", *root_masked)
    else:
        read_only, masked = PROC_READ_ONLY, PROC_MASKED + (root_masked if host_uid == 0 else ())
    return (*((name, Cover.READ_ONLY) for name in read_only), *((name, Cover.MASK) for name in masked))
