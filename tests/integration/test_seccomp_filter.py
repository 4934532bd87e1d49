"""The compiled policies installed in the real kernel.

A small C helper (built with `cc` into a temporary folder) reads a BPF program
from a file, sets PR_SET_NO_NEW_PRIVS, installs the program with
PR_SET_SECCOMP, then either makes the raw syscalls named on its command line
and prints their errnos as JSON, or execs a command under the filter.
"""

from __future__ import annotations

import errno
import json
import platform
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from sandbox import seccomp as S
from sandbox import syscalls

pytestmark = [
    pytest.mark.skipif(platform.system() != "Linux" or platform.machine() != "x86_64", reason="x86_64 Linux only"),
    pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler"),
]

HELPER_C = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

/* helper FILTER|- --exec PROG ARGS... | --int80 | LABEL=NR[,ARG...]...
   Output goes through one static buffer and write(2), so the helper itself
   needs nothing but write and exit_group once the filter is on. */
static char out[65536];

static void install(const char *path) {
    static struct sock_filter buf[4096];
    if (strcmp(path, "-") == 0) return;
    FILE *f = fopen(path, "rb");
    if (!f) { perror("fopen"); exit(2); }
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    struct sock_fprog prog = { .len = (unsigned short)(n / 8), .filter = buf };
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) {
        perror("prctl");
        exit(3);
    }
}

static int call(char *spec) {
    unsigned long long a[7] = {0};
    char *eq = strchr(spec, '='), *p;
    int n = 0;
    *eq = 0;
    for (p = eq + 1; n < 7; n++) {
        a[n] = strtoull(p, &p, 0);
        if (*p != ',') break;
        p++;
    }
    pid_t self = (pid_t)syscall(SYS_getpid);
    errno = 0;
    long r = syscall((long)a[0], a[1], a[2], a[3], a[4], a[5], a[6]);
    int e = r == -1 ? errno : 0;
    if ((pid_t)syscall(SYS_getpid) != self) _exit(0); /* a clone that got through: the child leaves */
    return e;
}

