"""Conformance cases as data: a sandbox description, what the probe is asked,
and what it must observe. Every case runs on every available backend.

A case's spec is the base world (read-only /usr, the /bin /lib /lib64 links,
the probe itself as a read-only file at /probe.py) plus `mounts` (and /proc at
the end if the request asks about mounts and the case has none), with the
other Spec fields from `spec`. Strings may hold "/{host}" (a host directory
tree made per session, see HOST_TREE), "/{scratch}" (a host directory made
afresh for each run from the case's `scratch` tree) and "{uid}"/"{gid}" (the
caller's ids); `model.fill()` substitutes them. `expect` maps a key path into
the probe's JSON report (plus "host": what the host sees of `host_paths`
afterwards) to the value it must have (or a Matcher, see model.py). `error`
names the exception a case must raise instead of running, with attributes to
check.

On "workerpool" the probe runs as a task function (probe.task) of a
sandbox.WorkerPool of the case's Spec. WorkerPool needs a Proc and a Dev at
/dev in every Spec: a case without them is checked to be refused for
"mounts", then runs with them added (test_conformance.run_in_workerpool).
What that, and a task's nature, changes is declared per case with `differs`
or `expect_on` and `why` (the WP_* reasons below); a Spec WorkerPool refuses
by design is `refused` (the field its SpecError names); what has no meaning
for a function is `not_applicable`, with the reason.
"""

from __future__ import annotations

import dataclasses
import errno as E
import hashlib
import signal
from typing import Any

from sandbox import spec as S

from .model import (
    AbsentOr,
    Case,
    Contains,
    ContainsAll,
    CountedOn,
    EndsWith,
    Greater,
    HostValue,
    InHost,
    OneOf,
    Plus,
    Prefix,
    SubsetOf,
    WithHost,
    ro,
    rw,
)
from .seccomp_cases import seccomp_cases

# The host tree every session makes (relative to "{host}"): name -> content
# (None: a directory; "->x": a symlink to x).
HOST_TREE: dict[str, str | None] = {
    "ro": None,
    "ro/file": "hello\n",
    "ro/inner": None,
    "ro/sub": None,
    "rw": None,
    "link": "->ro",
    "file-link": "->ro/file",
    "home": None,
    "cwd": None,
    "cwd/marker": "here\n",
    "tree": None,
    "tree/abs": "->/tdir",
}


PYTHON = "/usr/bin/python3"  # the interpreter the probe runs with (see test_conformance.py)
# Fixed numbers, far above what the test process uses (its long-lived fds,
# such as the shared namespace pool's, must never be clobbered by dup2).
PASSED_FD = 901  # the number a passed pipe gets (pass_fd=True)
LEAKED_FD = 902  # an inheritable fd of the caller's (leak_fd=True)
IPV6_LOOPBACK = "lo/00000000000000000000000000000001"
LO_FLAGS = ["LOOPBACK", "RUNNING", "UP"]
FLAGS_RO = ["nodev", "nosuid", "ro"]
FLAGS_RW = ["nodev", "nosuid", "rw"]
H = "/{host}"  # absolute, so Spec validation accepts it before fill()
SCRATCH = "/{scratch}"
ZERO_CAPS = "0000000000000000"
NET_BIND_SERVICE = f"{1 << 10:016x}"
BLOB = bytes(range(256)) * 3
BLOB_SHA256 = hashlib.sha256(BLOB).hexdigest()
# Why a case's expectations differ on WorkerPool (its `why`), and what it has no meaning for.
WP = "workerpool"
TR = "template-recycle"
TR_PIDS = ("a recycled Template sandbox keeps its pid namespace across requests: its pid numbers keep counting, "
           "and where one process makes its commands (the filter refuses keyrings) that one is seen too "
           "(docs/template.md)")
WP_PID_1 = ("a WorkerPool task is pid 1 of its own pid namespace (no reaper); it is a fork of the zygote, "
            "whose command line it keeps")
WP_OWN_SIGNAL = ("a WorkerPool task is pid 1 of its own pid namespace: the kernel drops a signal it sends itself "
                 "at SIG_DFL, SIGKILL too (as pid_1_cannot_kill_itself); the task then exits 0 without a reply")
WP_PROC_DEV = ("WorkerPool needs a Proc and a Dev at /dev in every Spec, so the case runs with them added: "
               "/proc and /dev exist")
WP_INTERPRETER = ("a WorkerPool task's world adds its interpreter's paths read-only at their host paths (its venv, "
                  "standard library, site-packages): / gains their top directories (\"workerpool.tops\")")
WP_CHANNEL = "fd 3 of a WorkerPool task is its channel to the caller (its call comes in, its reply goes out)"
WP_ROOT_STAND_IN = ("a WorkerPool task that is uid 0 inside maps onto its zygote's uid 1 "
                    "(warm_plan.ZYGOTE_ROOT_STAND_IN: a zygote never runs as uid 0), which is the caller's uid outside")
WP_SHARED_DEV = ("a WorkerPool zygote's /dev is one tmpfs shared by its tasks: read-only (each task has its own shm "
                 "and pts)")
WP_NESTS = ("WorkerPool needs a Dev at /dev, so the case runs with one added: with it a task whose uid is not 0 runs "
            "in a user namespace nested in one that maps uid 0 (as uid_gid_with_dev_nests), and the outer one owns "
            "the network namespace (as nested_userns_caps_do_not_reach_the_network)")
WP_SHARED_OVERLAY = ("a WorkerPool zygote's Overlay is one mount shared by its tasks: read-only in them, as its root "
                     "is, so that no task sees what another wrote")
WP_NO_ARGV = "a WorkerPool task runs a function, not a command: there is no argv to look up or execute"
WP_NO_PASS_FDS = "a WorkerPool task is passed no fds: a function gets its inputs as arguments"
WP_TOPS = "workerpool.tops"
PROC_KNOBS = ("/proc/sys",)  # the kernel-reconfiguring parts of procfs
PROC_KNOBS_MAYBE = ("/proc/sysrq-trigger", "/proc/irq", "/proc/bus")  # (not on every kernel)
# Missing parents get bubblewrap 0.8.0's modes (measured with it): 0700 for a
# bind, a symlink or a proc; a tmpfs's own mode; a Dir's own mode with r added
# wherever it has x; 0755 for a File with the default mode.
PARENT_MODES = {
    "/a": "0o700", "/a/b": "0o700",
    "/t": "0o755", "/t/u": "0o755", "/pt": "0o700", "/pt/u": "0o700",
    "/d": "0o755", "/d/e": "0o755", "/d/e/f": "0o755",
    "/p": "0o750", "/p/q": "0o750", "/p/q/r": "0o750", "/o": "0o705", "/o/q": "0o705", "/o/q/r": "0o701",
    "/f": "0o755", "/f/g": "0o755", "/f/g/h": "0o666",
    "/s": "0o700", "/pp": "0o700",
}

