#!/usr/bin/env python3
"""Measure what a seccomp policy costs: compiling it, and the kernel installing it.

Compile time is reported once uncached and then from the cache. Install cost
is the time of `prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER)` in a freshly
forked child of a small C helper (built with `cc` into a temporary folder),
median over many runs, for each policy compiled as the binary-search tree
(`compile_policy`) and as a naive linear chain of the same rules
(`compile_linear`). At install the kernel emulates the filter for every
syscall number to find the always-allowed ones, so the table also gives the
instructions that emulation walks (`emulated`), computed in Python.

Usage: python3 benchmarks/seccomp_install.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandbox import seccomp as S
from sandbox import syscalls
from sandbox.seccomp.bpf import _insns

HELPER_C = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int64_t install_once(struct sock_fprog *prog) {
    int fds[2];
    int64_t ns = 0;
    if (pipe(fds) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        struct timespec a, b;
        prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
        clock_gettime(CLOCK_MONOTONIC, &a);
        int rc = prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, prog);
        clock_gettime(CLOCK_MONOTONIC, &b);
        ns = rc ? -(int64_t)errno : (b.tv_sec - a.tv_sec) * 1000000000LL + (b.tv_nsec - a.tv_nsec);
        if (write(fds[1], &ns, sizeof ns) != sizeof ns) _exit(1);
        _exit(0);
    }
    close(fds[1]);
    if (read(fds[0], &ns, sizeof ns) != sizeof ns) ns = -1;
    close(fds[0]);
    waitpid(pid, NULL, 0);
    return ns;
}

int main(int argc, char **argv) {
    static struct sock_filter buf[4096];
    if (argc != 3) return 2;
    FILE *f = fopen(argv[1], "rb");
    if (!f) return 2;
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    struct sock_fprog prog = { .len = (unsigned short)(n / sizeof buf[0]), .filter = buf };
    for (int i = 0, runs = atoi(argv[2]); i < runs; i++)
        printf("%lld\n", (long long)install_once(&prog));
    return 0;
}
"""


def build_helper(folder: Path) -> Path:
    """Compile the install-timing helper into `folder`."""
    src, exe = folder / "install.c", folder / "install"
    src.write_text(HELPER_C)
    subprocess.run(["cc", "-O2", "-o", str(exe), str(src)], check=True)
    return exe


def install_times_us(helper: Path, prog: bytes, runs: int, folder: Path) -> list[float]:
    """prctl(PR_SET_SECCOMP) durations in microseconds, one per forked child."""
    path = folder / "filter.bpf"
    path.write_bytes(prog)
    out = subprocess.run([str(helper), str(path), str(runs)], check=True, capture_output=True, text=True).stdout
    values = [int(line) for line in out.split()]
    if any(v < 0 for v in values):
        raise SystemExit(f"prctl failed: errno {-min(values)}")
    return [v / 1000 for v in values]


def emulated_instructions(prog: bytes) -> int:
    """Instructions the kernel's install-time emulation (seccomp_cache_prepare) walks over all
    native syscall numbers: it stops at a RET or at the first argument load."""
    total = 0
    for nr in range(max(syscalls.table().values()) + 1):
        data = S.seccomp_data(nr)
        total += _const_walk(_insns(prog), data)
    return total


def _const_walk(insns: list[tuple[int, int, int, int]], data: bytes) -> int:
    pc = steps = 0
    a = 0
    while True:
        code, jt, jf, k = insns[pc]
        steps += 1
        if code == S.BPF_LD | S.BPF_W | S.BPF_ABS:
            if k not in (S.OFF_NR, S.OFF_ARCH):
                return steps
            a = int.from_bytes(data[k:k + 4], "little")
            pc += 1
        elif code & 0x07 == S.BPF_RET:
            return steps
        elif code == S.BPF_JMP | S.BPF_JA:
            pc += 1 + k
        elif code & 0x07 == S.BPF_JMP:
            taken = {S.BPF_JEQ: a == k, S.BPF_JGE: a >= k, S.BPF_JGT: a > k, S.BPF_JSET: bool(a & k)}[code & 0xF0]
            pc += 1 + (jt if taken else jf)
        elif code == S.BPF_ALU | S.BPF_AND | S.BPF_K:
            a &= k
            pc += 1
        else:
            return steps


def timed(fn: Callable[[], object], repeat: int = 1) -> float:
    """Mean seconds per call of `fn` over `repeat` calls."""
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def policies() -> dict[str, S.Seccomp]:
    """The policies measured: the default one, an empty one, and a large allowlist."""
    denied = {name for name, _ in S.policy_table()}
    allow = tuple(n for n in syscalls.table() if n not in denied)
    return {
        "default (denylist + arg rules)": S.DEFAULT_POLICY,
        "no rules (arch + x32 only)": S.Seccomp(),
        f"allowlist of {len(allow)} syscalls": S.Seccomp(allow=allow, default="errno", rules=S.DEFAULT_POLICY.rules),
    }


def report_compile() -> None:
    policy = S.DEFAULT_POLICY
    uncached = timed(lambda: S.compile_policy.__wrapped__(policy), repeat=20)
    S.compile_policy(policy)
    cached = timed(lambda: S.compile_policy(policy), repeat=10000)
    print(f"compile DEFAULT_POLICY: {uncached * 1e3:.2f} ms uncached, {cached * 1e6:.2f} us from the cache")
    print()


def report_install(runs: int) -> None:
    header = f"{'policy':<36} {'layout':<7} {'insns':>5} {'max path':>8} {'emulated':>8} " \
             f"{'median us':>9} {'p10 us':>7} {'p90 us':>7}"
    print(header)
    print("-" * len(header))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        helper = build_helper(folder)
        for name, policy in policies().items():
            for layout, compile_ in (("tree", S.compile_policy), ("linear", S.compile_linear)):
                prog = compile_(policy)
                times = install_times_us(helper, prog, runs, folder)
                deciles = statistics.quantiles(times, n=10)
                print(f"{name:<36} {layout:<7} {len(prog) // 8:>5} {S.max_path_length(prog):>8} "
                      f"{emulated_instructions(prog):>8} {statistics.median(times):>9.1f} "
                      f"{deciles[0]:>7.1f} {deciles[-1]:>7.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000, help="installs per policy (default 2000)")
    args = parser.parse_args()
    print(f"kernel {os.uname().release}, {args.runs} installs per row, each in a fresh fork\n")
    report_compile()
    report_install(args.runs)


if __name__ == "__main__":
    main()
