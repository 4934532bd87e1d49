"""Conformance cases as data: a sandbox description, what the probe is asked,
and what it must observe. Every case runs on every available backend.

A case's spec is the base world (read-only /usr, the /bin /lib /lib64 links,
the probe itself as a read-only file at /probe.py) plus `mounts` (and /proc at
the end if the request asks about mounts and the case has none), with the
other Spec fields from `spec`. Strings may hold "/{host}" (a host directory
tree made per session, see HOST_TREE) and "{uid}"/"{gid}" (the caller's ids);
`fill()` substitutes them. `expect` maps a key path into the probe's JSON
report to the value it must have (or a Matcher). `error` names the exception
a case must raise instead of running, with attributes to check.
"""

from __future__ import annotations

import dataclasses
import errno as E
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sandbox import spec as S

Path = tuple[str, ...]

# The host tree every session makes (relative to "{host}"): name -> content
# (None: a directory; "->x": a symlink to x).
HOST_TREE: dict[str, str | None] = {
    "ro": None,
    "ro/file": "hello\n",
    "ro/inner": None,
    "ro/sub": None,
    "rw": None,
    "link": "->ro",
    "home": None,
    "cwd": None,
    "tree": None,
    "tree/abs": "->/tdir",
}


# ---------------------------------------------------------------- matchers

class Matcher:
    """An expectation that is not a plain value."""

    def matches(self, value: Any, ctx: Mapping[str, Any]) -> bool:
        raise NotImplementedError


@dataclass(frozen=True)
class Contains(Matcher):
    """The observed list (or dict, or string) contains `item`."""

    item: Any

    def matches(self, value: Any, ctx: Mapping[str, Any]) -> bool:
        return value is not None and self.item in value


@dataclass(frozen=True)
class Lacks(Matcher):
    """The observed list (or dict) does not contain `item`."""

    item: Any

    def matches(self, value: Any, ctx: Mapping[str, Any]) -> bool:
        return value is None or self.item not in value


@dataclass(frozen=True)
class HostValue(Matcher):
    """Equal (or, with differ=True, not equal) to ctx[key] (what the host sees)."""

    key: str
    differ: bool = False

    def matches(self, value: Any, ctx: Mapping[str, Any]) -> bool:
        return (value != ctx[self.key]) if self.differ else (value == ctx[self.key])


@dataclass(frozen=True)
class OneOf(Matcher):
    """Any of `values`."""

    values: tuple[Any, ...]

    def matches(self, value: Any, ctx: Mapping[str, Any]) -> bool:
        return value in self.values


# ---------------------------------------------------------------- cases

@dataclass(frozen=True)
class Case:
    """One conformance case (see the module docstring)."""

    name: str
    mounts: tuple[S.Mount, ...] = ()
    spec: Mapping[str, Any] = field(default_factory=dict)
    request: Mapping[str, Any] = field(default_factory=dict)
    expect: Mapping[Path, Any] = field(default_factory=dict)
    returncode: int = 0
    error: tuple[str, Mapping[str, Any]] | None = None  # (exception class name, attributes)
    argv: tuple[str, ...] | None = None  # instead of the probe
    base: bool = True  # add the base world
    root_only: bool = False
    nonroot_only: bool = False
    host_cwd: str | None = None  # run with this host cwd
    pass_fd: bool = False  # pass an extra pipe fd to the command
    host_env: Mapping[str, str] = field(default_factory=dict)  # added to the caller's environ
    leak_fd: bool = False  # the caller holds an inheritable fd (LEAKED_FD) that must not get in
    probe_on_host: bool = False  # run the probe from its host path (for worlds without the base)
    host_ignores: tuple[int, ...] = ()  # signals the caller ignores while it spawns
    host_blocks: tuple[int, ...] = ()  # signals the spawning thread blocks meanwhile
    # Documented backend differences: backend -> key paths whose expectation
    # does not hold there (and that the differential test ignores).
    differs: Mapping[str, tuple[Path, ...]] = field(default_factory=dict)
    # Known bugs: backend -> description; the case is expected to fail there (xfail, not strict).
    known_bug: Mapping[str, str] = field(default_factory=dict)


def ro(src: str, dest: str | None = None, optional: bool = False) -> S.RoBind:
    return S.RoBind(src, dest, optional)