MOUNT_CASES = [
    Case("ro_bind", mounts=(ro(f"{H}/ro", "/data"),),
         request={"paths": ["/data/file"], "writable": ["/data", "/data/file", "/usr"], "mounts": ["/data"],
                  "actions": [["mkdir", "/data/d"]]},
         expect={("paths", "/data/file", "content"): "hello\n", ("writable", "/data"): "EROFS",
                 ("writable", "/data/file"): "EROFS", ("writable", "/usr"): "EROFS", ("actions",): ["EROFS"],
                 ("mounts", "points", "/data", "flags"): FLAGS_RO}),
    Case("rw_bind", mounts=(rw(f"{H}/rw", "/rw"),),
         request={"writable": ["/rw"], "mounts": ["/rw"]},
         expect={("writable", "/rw"): "yes", ("mounts", "points", "/rw", "flags"): FLAGS_RW}),
    Case("bind_single_file", mounts=(ro(f"{H}/ro/file", "/etc/one"),),
         request={"paths": ["/etc/one", "/etc"], "mounts": ["/etc/one"]},
         expect={("paths", "/etc/one", "content"): "hello\n", ("paths", "/etc", "mode"): "0o700",
                 ("mounts", "points", "/etc/one", "flags"): FLAGS_RO}),
    Case("dev_bind_allows_devices", mounts=(S.DevBind("/dev/null", "/devnull"), rw("/dev/null", "/nulldev")),
         request={"paths": ["/devnull"], "writable": ["/devnull", "/nulldev"], "mounts": ["/devnull", "/nulldev"]},
         expect={("paths", "/devnull", "type"): "char", ("writable", "/devnull"): "yes",
                 ("writable", "/nulldev"): "EACCES", ("mounts", "points", "/devnull", "flags"): ["nosuid", "rw"],
                 ("mounts", "points", "/nulldev", "flags"): FLAGS_RW}),
    Case("bind_try_missing_source_is_skipped",
         mounts=(ro("/nonexistent-sandbox-source", "/opt/x", optional=True), rw(f"{H}/rw", "/rw", optional=True)),
         request={"paths": ["/opt/x", "/opt", "/rw"], "writable": ["/rw"]},
         expect={("paths", "/opt/x", "exists"): False, ("paths", "/opt", "exists"): False,
                 ("paths", "/rw", "type"): "dir", ("writable", "/rw"): "yes"},
         expect_on={WP: {("paths", "/opt", "exists"): InHost("opt", WP_TOPS)}}, why={WP: WP_INTERPRETER}),
    Case("symlinked_source_binds_its_target", mounts=(ro(f"{H}/link", "/via"),),
         request={"paths": ["/via", "/via/file"], "mounts": ["/via"]},
         expect={("paths", "/via", "type"): "dir", ("paths", "/via/file", "content"): "hello\n",
                 ("mounts", "points", "/via", "root"): EndsWith("/ro")}),
    Case("ro_inside_rw", mounts=(rw(f"{H}/rw", "/w"), ro(f"{H}/ro", "/w/sub")),
         request={"writable": ["/w", "/w/sub"], "mounts": ["/w", "/w/sub"]},
         expect={("writable", "/w"): "yes", ("writable", "/w/sub"): "EROFS",
                 ("mounts", "points", "/w/sub", "flags"): FLAGS_RO}),
    Case("rw_inside_ro", mounts=(ro(f"{H}/ro", "/r"), rw(f"{H}/rw", "/r/inner")),
         request={"writable": ["/r", "/r/inner"], "paths": ["/r/file"]},
         expect={("writable", "/r"): "EROFS", ("writable", "/r/inner"): "yes",
                 ("paths", "/r/file", "content"): "hello\n"}),
    Case("bind_parents_are_0700", mounts=(rw(f"{H}/rw", "/x/y/z"),),
         request={"paths": ["/x", "/x/y", "/x/y/z"]},
         expect={("paths", "/x", "mode"): "0o700", ("paths", "/x/y", "mode"): "0o700",
                 ("paths", "/x/y/z", "type"): "dir"}),
    Case("tmpfs_size_and_perms", mounts=(S.Tmpfs("/scratch", size=1 << 20, perms=0o1777),),
         request={"paths": ["/scratch"], "writable": ["/scratch"], "mounts": ["/scratch"],
                  "actions": [["write", "/scratch/big", 2 << 20]]},
         expect={("paths", "/scratch", "mode"): "0o1777", ("writable", "/scratch"): "yes",
                 ("mounts", "points", "/scratch", "fstype"): "tmpfs",
                 ("mounts", "points", "/scratch", "size"): "1024k",
                 ("mounts", "points", "/scratch", "flags"): FLAGS_RW, ("actions",): ["ENOSPC"]}),
    Case("tmpfs_default_mode_and_parents", mounts=(S.Tmpfs("/a/b/t", perms=0o750),),
         request={"paths": ["/a", "/a/b", "/a/b/t"], "mounts": ["/a/b/t"]},
         expect={("paths", "/a", "mode"): "0o750", ("paths", "/a/b/t", "mode"): "0o750",
                 ("mounts", "points", "/a/b/t", "mode"): "750"}),
    Case("proc_with_pid_namespace", mounts=(S.Proc(),),
         request={"mounts": ["/proc"], "paths": ["/proc/self"]},
         expect={("mounts", "points", "/proc", "fstype"): "proc",
                 ("mounts", "points", "/proc", "flags"): ["nodev", "noexec", "nosuid", "rw"],
                 ("proc", "visible_pids"): [1, 2], ("paths", "/proc/self", "type"): "link"},
         expect_on={WP: {("proc", "visible_pids"): [1]}, TR: {("proc", "visible_pids"): CountedOn()}},
         why={WP: WP_PID_1, TR: TR_PIDS}),
    Case("proc_without_pid_namespace_is_the_hosts", mounts=(S.Proc(),),
         spec={"namespaces": S.Namespaces(pid=False)},
         request={"mounts": ["/proc"]},
         expect={("ns", "pid"): HostValue("ns.pid"), ("proc", "pid"): Greater(2),
                 ("proc", "pid1_cmdline"): HostValue("proc.pid1_cmdline"),
                 ("mounts", "points", "/proc", "fstype"): "proc"},
         refused={WP: "namespaces"}),
    # A proc elsewhere only: WorkerPool needs one at /proc (its tasks map their ids through it).
    Case("proc_only_elsewhere", mounts=(S.Proc("/view/proc"), S.Dev()),
         request={"paths": ["/proc", "/view/proc/self"]},
         expect={("paths", "/proc", "exists"): False, ("paths", "/view/proc/self", "type"): "link"},
         refused={WP: "mounts"}),
    Case("dev", mounts=(S.Dev(),),
         request={"paths": ["/dev", "/dev/null", "/dev/ptmx", "/dev/stdout", "/dev/shm", "/dev/fd"],
                  "writable": ["/dev/null", "/dev/full"], "mounts": ["/dev", "/dev/pts", "/dev/null"]},
         expect={("paths", "/dev", "entries"): ["core", "fd", "full", "null", "ptmx", "pts", "random", "shm",
                                                "stderr", "stdin", "stdout", "tty", "urandom", "zero"],
                 ("paths", "/dev/null", "type"): "char", ("paths", "/dev/ptmx", "target"): "pts/ptmx",
                 ("paths", "/dev/stdout", "target"): "/proc/self/fd/1", ("paths", "/dev/shm", "type"): "dir",
                 ("writable", "/dev/null"): "yes", ("mounts", "points", "/dev/pts", "fstype"): "devpts",
                 ("mounts", "points", "/dev", "flags"): FLAGS_RW,
                 ("mounts", "points", "/dev/null", "flags"): ["nosuid", "rw"]},
         # a Template's /dev is one tmpfs shared by its sandboxes: read-only (each has its own shm and pts)
         differs={"template": (("mounts", "points", "/dev", "flags"),)},
         expect_on={WP: {("mounts", "points", "/dev", "flags"): FLAGS_RO}}, why={WP: WP_SHARED_DEV}),
    Case("dev_modes", mounts=(S.Dev(),), request={"paths": ["/dev", "/dev/shm"], "writable": ["/dev/shm"]},
         expect={("paths", "/dev", "mode"): "0o755", ("paths", "/dev/shm", "mode"): "0o1777",
                 ("writable", "/dev/shm"): "yes"}),
    Case("dir_perms_and_parents", mounts=(S.Dir("/d/e/f", perms=0o710), S.Dir("/d")),
         request={"paths": ["/d", "/d/e", "/d/e/f"]},
         expect={("paths", "/d", "mode"): "0o750", ("paths", "/d/e", "mode"): "0o750",
                 ("paths", "/d/e/f", "mode"): "0o710"}),
    Case("dir_then_tmpfs_over_it", mounts=(S.Dir("/m", perms=0o700), S.Tmpfs("/m")),
         request={"paths": ["/m"], "mounts": ["/m"]},
         expect={("paths", "/m", "mode"): "0o755", ("mounts", "points", "/m", "fstype"): "tmpfs"}),
    Case("symlinks", mounts=(S.Dir("/t"), S.Symlink("t", "/rel"), S.Symlink("/t", "/abs"),
                             S.Symlink("/nowhere", "/s/dangling")),
         request={"paths": ["/rel", "/abs", "/s", "/s/dangling"]},
         expect={("paths", "/rel", "target"): "t", ("paths", "/rel", "resolves"): True,
                 ("paths", "/abs", "target"): "/t", ("paths", "/s", "mode"): "0o700",
                 ("paths", "/s/dangling", "resolves"): False}),
    Case("file_data_and_perms", mounts=(S.File("/etc/hello", b"hi there\n", perms=0o640),),
         request={"paths": ["/etc/hello", "/etc"], "writable": ["/etc/hello"]},
         expect={("paths", "/etc/hello", "content"): "hi there\n", ("paths", "/etc/hello", "mode"): "0o640",
                 ("paths", "/etc", "mode"): "0o750", ("writable", "/etc/hello"): "yes"}),
    Case("file_readonly", mounts=(S.File("/etc/conf", b"x=1\n", perms=0o644, readonly=True),),
         request={"paths": ["/etc/conf"], "writable": ["/etc/conf"], "mounts": ["/etc/conf"]},
         expect={("paths", "/etc/conf", "content"): "x=1\n", ("writable", "/etc/conf"): "EROFS",
                 ("mounts", "points", "/etc/conf", "flags"): FLAGS_RO}),
    Case("file_empty_default_mode", mounts=(S.File("/empty"),),
         request={"paths": ["/empty"]},
         expect={("paths", "/empty", "content"): "", ("paths", "/empty", "mode"): "0o666"}),
    Case("remount_ro", mounts=(rw(f"{H}/rw", "/rw"), S.RemountRo("/rw")),
         request={"writable": ["/rw"], "mounts": ["/rw"]},
         expect={("writable", "/rw"): "EROFS", ("mounts", "points", "/rw", "flags"): FLAGS_RO}),
    Case("remount_ro_of_tmpfs_adds_nodev", mounts=(S.Tmpfs("/t"), S.Tmpfs("/u"), S.RemountRo("/t")),
         request={"mounts": ["/t", "/u"], "writable": ["/t", "/u"]},
         expect={("mounts", "points", "/t", "flags"): FLAGS_RO, ("writable", "/t"): "EROFS",
                 ("mounts", "points", "/u", "flags"): FLAGS_RW, ("writable", "/u"): "yes"}),
    Case("remount_ro_leaves_the_host_writable", scratch={}, mounts=(rw(SCRATCH, "/w"), S.RemountRo("/w")),
         request={"writable": ["/w"]}, host_paths=(".",),
         expect={("writable", "/w"): "EROFS", ("host", ".", "writable"): "yes"}),
    Case("chmod", mounts=(S.Dir("/c"), S.Chmod("/c", 0o711), S.File("/f", b"", perms=0o600), S.Chmod("/f", 0o4755),
                          S.Tmpfs("/t"), S.Chmod("/t", 0o1777), S.File("/x", b"#!/bin/sh\necho ran\n", perms=0o600),
                          S.Chmod("/x", 0o755)),
         request={"paths": ["/c", "/f", "/t"], "actions": [["run", ["/x"]]]},
         expect={("paths", "/c", "mode"): "0o711", ("paths", "/f", "mode"): "0o4755",
                 ("paths", "/t", "mode"): "0o1777", ("actions",): [[0, "ran\n"]]}),
    Case("destination_through_an_absolute_symlink", mounts=(S.Dir("/tdir"), ro(f"{H}/tree", "/tree"),
                                                             S.Tmpfs("/tree/abs/x")),
         request={"paths": ["/tdir/x"]}, expect={("paths", "/tdir/x", "type"): "dir"},
         known_bug={"bwrap": "the bwrap backend refuses a destination through a symlink inside a bound "
                             "directory (bwrap would follow it against its staging root, where the host is "
                             "at /oldroot: bubblewrap #195, backends/bwrap/dests.py)"}),
    Case("undeclared_paths_do_not_exist",
         request={"paths": ["/etc", "/home", "/tmp", "/proc", "/dev", "/root", "/etc/shadow", "/var", "/opt",
                            "/sys", "/run", "/"]},
         expect={("paths", "/etc", "exists"): False, ("paths", "/home", "exists"): False,
                 ("paths", "/tmp", "exists"): False, ("paths", "/proc", "exists"): False,
                 ("paths", "/dev", "exists"): False, ("paths", "/root", "exists"): False,
                 ("paths", "/etc/shadow", "exists"): False, ("paths", "/var", "exists"): False,
                 ("paths", "/opt", "exists"): False, ("paths", "/sys", "exists"): False,
                 ("paths", "/run", "exists"): False,
                 ("paths", "/", "entries"): ["bin", "lib", "lib64", "probe.py", "usr"]},
         expect_on={WP: {("paths", "/proc", "exists"): True, ("paths", "/dev", "exists"): True,
                         **{("paths", top, "exists"): InHost(top[1:], WP_TOPS)
                            for top in ("/etc", "/home", "/tmp", "/root", "/var", "/opt", "/sys", "/run")},
                         ("paths", "/", "entries"): WithHost(("bin", "dev", "lib", "lib64", "probe.py", "proc", "usr"),
                                                             WP_TOPS)}},
         why={WP: f"{WP_PROC_DEV}; {WP_INTERPRETER}"}),
    Case("bind_writes_land_on_the_host", scratch={"old": "old\n", "gone": ""}, mounts=(rw(SCRATCH, "/w"),),
         request={"actions": [["write", "/w/new", 4], ["append", "/w/old", "more\n"], ["mkdir", "/w/d"],
                              ["rm", "/w/gone"]]},
         host_paths=(".", "new", "old", "d"),
         expect={("actions",): ["ok", "ok", "ok", "ok"], ("host", ".", "entries"): ["d", "new", "old"],
                 ("host", "new", "content"): "xxxx", ("host", "new", "owner"): "caller",
                 ("host", "old", "content"): "old\nmore\n", ("host", "d", "type"): "dir"}),
    Case("tmpfs_hides_what_is_below_and_keeps_writes", scratch={"host-file": "host\n"},
         mounts=(rw(SCRATCH, "/s"), S.Tmpfs("/s")), request={"paths": ["/s"], "actions": [["write", "/s/new", 1]]},
         host_paths=(".",),
         expect={("paths", "/s", "entries"): [], ("actions",): ["ok"], ("host", ".", "entries"): ["host-file"]}),
    # An overlayfs of a host directory: its files, and writes that stay in the sandbox's own upper layer.
    Case("overlay_shows_its_lower_and_keeps_writes_inside", scratch={"lower": None, "lower/f": "lower\n"},
         mounts=(S.Overlay("/o", [f"{SCRATCH}/lower"]),),
         request={"paths": ["/o", "/o/f"], "actions": [["write", "/o/new", 1], ["append", "/o/f", "more\n"]]},
         host_paths=("lower", "lower/f"),
         expect={("paths", "/o", "entries"): ["f"], ("paths", "/o/f", "content"): "lower\n",
                 ("actions",): ["ok", "ok"], ("host", "lower", "entries"): ["f"],
                 ("host", "lower/f", "content"): "lower\n"},
         expect_on={WP: {("actions",): ["EROFS", "EROFS"]}}, why={WP: WP_SHARED_OVERLAY},
         not_applicable={"bwrap": "bubblewrap 0.8.0 has no --overlay: the bwrap backend refuses an Overlay by "
                                  "capability, before anything runs (tests/images/test_image_root.py)"}),
    # Every run gets a fresh /tmp: empty, though the previous run wrote to its own.
    Case("tmp_starts_empty", mounts=(S.Tmpfs("/tmp"),),
         request={"paths": ["/tmp"], "actions": [["write", "/tmp/f", 1]]},
         expect={("paths", "/tmp", "entries"): [], ("actions",): ["ok"]}),
    Case("symlinked_file_source_binds_the_file", mounts=(ro(f"{H}/file-link", "/etc/config"),),
         request={"paths": ["/etc/config"]},
         expect={("paths", "/etc/config", "type"): "file", ("paths", "/etc/config", "content"): "hello\n"}),
    Case("missing_parent_modes",
         mounts=(ro(f"{H}/ro", "/a/b/bound"), S.Tmpfs("/t/u/v"), S.Tmpfs("/pt/u/v", perms=0o700), S.Dir("/d/e/f"),
                 S.Dir("/p/q/r", perms=0o750), S.Dir("/o/q/r", perms=0o701), S.File("/f/g/h", b"x"),
                 S.Symlink("x", "/s/l"), S.Proc("/pp/proc")),
         request={"paths": list(PARENT_MODES)},
         expect={("paths", path, "mode"): mode for path, mode in PARENT_MODES.items()}),
    Case("dir_perms_and_an_existing_dir_keeps_its_mode",
         mounts=(S.Dir("/sticky", perms=0o1777), S.Dir("/priv", perms=0o700), S.Dir("/usr/share", perms=0o700)),
         request={"paths": ["/sticky", "/priv", "/usr/share"]},
         expect={("paths", "/sticky", "mode"): "0o1777", ("paths", "/priv", "mode"): "0o700",
                 ("paths", "/usr/share", "mode"): HostValue("mode./usr/share")}),
    Case("file_binary_data_and_readonly_default_mode",
         mounts=(S.File("/etc/blob", BLOB, perms=0o640), S.File("/etc/ro", b"fixed\n", readonly=True)),
         request={"paths": ["/etc/blob", "/etc/ro"], "writable": ["/etc/ro"]},
         expect={("paths", "/etc/blob", "sha256"): BLOB_SHA256, ("paths", "/etc/blob", "size"): len(BLOB),
                 ("paths", "/etc/blob", "mode"): "0o640", ("paths", "/etc/ro", "mode"): "0o666",
                 ("paths", "/etc/ro", "content"): "fixed\n", ("writable", "/etc/ro"): "EROFS"}),
    # Setup runs with its own umask (modes are exact); the command gets the caller's.
    Case("umask_is_the_callers", host_umask=0o027, mounts=(S.Tmpfs("/tmp"),),
         request={"actions": [["write", "/tmp/f", 1], ["mkdir", "/tmp/d"], ["mode", "/tmp/f"], ["mode", "/tmp/d"]]},
         expect={("umask",): "0o27", ("actions",): ["ok", "ok", "0o640", "0o750"]}),
    # The native backend binds the knobs read-only on top; bwrap does so only where they are writable.
    Case("mount_flags_of_the_base", mounts=(S.Proc(),),
         request={"mounts": ["/", "/usr", *PROC_KNOBS, *PROC_KNOBS_MAYBE]},
         expect={("mounts", "points", "/", "fstype"): "tmpfs",
                 ("mounts", "points", "/", "flags"): ContainsAll(("nodev", "nosuid")),
                 ("mounts", "points", "/usr", "flags"): FLAGS_RO,
                 **{("mounts", "points", knob, "flags"): Contains("ro") for knob in PROC_KNOBS},
                 **{("mounts", "points", knob, "flags"): AbsentOr(Contains("ro")) for knob in PROC_KNOBS_MAYBE}},
         differs={"bwrap": tuple(("mounts", "points", knob) for knob in (*PROC_KNOBS, *PROC_KNOBS_MAYBE))}),
    # Binds are recursive: the host's submounts come along, each read-only, nosuid and nodev.
    Case("ro_bind_reaches_submounts", mounts=(ro("/dev", "/hostdev"),),
         request={"below": ["/hostdev"], "writable": ["/hostdev/shm"]},
         expect={("below", "/hostdev", "count"): Greater(1),
                 ("below", "/hostdev", "flags"): ContainsAll(tuple(FLAGS_RO)), ("writable", "/hostdev/shm"): "EROFS"}),
    Case("ro_bind_of_the_root_covers_every_host_mount", mounts=(ro("/", "/host"),),
         request={"below": ["/host"], "writable": ["/host/tmp"], "paths": ["/host/proc/sys/kernel/ostype"]},
         expect={("below", "/host", "count"): Greater(2), ("below", "/host", "flags"): Contains("ro"),
                 ("writable", "/host/tmp"): "EROFS",
                 ("paths", "/host/proc/sys/kernel/ostype", "content"): "Linux\n"}),
]


