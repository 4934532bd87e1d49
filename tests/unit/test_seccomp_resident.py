"""seccomp.resident: when a Template's pid 1 may take its sandbox's filter before its request."""

from __future__ import annotations

import sandbox
from sandbox.seccomp import DEFAULT_POLICY, compile_policy
from sandbox.seccomp.resident import allows_resident


def test_the_default_policy_lets_pid_1_take_the_filter_early() -> None:
    assert allows_resident(compile_policy(DEFAULT_POLICY))


def test_a_policy_that_denies_what_pid_1_does_keeps_the_filter_on_the_command() -> None:
    for name in ("clone", "prctl", "wait4", "pidfd_open", "execve", "dup2", "chdir"):
        assert not allows_resident(compile_policy(sandbox.Seccomp(deny=(name,)))), name
    # clone with the flags pid 1 passes (CLONE_VM|CLONE_VFORK|SIGCHLD), not any clone
    vfork = sandbox.ArgRule("clone", 0, "has_bits", 0x4000)
    newuser = sandbox.ArgRule("clone", 0, "has_bits", 0x10000000)
    assert not allows_resident(compile_policy(sandbox.Seccomp(rules=(vfork,))))
    assert allows_resident(compile_policy(sandbox.Seccomp(rules=(newuser,))))


def test_no_filter_or_an_allowlist_without_those_syscalls() -> None:
    assert not allows_resident(b"")
    assert not allows_resident(compile_policy(sandbox.Seccomp(allow=("read", "write", "exit_group"), default="errno")))