def rw(src: str, dest: str | None = None, optional: bool = False) -> S.Bind:
    return S.Bind(src, dest, optional)


# Fixed numbers, far above what the test process uses (its long-lived fds,
# such as the shared namespace pool's, must never be clobbered by dup2).
PASSED_FD = 901  # the number a passed pipe gets (pass_fd=True)
LEAKED_FD = 902  # an inheritable fd of the caller's (leak_fd=True)
IPV6_LOOPBACK = "lo/00000000000000000000000000000001"
LO_FLAGS = ["LOOPBACK", "RUNNING", "UP"]
FLAGS_RO = ["nodev", "nosuid", "ro"]
FLAGS_RW = ["nodev", "nosuid", "rw"]
H = "/{host}"  # absolute, so Spec validation accepts it before fill()

MOUNT_CASES = [
    Case("ro_bind", mounts=(ro(f"{H}/ro", "/data"),),
         request={"paths": ["/data/file"], "writable": ["/data", "/data/file"], "mounts": ["/data"]},
         expect={("paths", "/data/file", "content"): "hello\n", ("writable", "/data"): "EROFS",
                 ("writable", "/data/file"): "EROFS", ("mounts", "points", "/data", "flags"): FLAGS_RO}),
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
                 ("paths", "/rw", "type"): "dir", ("writable", "/rw"): "yes"}),
    Case("symlinked_source_binds_its_target", mounts=(ro(f"{H}/link", "/via"),),
         request={"paths": ["/via", "/via/file"]},
         expect={("paths", "/via", "type"): "dir", ("paths", "/via/file", "content"): "hello\n"}),
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
                 ("proc", "visible_pids"): [1, 2], ("paths", "/proc/self", "type"): "link"}),
    Case("proc_without_pid_namespace_is_the_hosts", mounts=(S.Proc(),),
         spec={"namespaces": S.Namespaces(pid=False)},
         request={"mounts": ["/proc"]},
         expect={("ns", "pid"): HostValue("ns.pid"), ("proc", "pid"): HostValue("ns.pid", differ=True),
                 ("mounts", "points", "/proc", "fstype"): "proc"}),
    Case("dev", mounts=(S.Dev(),),
         request={"paths": ["/dev", "/dev/null", "/dev/ptmx", "/dev/stdout", "/dev/shm", "/dev/fd"],
                  "writable": ["/dev/null", "/dev/full"], "mounts": ["/dev", "/dev/pts", "/dev/null"]},
         expect={("paths", "/dev", "entries"): ["core", "fd", "full", "null", "ptmx", "pts", "random", "shm",
                                                "stderr", "stdin", "stdout", "tty", "urandom", "zero"],
                 ("paths", "/dev/null", "type"): "char", ("paths", "/dev/ptmx", "target"): "pts/ptmx",
                 ("paths", "/dev/stdout", "target"): "/proc/self/fd/1", ("paths", "/dev/shm", "type"): "dir",
                 ("writable", "/dev/null"): "yes", ("mounts", "points", "/dev/pts", "fstype"): "devpts",
                 ("mounts", "points", "/dev", "flags"): FLAGS_RW,
                 ("mounts", "points", "/dev/null", "flags"): ["nosuid", "rw"]}),
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
    Case("remount_ro_of_tmpfs_adds_nodev", mounts=(S.Tmpfs("/t"), S.RemountRo("/t")),
         request={"mounts": ["/t"]}, expect={("mounts", "points", "/t", "flags"): FLAGS_RO}),
    Case("chmod", mounts=(S.Dir("/c"), S.Chmod("/c", 0o711), S.File("/f", b"", perms=0o600), S.Chmod("/f", 0o4755)),
         request={"paths": ["/c", "/f"]},
         expect={("paths", "/c", "mode"): "0o711", ("paths", "/f", "mode"): "0o4755"}),
    Case("destination_through_an_absolute_symlink", mounts=(S.Dir("/tdir"), ro(f"{H}/tree", "/tree"),
                                                             S.Tmpfs("/tree/abs/x")),
         request={"paths": ["/tdir/x"]}, expect={("paths", "/tdir/x", "type"): "dir"},
         known_bug={"bwrap": "bwrap resolves an absolute symlink in a destination against its staging root, "
                             "not the sandbox's (bubblewrap #195): Can't mkdir /tree/abs/x"}),
    Case("undeclared_paths_do_not_exist", request={"paths": ["/etc", "/home", "/tmp", "/proc", "/dev", "/"]},
         expect={("paths", "/etc", "exists"): False, ("paths", "/home", "exists"): False,
                 ("paths", "/tmp", "exists"): False, ("paths", "/proc", "exists"): False,
                 ("paths", "/dev", "exists"): False,
                 ("paths", "/", "entries"): ["bin", "lib", "lib64", "probe.py", "usr"]}),
]