def _dev_is_usable(name: str, **ids: int) -> Case:
    """/dev works for the command, whoever it runs as: the null, zero, full and
    random devices, /dev/shm, the fd links and a fresh pseudo-terminal."""
    return Case(name, mounts=(S.Proc(), S.Dev()), spec=ids,
                request={"paths": ["/dev/fd", "/dev/stdin", "/dev/ptmx"],
                         "actions": [["write", "/dev/null", 1], ["read", "/dev/zero", 3], ["count", "/dev/urandom", 5],
                                     ["write", "/dev/shm/f", 3], ["read", "/dev/shm/f", 10],
                                     ["write", "/dev/full", 1], ["pty"]]},
                expect={("paths", "/dev/fd", "target"): "/proc/self/fd",
                        ("paths", "/dev/stdin", "target"): "/proc/self/fd/0",
                        ("paths", "/dev/ptmx", "target"): "pts/ptmx",
                        ("actions",): ["ok", "000000", 5, "ok", "787878", "ENOSPC", ["/dev/pts/0", "68690d0a"]]})


DEV_CASES = [
    _dev_is_usable("dev_is_usable"),
    _dev_is_usable("dev_is_usable_as_uid_1000", uid=1000, gid=1000),
    _dev_is_usable("dev_is_usable_as_root", uid=0, gid=0),
]