int main(int argc, char **argv) {
    struct rlimit nocore = {0, 0};
    setrlimit(RLIMIT_CORE, &nocore);
    if (argc < 2) return 2;
    install(argv[1]);
    if (argc > 2 && strcmp(argv[2], "--exec") == 0) {
        execv(argv[3], argv + 3);
        return 127;
    }
    if (argc > 2 && strcmp(argv[2], "--int80") == 0) {
        long r;
        __asm__ volatile ("int $0x80" : "=a"(r) : "a"(20L) : "memory"); /* i386 getpid */
        int len = snprintf(out, sizeof out, "survived %ld\n", r);
        return write(1, out, len) == len ? 0 : 1;
    }
    int len = snprintf(out, sizeof out, "{");
    for (int i = 2; i < argc; i++) {
        char *label = argv[i];
        int e = call(label);
        len += snprintf(out + len, sizeof out - len, "%s\"%s\": %d", i > 2 ? ", " : "", label, e);
    }
    len += snprintf(out + len, sizeof out - len, "}\n");
    return write(1, out, len) == len ? 0 : 1;
}
"""

NR = syscalls.table()
TIOCSTI, TCGETS = 0x5412, 0x5401
CLONE_NEWUSER, CLONE_NEWUTS, SIGCHLD = 0x10000000, 0x04000000, 17
ADDR_NO_RANDOMIZE = 0x0040000

# label -> (syscall, args); the helper makes each call with syscall(2)
CALLS: dict[str, tuple[str, tuple[int, ...]]] = {
    "getpid": ("getpid", ()),
    "keyctl": ("keyctl", (0, 2**64 - 3, 0)),  # KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING
    "add_key": ("add_key", (0, 0, 0, 0, 0)),
    "bpf": ("bpf", (0, 0, 0)),
    "perf_event_open": ("perf_event_open", (0, 0, 0, 2**64 - 1, 0)),
    "userfaultfd": ("userfaultfd", (0,)),
    "io_uring_setup": ("io_uring_setup", (1, 0)),
    "unshare_newuser": ("unshare", (CLONE_NEWUSER,)),
    "clone_newuser": ("clone", (CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0)),
    "clone3": ("clone3", (0, 0)),
    "fsopen": ("fsopen", (0, 0)),
    "open_tree": ("open_tree", (2**64 - 100, 0, 0)),
    "tiocsti": ("ioctl", (0, TIOCSTI, 0)),
    "tiocsti_high_bit": ("ioctl", (0, 0x1_0000_5412, 0)),
    "tcgets": ("ioctl", (0, TCGETS, 0)),
    "personality_query": ("personality", (0xFFFFFFFF,)),
    "personality_no_aslr": ("personality", (ADDR_NO_RANDOMIZE,)),
    "syslog": ("syslog", (10, 0, 0)),  # SYSLOG_ACTION_SIZE_BUFFER
}


@pytest.fixture(scope="module")
def helper(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("seccomp_helper")
    (folder / "helper.c").write_text(HELPER_C)
    subprocess.run(["cc", "-O1", "-Wall", "-o", str(folder / "helper"), str(folder / "helper.c")], check=True)
    return folder / "helper"


def run_helper(helper: Path, prog: bytes | None, *args: str) -> subprocess.CompletedProcess[str]:
    path = "-"
    if prog is not None:
        path = str(helper.parent / f"filter-{hash(prog) & 0xFFFFFFFF:x}.bpf")
        Path(path).write_bytes(prog)
    return subprocess.run([str(helper), path, *args], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=60)


def errnos(helper: Path, prog: bytes | None, calls: dict[str, tuple[str, tuple[int, ...]]]) -> dict[str, int]:
    specs = [f"{label}={','.join(str(v) for v in (NR[name], *args))}" for label, (name, args) in calls.items()]
    done = run_helper(helper, prog, *specs)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_default_policy_errnos(helper: Path) -> None:
    got = errnos(helper, S.compile_policy(S.DEFAULT_POLICY), CALLS)
    eperm = ("keyctl", "add_key", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "unshare_newuser",
             "clone_newuser", "tiocsti", "tiocsti_high_bit", "personality_no_aslr", "syslog")
    assert {k: got[k] for k in eperm} == dict.fromkeys(eperm, errno.EPERM)
    assert {k: got[k] for k in ("clone3", "fsopen", "open_tree")} == dict.fromkeys(
        ("clone3", "fsopen", "open_tree"), errno.ENOSYS)
    assert got["getpid"] == 0
    assert got["personality_query"] == 0
    assert got["tcgets"] == errno.ENOTTY  # allowed: stdin is /dev/null, which is no terminal


def test_denials_come_from_the_filter(helper: Path) -> None:
    """With a distinctive errno, every denied call reports it, so it was the filter, not the kernel."""
    marker = errno.ENOTRECOVERABLE
    got = errnos(helper, S.compile_policy(S.DEFAULT_POLICY.replace(errno=marker)), CALLS)
    for label in ("keyctl", "unshare_newuser", "clone_newuser", "tiocsti_high_bit", "personality_no_aslr"):
        assert got[label] == marker, label
    unfiltered = errnos(helper, None, {"clone3": CALLS["clone3"], "tiocsti_high_bit": CALLS["tiocsti_high_bit"]})
    assert unfiltered["clone3"] != errno.ENOSYS  # the kernel has clone3: ENOSYS above came from the filter
    assert unfiltered["tiocsti_high_bit"] == errno.ENOTTY  # the kernel reads the low 32 bits: TIOCSTI


def test_namespaces_other_than_user_left_to_capabilities(helper: Path) -> None:
    """unshare(CLONE_NEWUTS) passes the filter: it gets what the caller's capabilities give it."""
    calls = {"unshare_uts": ("unshare", (CLONE_NEWUTS,)), "clone_plain": ("clone", (SIGCHLD, 0, 0, 0, 0))}
    unfiltered = errnos(helper, None, calls)
    filtered = errnos(helper, S.compile_policy(S.DEFAULT_POLICY), calls)
    assert filtered == unfiltered
    assert filtered["clone_plain"] == 0


def test_x32_syscall_refused(helper: Path) -> None:
    """An x32 syscall number gets ENOSYS, whether or not this kernel was built with x32 support."""
    x32_getpid = f"x32_getpid={syscalls.X32_SYSCALL_BIT | NR['getpid']}"
    done = run_helper(helper, S.compile_policy(S.DEFAULT_POLICY.replace(errno=errno.ENOTRECOVERABLE)), x32_getpid)
    assert json.loads(done.stdout) == {"x32_getpid": errno.ENOSYS}


def test_allowlist_in_the_kernel(helper: Path) -> None:
    policy = S.Seccomp(allow=("write", "exit_group", "getpid"), default="errno", errno=errno.EACCES)
    got = errnos(helper, S.compile_policy(policy), {"getpid": ("getpid", ()), "getppid": ("getppid", ())})
    assert got == {"getpid": 0, "getppid": errno.EACCES}
    killer = S.Seccomp(allow=("write", "exit_group", "getpid"), default="kill")
    done = run_helper(helper, S.compile_policy(killer), f"getppid={NR['getppid']}")
    assert done.returncode == -signal.SIGSYS


def test_exec_under_the_default_filter(helper: Path) -> None:
    done = run_helper(helper, S.compile_policy(S.DEFAULT_POLICY), "--exec", "/bin/sh", "-c",
                      "grep '^Seccomp:' /proc/self/status; echo ok")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["Seccomp:", "2", "ok"]


def test_i386_syscall_kills(helper: Path) -> None:
    bare = run_helper(helper, None, "--int80")
    if bare.returncode != 0:
        pytest.skip(f"this kernel has no i386 emulation (int 0x80 ends with {bare.returncode})")
    done = run_helper(helper, S.compile_policy(S.DEFAULT_POLICY), "--int80")
    assert done.returncode == -signal.SIGSYS
    assert done.stdout == ""