NAMESPACE_CASES = [
    Case("all_namespaces_by_default", mounts=(S.Proc(),),
         expect={("ns", "user"): HostValue("ns.user", differ=True), ("ns", "mnt"): HostValue("ns.mnt", differ=True),
                 ("ns", "pid"): HostValue("ns.pid", differ=True), ("ns", "net"): HostValue("ns.net", differ=True),
                 ("ns", "ipc"): HostValue("ns.ipc", differ=True), ("ns", "uts"): HostValue("ns.uts", differ=True),
                 ("ns", "cgroup"): HostValue("ns.cgroup", differ=True), ("proc", "pid"): 2, ("proc", "ppid"): 1}),
    Case("network_none_is_loopback_only", mounts=(S.Proc(),),
         expect={("net", "interfaces"): ["lo"], ("net", "flags", "lo"): LO_FLAGS,
                 ("net", "ipv4_local"): ["127.0.0.1"], ("net", "inet6"): Contains(IPV6_LOOPBACK)}),
    Case("network_host", mounts=(S.Proc(),), spec={"network": "host"},
         expect={("ns", "net"): HostValue("ns.net"), ("net", "interfaces"): HostValue("net.interfaces")}),
    Case("shared_ipc_uts_cgroup", spec={"namespaces": S.Namespaces(ipc=False, uts=False, cgroup=False)},
         mounts=(S.Proc(),),
         expect={("ns", "ipc"): HostValue("ns.ipc"), ("ns", "uts"): HostValue("ns.uts"),
                 ("ns", "cgroup"): HostValue("ns.cgroup"), ("hostname",): HostValue("hostname")}),
    Case("no_pid_namespace", spec={"namespaces": S.Namespaces(pid=False)}, mounts=(S.Proc(),),
         expect={("ns", "pid"): HostValue("ns.pid"), ("proc", "pid"): HostValue("ns.pid", differ=True)}),
    Case("as_pid_1", spec={"as_pid_1": True}, mounts=(S.Proc(),),
         expect={("proc", "pid"): 1, ("proc", "ppid"): 0, ("proc", "visible_pids"): [1]}),
    Case("no_user_namespace_as_root", spec={"namespaces": S.Namespaces(user=False)}, mounts=(S.Proc(),),
         root_only=True,
         expect={("ns", "user"): HostValue("ns.user"), ("ids", "uid"): 0,
                 ("ids", "uid_map"): HostValue("ids.uid_map")}),
    Case("hostname", spec={"hostname": "sbx-conformance"}, expect={("hostname",): "sbx-conformance"}),
    Case("no_mount_namespace", base=False, probe_on_host=True,
         spec={"namespaces": S.Namespaces(mount=False)}, request={"paths": ["/usr/bin/python3"]},
         expect={("ns", "mnt"): HostValue("ns.mnt"), ("ns", "user"): HostValue("ns.user", differ=True),
                 ("paths", "/usr/bin/python3", "exists"): True},
         differs={"bwrap": (("ns", "mnt"),)}),  # bwrap always makes one (the host root bound whole)
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
                 ("ids", "uid_map"): ["{uid}", "{uid}", "1"], ("ids", "gid_map"): ["{gid}", "{gid}", "1"]}),
    Case("uid_gid", spec={"uid": 1234, "gid": 2345}, mounts=(S.Proc(),),
         expect={("ids", "uid"): 1234, ("ids", "gid"): 2345, ("ids", "euid"): 1234,
                 ("ids", "uid_map"): ["1234", "{uid}", "1"], ("ids", "gid_map"): ["2345", "{gid}", "1"]}),
    Case("uid_gid_with_dev_nests", spec={"uid": 1234, "gid": 2345}, mounts=(S.Proc(), S.Dev()),
         expect={("ids", "uid"): 1234, ("ids", "gid"): 2345,
                 ("ids", "uid_map"): ["1234", "0", "1"], ("ids", "gid_map"): ["2345", "0", "1"]}),
    Case("uid_gid_with_dev_without_proc", spec={"uid": 1234, "gid": 2345}, mounts=(S.Dev(),),
         expect={("ids", "uid"): 1234, ("ids", "gid"): 2345}),
    Case("root_inside", spec={"uid": 0, "gid": 0}, mounts=(S.Proc(),),
         expect={("ids", "uid"): 0, ("ids", "gid"): 0, ("ids", "uid_map"): ["0", "{uid}", "1"],
                 ("status", "CapEff"): "0000000000000000"}),
    Case("cap_add", spec={"uid": 0, "gid": 0, "cap_add": ("CAP_NET_ADMIN", "CAP_KILL")}, mounts=(S.Proc(),),
         expect={("status", "CapEff"): "0000000000001020", ("status", "CapBnd"): "0000000000001020",
                 ("status", "CapAmb"): "0000000000001020", ("status", "NoNewPrivs"): "1"}),
    Case("no_caps_and_no_new_privs", mounts=(S.Proc(),),
         expect={("status", "CapEff"): "0000000000000000", ("status", "CapBnd"): "0000000000000000",
                 ("status", "NoNewPrivs"): "1", ("status", "Seccomp"): "2"}),
    Case("no_seccomp", spec={"seccomp": None}, mounts=(S.Proc(),), expect={("status", "Seccomp"): "0"}),
]