NAMESPACE_CASES = [
    Case("all_namespaces_by_default", mounts=(S.Proc(),),
         expect={("ns", "user"): HostValue("ns.user", differ=True), ("ns", "mnt"): HostValue("ns.mnt", differ=True),
                 ("ns", "pid"): HostValue("ns.pid", differ=True), ("ns", "net"): HostValue("ns.net", differ=True),
                 ("ns", "ipc"): HostValue("ns.ipc", differ=True), ("ns", "uts"): HostValue("ns.uts", differ=True),
                 ("ns", "cgroup"): HostValue("ns.cgroup", differ=True), ("proc", "pid"): 2, ("proc", "ppid"): 1,
                 ("hostname",): HostValue("hostname"), ("proc", "pid1_cmdline"): Prefix(("sandbox-init",))},
         # pid 1 is bwrap itself; a Template's sandbox keeps its clone of sandbox-template as its pid 1
         differs={"bwrap": (("proc", "pid1_cmdline"),), "template": (("proc", "pid1_cmdline"),),
                  WP: (("proc", "pid1_cmdline"),)},
         expect_on={WP: {("proc", "pid"): 1, ("proc", "ppid"): 0}, TR: {("proc", "pid"): Greater(2)}},
         why={WP: WP_PID_1, TR: TR_PIDS}),
    # Only loopback traffic, inside the sandbox's own namespace; a UDP connect() sends nothing.
    Case("network_none_is_loopback_only", mounts=(S.Proc(),),
         request={"actions": [["tcp_echo", "127.0.0.1"], ["tcp_echo", "::1"], ["udp_connect", "192.0.2.1"]]},
         expect={("net", "interfaces"): ["lo"], ("net", "flags", "lo"): LO_FLAGS,
                 ("net", "ipv4_local"): ["127.0.0.1"], ("net", "inet6"): [IPV6_LOOPBACK],
                 ("net", "ipv4_routes"): 0, ("net", "ipv6_route_devs"): ["lo"],
                 ("actions",): ["ping", "ping", "ENETUNREACH"]}),
    Case("network_host", mounts=(S.Proc(),), spec={"network": "host"},
         expect={("ns", "net"): HostValue("ns.net"), ("net", "interfaces"): HostValue("net.interfaces")},
         refused={WP: "network"}),
    Case("shared_ipc_uts_cgroup", spec={"namespaces": S.Namespaces(ipc=False, uts=False, cgroup=False)},
         mounts=(S.Proc(),),
         expect={("ns", "ipc"): HostValue("ns.ipc"), ("ns", "uts"): HostValue("ns.uts"),
                 ("ns", "cgroup"): HostValue("ns.cgroup"), ("hostname",): HostValue("hostname")},
         refused={WP: "namespaces"}),
    Case("no_pid_namespace", spec={"namespaces": S.Namespaces(pid=False)}, mounts=(S.Proc(),),
         expect={("ns", "pid"): HostValue("ns.pid"), ("proc", "pid"): Greater(2),
                 ("proc", "pid1_cmdline"): HostValue("proc.pid1_cmdline")},
         refused={WP: "namespaces"}),
    Case("as_pid_1", spec={"as_pid_1": True}, mounts=(S.Proc(),),
         expect={("proc", "pid"): 1, ("proc", "ppid"): 0, ("proc", "visible_pids"): [1],
                 ("proc", "pid1_cmdline"): Prefix((PYTHON, "-I", "-S", "/probe.py"))},
         differs={WP: (("proc", "pid1_cmdline"),)}, why={WP: WP_PID_1}),
    Case("no_user_namespace_as_root", spec={"namespaces": S.Namespaces(user=False)}, mounts=(S.Proc(),),
         root_only=True,
         expect={("ns", "user"): HostValue("ns.user"), ("ids", "uid"): 0,
                 ("ids", "uid_map"): HostValue("ids.uid_map"), ("status", "CapEff"): ZERO_CAPS,
                 ("status", "CapPrm"): ZERO_CAPS, ("status", "CapBnd"): ZERO_CAPS, ("status", "NoNewPrivs"): "1"},
         differs={"bwrap": (("status", "CapBnd"),)},  # as root without a user namespace bwrap keeps it
         refused={WP: "namespaces"}),
    Case("hostname", spec={"hostname": "sbx-conformance"}, expect={("hostname",): "sbx-conformance"}),
    Case("no_mount_namespace", base=False, probe_on_host=True,
         spec={"namespaces": S.Namespaces(mount=False)}, request={"paths": ["/usr/bin/python3"]},
         expect={("ns", "mnt"): HostValue("ns.mnt"), ("ns", "user"): HostValue("ns.user", differ=True),
                 ("paths", "/usr/bin/python3", "exists"): True},
         differs={"bwrap": (("ns", "mnt"),)},  # bwrap always makes one (the host root bound whole)
         refused={WP: "namespaces"}),
    Case("user_namespaces_denied_by_default_policy", request={"actions": [["unshare_user"]]},
         expect={("actions",): ["EPERM"]}),
    Case("user_namespaces_allowed_without_seccomp", spec={"seccomp": None}, request={"actions": [["unshare_user"]]},
         expect={("actions",): ["ok"], ("status", "Seccomp"): "0"}, mounts=(S.Proc(),)),
    Case("disable_userns", spec={"seccomp": None, "disable_userns": True}, request={"actions": [["unshare_user"]]},
         expect={("actions",): ["ENOSPC"]}),
    Case("disable_userns_with_proc", spec={"seccomp": None, "disable_userns": True}, mounts=(S.Proc(),),
         request={"actions": [["unshare_user"]]}, expect={("actions",): ["ENOSPC"]}),
]

