"""Conformance cases for the seccomp filter: every call the default policy
denies gets the errno the compiled program says, on every backend."""

from __future__ import annotations

import errno as E
from typing import Any

from .model import Case


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


def seccomp_cases() -> list[Case]:
    """The default policy's denials, the same with a distinct errno, and calls it allows."""
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