ENV_CASES = [
    Case("env_is_exactly_the_declared_one", spec={"env": {"A": "1", "B": "two words", "EMPTY": ""}},
         expect={("env",): {"A": "1", "B": "two words", "EMPTY": "", "LC_CTYPE": "C.UTF-8"}}),
    Case("env_inherit_patterns", spec={"env_inherit": ("SBX_CONF_*",), "env": {"SBX_CONF_B": "override"}},
         host_env={"SBX_CONF_A": "a", "SBX_CONF_B": "b", "OTHER_SBX": "x"},
         expect={("env", "SBX_CONF_A"): "a", ("env", "SBX_CONF_B"): "override", ("env",): Lacks("OTHER_SBX")}),
    Case("cwd_given", spec={"cwd": "/usr/lib"}, expect={("cwd",): "/usr/lib"}),
    Case("cwd_is_the_callers_if_visible", mounts=(ro(f"{H}/cwd"),), host_cwd=f"{H}/cwd",
         expect={("cwd",): f"{H}/cwd"}),
    Case("cwd_falls_back_to_home", mounts=(ro(f"{H}/home", "/home/me"),), host_cwd=f"{H}/cwd",
         spec={"env": {"HOME": "/home/me"}}, expect={("cwd",): "/home/me"}),
    Case("cwd_falls_back_to_root", host_cwd=f"{H}/cwd", spec={"env": {"HOME": "/nonexistent"}},
         expect={("cwd",): "/"}),
    # Only the command's HOME counts (bwrap knows no other): the caller's is ignored.
    Case("cwd_ignores_the_callers_home", mounts=(ro(f"{H}/home"),), host_cwd=f"{H}/cwd",
         host_env={"HOME": f"{H}/home"}, expect={("cwd",): "/"}),
]

LIMIT_CASES = [
    Case("rlimits", spec={"limits": S.Limits(cpu_s=30, memory_mb=2048, file_mb=1, nofile=64, nproc=4000)},
         mounts=(S.Tmpfs("/tmp"),), request={"actions": [["write", "/tmp/f", 3 << 20]]},
         expect={("rlimits", "cpu"): [30, 30], ("rlimits", "as"): [2048 << 20, 2048 << 20],
                 ("rlimits", "fsize"): [1 << 20, 1 << 20], ("rlimits", "nofile"): [64, 64],
                 ("rlimits", "nproc"): [4000, 4000], ("actions",): ["EFBIG"]}),
    Case("rlimit_file_bytes", spec={"limits": S.Limits(file_bytes=1000)}, expect={("rlimits", "fsize"): [1000, 1000]}),
    Case("rlimit_above_the_hard_limit_is_capped", spec={"limits": S.Limits(nofile=1 << 40)},
         expect={("rlimits", "nofile"): HostValue("rlimit.nofile.hard")}),
]