IDENTITY_CASES = [
    Case("default_ids_are_the_callers", mounts=(S.Proc(),),
         expect={("ids", "uid"): HostValue("uid"), ("ids", "gid"): HostValue("gid"), ("ids", "setgroups"): "deny",
                 ("ids", "groups"): SubsetOf(host_keys=("gid",)),
                 ("ids", "uid_map"): ["{uid}", "{uid}", "1"], ("ids", "gid_map"): ["{gid}", "{gid}", "1"]},
         expect_on={WP: {("ids", "uid_map"): ["{uid}", "{wp_uid_outside}", "1"],
                         ("ids", "gid_map"): ["{gid}", "0", "1"]}},
         why={WP: f"as root, {WP_ROOT_STAND_IN}; else {WP_NESTS}"}),
    Case("uid_gid", spec={"uid": 1234, "gid": 2345}, mounts=(S.Proc(), S.Tmpfs("/tmp")),
         request={"actions": [["write", "/tmp/f", 1], ["owner", "/tmp/f"]]},
         expect={("ids", "uid"): 1234, ("ids", "gid"): 2345, ("ids", "euid"): 1234,
                 ("ids", "groups"): SubsetOf((2345,)), ("ids", "setgroups"): "deny",
                 ("ids", "uid_map"): ["1234", "{uid}", "1"], ("ids", "gid_map"): ["2345", "{gid}", "1"],
                 ("actions",): ["ok", "1234:2345"]},
         expect_on={WP: {("ids", "uid_map"): ["1234", "0", "1"], ("ids", "gid_map"): ["2345", "0", "1"]}},
         why={WP: WP_NESTS}),
    Case("uid_gid_with_dev_nests", spec={"uid": 1234, "gid": 2345}, mounts=(S.Proc(), S.Dev(), S.Tmpfs("/tmp")),
         request={"actions": [["write", "/tmp/f", 1], ["owner", "/tmp/f"]]},
         expect={("ids", "uid"): 1234, ("ids", "gid"): 2345,
                 ("ids", "groups"): SubsetOf((2345,)), ("ids", "setgroups"): "deny",
                 ("ids", "uid_map"): ["1234", "0", "1"], ("ids", "gid_map"): ["2345", "0", "1"],
                 ("actions",): ["ok", "1234:2345"]}),
    Case("uid_gid_with_dev_without_proc", spec={"uid": 1234, "gid": 2345}, mounts=(S.Dev(),),
         expect={("ids", "uid"): 1234, ("ids", "gid"): 2345}),
    Case("root_inside", spec={"uid": 0, "gid": 0}, mounts=(S.Proc(),),
         expect={("ids", "uid"): 0, ("ids", "gid"): 0, ("ids", "uid_map"): ["0", "{uid}", "1"],
                 ("status", "CapEff"): ZERO_CAPS, ("status", "CapBnd"): ZERO_CAPS},
         expect_on={WP: {("ids", "uid_map"): ["0", "1", "1"]}}, why={WP: WP_ROOT_STAND_IN}),
    Case("cap_add", spec={"uid": 0, "gid": 0, "cap_add": ("CAP_NET_ADMIN", "CAP_KILL")}, mounts=(S.Proc(),),
         expect={("status", "CapEff"): "0000000000001020", ("status", "CapBnd"): "0000000000001020",
                 ("status", "CapPrm"): "0000000000001020",
                 ("status", "CapAmb"): "0000000000001020", ("status", "NoNewPrivs"): "1"}),
    Case("no_caps_and_no_new_privs", mounts=(S.Proc(),),
         expect={("status", "CapEff"): ZERO_CAPS, ("status", "CapBnd"): ZERO_CAPS, ("status", "CapPrm"): ZERO_CAPS,
                 ("status", "CapInh"): ZERO_CAPS, ("status", "CapAmb"): ZERO_CAPS,
                 ("status", "NoNewPrivs"): "1", ("status", "Seccomp"): "2"}),
    Case("no_seccomp", spec={"seccomp": None}, mounts=(S.Proc(),), expect={("status", "Seccomp"): "0"}),
    Case("writes_as_another_uid_belong_to_the_caller", spec={"uid": 1234, "gid": 4321}, scratch={},
         mounts=(rw(SCRATCH, "/w"),), request={"actions": [["write", "/w/f", 1], ["owner", "/w/f"]]},
         host_paths=("f",), expect={("actions",): ["ok", "1234:4321"], ("host", "f", "owner"): "caller"}),
    # Binding port 80 (in the sandbox's own network namespace) needs CAP_NET_BIND_SERVICE.
    *(Case(f"cap_net_bind_service_as_uid_{uid}", spec={"uid": uid, "gid": uid, "cap_add": ("CAP_NET_BIND_SERVICE",)},
           mounts=(S.Proc(),), request={"actions": [["bind", "127.0.0.1", 80]]},
           expect={("status", "CapEff"): NET_BIND_SERVICE, ("status", "CapPrm"): NET_BIND_SERVICE,
                   ("status", "CapBnd"): NET_BIND_SERVICE, ("status", "CapAmb"): NET_BIND_SERVICE,
                   ("status", "NoNewPrivs"): "1", ("actions",): ["ok"]},
           expect_on={WP: {("actions",): ["EACCES"]}} if uid else {}, why={WP: WP_NESTS} if uid else {})
      for uid in (0, 1000)),
    *(Case(f"port_80_is_denied_without_the_capability_as_uid_{uid}", spec={"uid": uid, "gid": uid},
           request={"actions": [["bind", "127.0.0.1", 80]]}, expect={("actions",): ["EACCES"]})
      for uid in (0, 1000)),
    # With /dev and a uid other than 0 the command runs in a nested user namespace
    # that does not own the network namespace: a kept network capability holds nothing there.
    Case("nested_userns_caps_do_not_reach_the_network",
         spec={"uid": 1000, "gid": 1000, "cap_add": ("CAP_NET_BIND_SERVICE",)}, mounts=(S.Proc(), S.Dev()),
         request={"actions": [["bind", "127.0.0.1", 80]]},
         expect={("status", "CapEff"): NET_BIND_SERVICE, ("status", "CapPrm"): NET_BIND_SERVICE,
                 ("status", "CapBnd"): NET_BIND_SERVICE, ("status", "CapAmb"): NET_BIND_SERVICE,
                 ("status", "NoNewPrivs"): "1", ("actions",): ["EACCES"]}),
]

