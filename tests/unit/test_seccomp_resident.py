"""seccomp.resident: when a Template's pid 1 may take its sandbox's filter before its request, and when
a recycled one may keep its commands' user namespace (the filter refuses every keyring syscall)."""

from __future__ import annotations

import pytest

import sandbox
from sandbox import syscalls
from sandbox.seccomp import DEFAULT_POLICY, compile_policy
from sandbox.seccomp.resident import allows_resident, refuses_keyrings


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


def test_a_policy_that_denies_what_a_recycled_sandboxs_maker_does_keeps_the_filter_on_the_command() -> None:
    """A recycled sandbox's maker takes the filter for all its commands (csrc/template/template_maker.c): it must allow
    the maker's checks of what its commands inherit, each command child's session and the maker's clone."""
    for name in ("setsid", "pread64", "sched_getattr", "sched_getaffinity", "ioprio_get"):
        assert not allows_resident(compile_policy(sandbox.Seccomp(deny=(name,)))), name
    as_parents_child = sandbox.ArgRule("clone", 0, "has_bits", 0x8000)  # CLONE_PARENT
    assert not allows_resident(compile_policy(sandbox.Seccomp(rules=(as_parents_child,))))


def test_no_filter_or_an_allowlist_without_those_syscalls() -> None:
    assert not allows_resident(b"")
    assert not allows_resident(compile_policy(sandbox.Seccomp(allow=("read", "write", "exit_group"), default="errno")))


x86_64 = pytest.mark.skipif(syscalls.arch() != syscalls.AUDIT_ARCH_X86_64, reason="the ABIs checked are x86_64's")


@x86_64
def test_the_default_policy_refuses_every_keyring_call_on_every_abi() -> None:
    assert refuses_keyrings(compile_policy(DEFAULT_POLICY))
    assert refuses_keyrings(compile_policy(sandbox.Seccomp(deny=("keyctl", "add_key", "request_key"))))


@x86_64
def test_a_filter_that_lets_one_keyring_call_through_keeps_nothing() -> None:
    assert not refuses_keyrings(b"")
    assert not refuses_keyrings(compile_policy(sandbox.Seccomp(deny=("bpf",))))
    assert not refuses_keyrings(compile_policy(sandbox.Seccomp(deny=("keyctl", "add_key"))))  # request_key
    # denied for some arguments only: the verdict reads an argument, so it proves nothing for the others
    join = sandbox.ArgRule("keyctl", 0, "ne", 1)  # all but KEYCTL_JOIN_SESSION_KEYRING
    assert not refuses_keyrings(compile_policy(sandbox.Seccomp(deny=("add_key", "request_key"), rules=(join,))))