PROCESS_CASES = [
    Case("exit_status", request={"exit": 7}, returncode=7),
    Case("exit_status_high", request={"exit": 200}, returncode=200),
    Case("killed_by_sigkill", request={"signal": 9}, returncode=-9),
    Case("killed_by_sigterm", request={"signal": 15}, returncode=-15),
    Case("killed_without_pid_namespace", spec={"namespaces": S.Namespaces(pid=False)}, request={"signal": 9},
         returncode=-9),
    Case("pid_1_cannot_kill_itself", spec={"as_pid_1": True}, request={"signal": 9}, returncode=0),
    Case("only_stdio_is_open", expect={("fds",): [0, 1, 2]}),
    Case("inherited_fds_are_closed", leak_fd=True, expect={("fds",): [0, 1, 2]}),
    Case("pass_fds_keep_their_numbers", pass_fd=True,
         expect={("fds",): [0, 1, 2, PASSED_FD], ("fd_types", str(PASSED_FD)): "fifo"}),
    Case("new_session", mounts=(S.Proc(), S.Dev()), spec={"as_pid_1": True},
         expect={("proc", "sid_is_pid"): True, ("proc", "tty"): OneOf(("ENXIO", "ENODEV"))}),
    Case("no_new_session", mounts=(S.Proc(),), spec={"as_pid_1": True, "new_session": False},
         expect={("proc", "sid_is_pid"): False}),
]

# Python (the probe) ignores SIGPIPE and SIGXFSZ itself; nothing else may be
# ignored or blocked when the command starts, whatever the caller does.
PROBE_IGNORES = f"{1 << (signal.SIGPIPE - 1) | 1 << (signal.SIGXFSZ - 1):016x}"
CALLER_SIGNALS = {"host_ignores": (signal.SIGUSR1, signal.SIGHUP), "host_blocks": (signal.SIGUSR2,)}
DEFAULT_SIGNALS = {("status", "SigIgn"): PROBE_IGNORES, ("status", "SigBlk"): "0" * 16}
SIGNAL_CASES = [
    Case("signals_start_at_their_defaults", mounts=(S.Proc(),), expect=DEFAULT_SIGNALS),
    Case("caller_signals_do_not_reach_the_command", mounts=(S.Proc(),), expect=DEFAULT_SIGNALS, **CALLER_SIGNALS),
    Case("caller_signals_do_not_reach_pid_1", mounts=(S.Proc(),), spec={"as_pid_1": True}, expect=DEFAULT_SIGNALS,
         **CALLER_SIGNALS),
    Case("caller_signals_without_pid_namespace", mounts=(S.Proc(),), spec={"namespaces": S.Namespaces(pid=False)},
         expect=DEFAULT_SIGNALS, **CALLER_SIGNALS),
]

ERROR_CASES = [
    Case("missing_source", mounts=(ro("/nonexistent-sandbox-source", "/x"),),
         error=("SetupError", {"step": "source", "path": "/nonexistent-sandbox-source", "errno": E.ENOENT})),
    Case("missing_command", argv=("no-such-command-anywhere",),
         error=("ExecNotFoundError", {"errno": E.ENOENT, "filename": "no-such-command-anywhere"})),
    Case("command_not_executable", argv=("/usr",), error=("ExecPermissionError", {"errno": E.EACCES})),
    Case("missing_cwd", spec={"cwd": "/nonexistent"},
         error=("SetupError", {"step": "cwd", "path": "/nonexistent", "errno": E.ENOENT})),
    Case("namespaces_without_user_namespace_need_root", spec={"namespaces": S.Namespaces(user=False)},
         nonroot_only=True, error=("SetupError", {"step": "clone", "errno": E.EPERM})),
    Case("dir_on_read_only", mounts=(S.Dir("/usr/newdir"),),
         error=("SetupError", {"step": "dir", "path": "/usr/newdir", "errno": E.EROFS})),
]