ENV_CASES = [
    # (LC_CTYPE is the probe's own: python coerces the C locale, PEP 538)
    Case("env_is_exactly_the_declared_one",
         spec={"env": {"A": "1", "B": "two words", "EMPTY": "", "SPACES": "a b  c", "UNICODE": "héllo"}},
         host_env={"SBX_SECRET": "must-not-leak"},
         expect={("env",): {"A": "1", "B": "two words", "EMPTY": "", "SPACES": "a b  c", "UNICODE": "héllo",
                            "LC_CTYPE": "C.UTF-8"}}),
    Case("env_empty", spec={"env": {}}, host_env={"SBX_SECRET": "must-not-leak"},
         expect={("env",): {"LC_CTYPE": "C.UTF-8"}}),
    Case("env_inherit_patterns", spec={"env_inherit": ("SBX_CONF_*",), "env": {"SBX_CONF_B": "override"}},
         host_env={"SBX_CONF_A": "a", "SBX_CONF_B": "b", "OTHER_SBX": "x", "X_SBX_CONF_C": "x", "sbx_conf_d": "x"},
         expect={("env",): {"SBX_CONF_A": "a", "SBX_CONF_B": "override", "LC_CTYPE": "C.UTF-8"}}),
    Case("cwd_given", spec={"cwd": "/usr/lib"}, expect={("cwd",): "/usr/lib"}),
    Case("cwd_given_made_by_a_dir", mounts=(S.Dir("/made/here"),), spec={"cwd": "/made/here"},
         expect={("cwd",): "/made/here"}),
    Case("cwd_is_the_callers_if_visible", mounts=(ro(f"{H}/cwd"),), host_cwd=f"{H}/cwd",
         request={"paths": ["marker"]},  # relative: found in the cwd
         expect={("cwd",): f"{H}/cwd", ("paths", "marker", "content"): "here\n"}),
    Case("cwd_falls_back_to_home", mounts=(ro(f"{H}/home", "/home/me"),), host_cwd=f"{H}/cwd",
         spec={"env": {"HOME": "/home/me"}}, expect={("cwd",): "/home/me"}),
    Case("cwd_falls_back_to_root", host_cwd=f"{H}/cwd", spec={"env": {"HOME": "/nonexistent"}},
         expect={("cwd",): "/"}),
    # Only the command's HOME counts (bwrap knows no other): the caller's is ignored.
    Case("cwd_ignores_the_callers_home", mounts=(ro(f"{H}/home"),), host_cwd=f"{H}/cwd",
         host_env={"HOME": f"{H}/home"}, expect={("cwd",): "/"}),
]

LIMIT_CASES = [
    # A write past the file size limit stops at it (python ignores SIGXFSZ, so it shows as EFBIG).
    # (nproc is a cgroup's pids limit where the backend has one: see the nproc cases)
    Case("rlimits", spec={"limits": S.Limits(cpu_s=30, address_space_mb=2048, file_mb=1, nofile=64)},
         mounts=(S.Tmpfs("/tmp"),), request={"actions": [["write", "/tmp/f", 3 << 20], ["size", "/tmp/f"]]},
         expect={("rlimits", "cpu"): [30, 30], ("rlimits", "as"): [2048 << 20, 2048 << 20],
                 ("rlimits", "fsize"): [1 << 20, 1 << 20], ("rlimits", "nofile"): [64, 64],
                 ("actions",): ["EFBIG", 1 << 20]}),
    Case("rlimit_file_bytes", spec={"limits": S.Limits(file_bytes=1000)}, expect={("rlimits", "fsize"): [1000, 1000]}),
    Case("rlimit_above_the_hard_limit_is_capped", spec={"limits": S.Limits(nofile=1 << 40)},
         expect={("rlimits", "nofile"): HostValue("rlimit.nofile.hard")}),
    Case("no_file_size_limit", mounts=(S.Tmpfs("/tmp"),),
         request={"actions": [["write", "/tmp/f", 2 << 20], ["size", "/tmp/f"]]},
         expect={("actions",): ["ok", 2 << 20]}),
    Case("address_space_limit_fails_a_large_allocation", spec={"limits": S.Limits(address_space_mb=256)},
         request={"actions": [["alloc", 512 << 20]]}, expect={("actions",): ["MemoryError"]}),
    Case("no_address_space_limit", request={"actions": [["alloc", 512 << 20]]}, expect={("actions",): ["ok"]}),
    Case("nofile_limit", spec={"limits": S.Limits(nofile=16)}, request={"actions": [["open_until_full"]]},
         expect={("actions",): [["EMFILE", 15]]}),
    # Zombies count until reaped, so the 8 children are alive together; root is exempt.
    # The same refusal from a pids cgroup (native, where the caller has one) or RLIMIT_NPROC (the fallback).
    Case("nproc_limit", spec={"limits": S.Limits(nproc=4)}, nonroot_only=True, request={"actions": [["fork", 8]]},
         expect={("actions",): ["EAGAIN"]},
         differs={"native": (("rlimits", "nproc"),), "bwrap": (("rlimits", "nproc"),),
                  "template": (("rlimits", "nproc"),)}),
    # With soft = hard the kernel sends SIGKILL (SIGXCPU comes first only below the hard limit).
    Case("cpu_limit_kills_a_busy_loop", spec={"limits": S.Limits(cpu_s=1)}, request={"spin": True},
         returncode=(-9, -24)),
]

PROCESS_CASES = [
    Case("exit_status", request={"exit": 7}, returncode=7),
    Case("exit_status_high", request={"exit": 200}, returncode=200),
    Case("killed_by_sigkill", request={"signal": 9}, returncode=-9,
         expect_on={WP: {("returncode",): 0}}, why={WP: WP_OWN_SIGNAL}),
    Case("killed_by_sigterm", request={"signal": 15}, returncode=-15,
         expect_on={WP: {("returncode",): 0}}, why={WP: WP_OWN_SIGNAL}),
    Case("killed_without_pid_namespace", spec={"namespaces": S.Namespaces(pid=False)}, request={"signal": 9},
         returncode=-9, refused={WP: "namespaces"}),
    Case("pid_1_cannot_kill_itself", spec={"as_pid_1": True}, request={"signal": 9}, returncode=0),
    *(Case(name, leak_fd=leak, expect={("fds",): [0, 1, 2]},
           expect_on={WP: {("fds",): [0, 1, 2, 3], ("fd_types", "3"): "socket"}}, why={WP: WP_CHANNEL})
      for name, leak in (("only_stdio_is_open", False), ("inherited_fds_are_closed", True))),
    Case("pass_fds_keep_their_numbers", pass_fd=True,
         expect={("fds",): [0, 1, 2, PASSED_FD], ("fd_types", str(PASSED_FD)): "fifo"},
         not_applicable={WP: WP_NO_PASS_FDS}),
    Case("new_session", mounts=(S.Proc(), S.Dev()), spec={"as_pid_1": True},
         expect={("proc", "sid_is_pid"): True, ("proc", "tty"): OneOf(("ENXIO", "ENODEV"))}),
    Case("no_new_session", mounts=(S.Proc(),), spec={"as_pid_1": True, "new_session": False},
         expect={("proc", "sid_is_pid"): False}),
]

# Python (the probe) ignores SIGPIPE and SIGXFSZ itself; nothing else may be
# ignored or blocked when the command starts, whatever the caller does.
PROBE_IGNORES = f"{1 << (signal.SIGPIPE - 1) | 1 << (signal.SIGXFSZ - 1):016x}"
CALLER_SIGNALS: dict[str, Any] = {"host_ignores": (signal.SIGUSR1, signal.SIGHUP), "host_blocks": (signal.SIGUSR2,)}
DEFAULT_SIGNALS: dict[tuple[str, ...], Any] = {("status", "SigIgn"): PROBE_IGNORES, ("status", "SigBlk"): "0" * 16}
SIGNAL_CASES = [
    Case("signals_start_at_their_defaults", mounts=(S.Proc(),), expect=DEFAULT_SIGNALS),
    Case("caller_signals_do_not_reach_the_command", mounts=(S.Proc(),), expect=DEFAULT_SIGNALS, **CALLER_SIGNALS),
    Case("caller_signals_do_not_reach_pid_1", mounts=(S.Proc(),), spec={"as_pid_1": True}, expect=DEFAULT_SIGNALS,
         **CALLER_SIGNALS),
    Case("caller_signals_without_pid_namespace", mounts=(S.Proc(),), spec={"namespaces": S.Namespaces(pid=False)},
         expect=DEFAULT_SIGNALS, refused={WP: "namespaces"}, **CALLER_SIGNALS),
]

ERROR_CASES = [
    Case("missing_source", mounts=(ro("/nonexistent-sandbox-source", "/x"),),
         error=("SetupError", {"step": "source", "path": "/nonexistent-sandbox-source", "errno": E.ENOENT})),
    Case("missing_command", argv=("no-such-command-anywhere",),
         error=("ExecNotFoundError", {"errno": E.ENOENT, "filename": "no-such-command-anywhere"}),
         not_applicable={WP: WP_NO_ARGV}),
    Case("command_not_executable", argv=("/usr",), error=("ExecPermissionError", {"errno": E.EACCES}),
         not_applicable={WP: WP_NO_ARGV}),
    Case("missing_cwd", spec={"cwd": "/nonexistent"},
         error=("SetupError", {"step": "cwd", "path": "/nonexistent", "errno": E.ENOENT})),
    Case("namespaces_without_user_namespace_need_root", spec={"namespaces": S.Namespaces(user=False)},
         nonroot_only=True, error=("SetupError", {"step": "clone", "errno": E.EPERM}), refused={WP: "namespaces"}),
    Case("dir_on_read_only", mounts=(S.Dir("/usr/newdir"),),
         error=("SetupError", {"step": "dir", "path": "/usr/newdir", "errno": E.EROFS})),
    Case("chmod_on_read_only", mounts=(S.Chmod("/usr", 0o700),),
         error=("SetupError", {"step": "chmod", "path": "/usr", "errno": E.EROFS})),
]


CASES: list[Case] = (MOUNT_CASES + DEV_CASES + NAMESPACE_CASES + IDENTITY_CASES + ENV_CASES + LIMIT_CASES
                     + PROCESS_CASES + SIGNAL_CASES + ERROR_CASES + seccomp_cases())