def _denied_calls() -> list[list[int]]:
    """[nr, a0..a5] for every syscall the default policy denies (harmless
    arguments) and its argument-filtered denials: TIOCSTI with and without
    the high bit (CVE-2019-10063), TIOCLINUX, unshare(CLONE_NEWUSER), a
    personality change."""
    from sandbox.seccomp import DEFAULT_POLICY, SECCOMP_RET_ERRNO, compile_policy, evaluate
    from sandbox.syscalls import table

    nums, prog = table(), compile_policy(DEFAULT_POLICY)
    names = [n for n in (*DEFAULT_POLICY.deny, *DEFAULT_POLICY.errno_map) if n not in ("reboot", "vhangup")]
    # (personality(0) and clone(0) pass their argument rules: they get their own calls below)
    calls = [[nums[n], 0, 0, 0, 0, 0, 0] for n in names
             if evaluate(prog, nums[n], (0,) * 6) & 0xFFFF0000 == SECCOMP_RET_ERRNO]
    return calls + [[nums["ioctl"], 0, 0x5412, 0, 0, 0, 0], [nums["ioctl"], 0, (1 << 32) | 0x5412, 0, 0, 0, 0],
                    [nums["ioctl"], 0, 0x541C, 0, 0, 0, 0], [nums["unshare"], 0x10000000, 0, 0, 0, 0, 0],
                    [nums["personality"], 0x0008, 0, 0, 0, 0, 0]]


def _answers(policy: Any, calls: list[list[int]]) -> list[str]:
    """The errno name each call gets from `policy`'s compiled program."""
    from sandbox.seccomp import compile_policy, evaluate

    prog = compile_policy(policy)
    return [E.errorcode[evaluate(prog, nr, tuple(args)) & 0xFFFF] for nr, *args in calls]


def _seccomp_cases() -> list[Case]:
    from sandbox.seccomp import DEFAULT_POLICY
    from sandbox.syscalls import table

    calls = _denied_calls()
    # The same rules with a distinctive errno: only the filter can give EBADE,
    # so these answers prove the program itself ran (EPERM could be the kernel's).
    marked = DEFAULT_POLICY.replace(errno=E.EBADE)
    nums = table()
    allowed = [[nums["getppid"], 0, 0, 0, 0, 0, 0], [nums["personality"], 0xFFFFFFFF, 0, 0, 0, 0, 0],
               [nums["ioctl"], 1, 0x5413, 0, 0, 0, 0]]  # TIOCGWINSZ on a pipe: ENOTTY, from the tty layer
    return [
        Case("default_seccomp_policy", request={"actions": [["syscalls", calls]]},
             expect={("actions",): [_answers(DEFAULT_POLICY, calls)]}),
        Case("seccomp_policy_with_a_distinct_errno", spec={"seccomp": marked},
             request={"actions": [["syscalls", calls]]}, expect={("actions",): [_answers(marked, calls)]}),
        Case("seccomp_allows_the_rest", request={"actions": [["syscalls", allowed]]},
             expect={("actions",): [["ok", "ok", "ENOTTY"]]}),
    ]


SECCOMP_CASES = _seccomp_cases()

CASES: list[Case] = (MOUNT_CASES + NAMESPACE_CASES + IDENTITY_CASES + ENV_CASES + LIMIT_CASES + PROCESS_CASES
                     + SIGNAL_CASES + ERROR_CASES + SECCOMP_CASES)


def fill(value: Any, ctx: Mapping[str, Any]) -> Any:
    """`value` with "{host}", "{uid}" and "{gid}" substituted in every string, recursively."""
    if isinstance(value, str):
        value = value.replace("/{host}", str(ctx["host"]))
        for key in ("uid", "gid"):
            value = value.replace("{" + key + "}", str(ctx[key]))
        return value
    if isinstance(value, tuple):
        return tuple(fill(v, ctx) for v in value)
    if isinstance(value, list):
        return [fill(v, ctx) for v in value]
    if isinstance(value, dict):
        return {fill(k, ctx): fill(v, ctx) for k, v in value.items()}
    if isinstance(value, S.Mount):
        changes = {f.name: fill(getattr(value, f.name), ctx) for f in dataclasses.fields(value)
                   if isinstance(getattr(value, f.name), str)}
        return dataclasses.replace(value, **changes)
    if isinstance(value, (Contains, Lacks)):
        return type(value)(fill(value.item, ctx))
    return value