# ---------------------------------------------------------------- brokered (test_brokered.py)
# The "brokered" executor's declarations, kept here together: a Spec started inside a task sandbox becomes
# a task description the broker starts beside it (sandbox/backends/brokered/description.py). What a
# description cannot show is refused by name (SpecError: `refused`), what the executor lacks by
# sandbox.refusal's table (UnavailableError: `unavailable`); the world it shows is the task world's.
BR = "brokered"
BR_TOPS = "brokered.tops"  # the entries of / in the task world (test_brokered.task_world_tops)
BR_MOUNT = ("a nested sandbox shows binds of host paths and, of its own, /proc, /dev, /tmp and the system's links: "
            "any other mount (device, file with data, tmpfs, proc, directory, link, remount, chmod) is refused")
BR_NARROWS = "a nested sandbox shows only what its task sandbox shows (this path is not granted to the driver's)"
BR_DEFAULT = "a Spec started through the broker keeps this field's default (a nested sandbox can only narrow)"
BR_LIMITS = "a nested sandbox takes the memory_mb, file_mb and cpu_s limits only"
BR_WORLD = ("the task world always has /proc, /dev, /tmp, the /etc files, the system's links, its broker's socket "
            "under /run and the framework's interpreter (here under /opt): \"brokered.tops\"")
BR_ENV = ("the task world rebuilds PATH (the interpreter's directory first) and names its own broker "
          "(SANDBOX_TASK_BROKER: a nested sandbox may nest again)")
BR_ENV_EXTRA = ("PATH", "SANDBOX_TASK_BROKER")
BR_NESTS = ("the task world always has a /dev (a Dev): a command whose uid is not 0 then runs in a user namespace "
            "nested in one that maps uid 0 (as uid_gid_with_dev_nests)")
BROKERED: dict[str, dict[str, Any]] = {
    **{name: {"refused": "mounts[5]", "because": BR_MOUNT} for name in (
        "dev_bind_allows_devices", "tmpfs_size_and_perms", "tmpfs_default_mode_and_parents", "proc_only_elsewhere",
        "dir_perms_and_parents", "dir_then_tmpfs_over_it", "symlinks",
        "file_data_and_perms", "file_readonly", "file_empty_default_mode", "remount_ro_of_tmpfs_adds_nodev", "chmod",
        "destination_through_an_absolute_symlink", "dir_perms_and_an_existing_dir_keeps_its_mode",
        "file_binary_data_and_readonly_default_mode", "cwd_given_made_by_a_dir", "dir_on_read_only",
        "chmod_on_read_only")},
    **{name: {"refused": "mounts[6]", "because": BR_MOUNT} for name in (
        "remount_ro", "remount_ro_leaves_the_host_writable", "tmpfs_hides_what_is_below_and_keeps_writes",
        "missing_parent_modes")},
    **{name: {"refused": "binds", "because": BR_NARROWS} for name in (
        "ro_bind_reaches_submounts", "ro_bind_of_the_root_covers_every_host_mount", "missing_source")},
    **{name: {"refused": "seccomp", "because": BR_DEFAULT} for name in (
        "no_seccomp", "user_namespaces_allowed_without_seccomp", "disable_userns", "disable_userns_with_proc",
        "seccomp_policy_with_a_distinct_errno")},
    **{name: {"refused": "uid", "because": BR_DEFAULT} for name in (
        "dev_is_usable_as_uid_1000", "dev_is_usable_as_root", "uid_gid", "uid_gid_with_dev_nests",
        "uid_gid_with_dev_without_proc", "root_inside", "writes_as_another_uid_belong_to_the_caller",
        "port_80_is_denied_without_the_capability_as_uid_0", "port_80_is_denied_without_the_capability_as_uid_1000")},
    "shared_ipc_uts_cgroup": {"refused": "namespaces", "because": BR_DEFAULT},
    "hostname": {"refused": "hostname", "because": BR_DEFAULT},
    **{name: {"refused": f"limits.{field}", "because": BR_LIMITS} for name, field in (
        ("rlimits", "nofile"), ("rlimit_file_bytes", "file_bytes"), ("rlimit_above_the_hard_limit_is_capped", "nofile"),
        ("address_space_limit_fails_a_large_allocation", "address_space_mb"), ("nofile_limit", "nofile"),
        ("nproc_limit", "nproc"))},
    "pass_fds_keep_their_numbers": {"refused": "pass_fds", "because": "a nested sandbox gets its stdio only"},
    **{name: {"unavailable": "WITHOUT_PID_NS"} for name in (
        "proc_without_pid_namespace_is_the_hosts", "no_pid_namespace", "killed_without_pid_namespace",
        "caller_signals_without_pid_namespace")},
    **{name: {"unavailable": "COMMAND_AS_PID_1"} for name in (
        "as_pid_1", "pid_1_cannot_kill_itself", "new_session", "no_new_session", "caller_signals_do_not_reach_pid_1")},
    **{name: {"unavailable": "KEEP_CAPS"} for name in (
        "cap_add", "cap_net_bind_service_as_uid_0", "cap_net_bind_service_as_uid_1000",
        "nested_userns_caps_do_not_reach_the_network")},
    "no_user_namespace_as_root": {"unavailable": "WITHOUT_USER_NS"},
    "no_mount_namespace": {"unavailable": "WITHOUT_MOUNT_NS"},
    "overlay_shows_its_lower_and_keeps_writes_inside": {"unavailable": "OVERLAY"},
    "undeclared_paths_do_not_exist": {
        "expect_on": {**{("paths", f"/{top}", "exists"): InHost(top, BR_TOPS)
                         for top in ("etc", "home", "tmp", "proc", "dev", "root", "var", "opt", "sys", "run")},
                      ("paths", "/", "entries"): WithHost((), BR_TOPS)},
        "why": BR_WORLD},
    "bind_try_missing_source_is_skipped": {"expect_on": {("paths", "/opt", "exists"): InHost("opt", BR_TOPS)},
                                           "why": BR_WORLD},
    **{case.name: {"expect_on": {("env",): Plus(case.expect[("env",)], BR_ENV_EXTRA)}, "why": BR_ENV}
       for case in ENV_CASES if ("env",) in case.expect},
    "default_ids_are_the_callers": {"expect_on": {("ids", "uid_map"): ["{uid}", "0", "1"],
                                                  ("ids", "gid_map"): ["{gid}", "0", "1"]}, "why": BR_NESTS},
    "umask_is_the_callers": {"known_bug": "the broker starts the nested sandbox with its own umask: the request "
                                          "(sandbox.task.wire) does not carry the caller's"},
}


def declared(cases: list[Case], backend: str, table: dict[str, dict[str, Any]]) -> list[Case]:
    """`cases` with `table`'s declarations for `backend` (case name -> refused, unavailable, expect_on with
    its why, known_bug; "because": the refusal's reason, for the reader) added."""
    missing = set(table) - {case.name for case in cases}
    assert not missing, f"declarations for no case: {sorted(missing)}"
    out = []
    for case in cases:
        entry = table.get(case.name, {})
        changes = {name: {**getattr(case, name), backend: entry[key]}
                   for name, key in (("refused", "refused"), ("unavailable", "unavailable"),
                                     ("expect_on", "expect_on"), ("why", "why"), ("known_bug", "known_bug"))
                   if key in entry}
        out.append(dataclasses.replace(case, **changes) if changes else case)
    return out


CASES = declared(CASES, BR, BROKERED)
