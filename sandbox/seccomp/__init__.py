"""Seccomp-BPF policies: a validated description (`Seccomp`) and a compiler to classic BPF.

A policy is pure data (`policy`); `compile_policy` (`compile`) turns it into
the bytes of a `struct sock_filter[]` built with the assembler in `bpf`,
for `prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)` or bwrap's
`--seccomp FD`. `DEFAULT_POLICY` (`default`) is on in every sandbox, with
reasons per entry in `DEFAULT_POLICY_REASONS` and `DEFAULT_POLICY_ALLOWED`.
`evaluate` interprets a program in Python as the kernel would, for tests;
`disassemble` prints one (`debug`).

Syscall names come from the installed kernel headers (sandbox.syscalls);
a syscall newer than those headers cannot be named and falls to the default.
"""

from __future__ import annotations

from ..lazy import lazy_getattr

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (type checkers read the name)
if TYPE_CHECKING:
    from .bpf import (
        ALLOW_ALL,
        ALLOWED_OPCODES,
        BPF_A,
        BPF_ABS,
        BPF_ADD,
        BPF_ALU,
        BPF_AND,
        BPF_DIV,
        BPF_IMM,
        BPF_JA,
        BPF_JEQ,
        BPF_JGE,
        BPF_JGT,
        BPF_JMP,
        BPF_JSET,
        BPF_K,
        BPF_LD,
        BPF_LDX,
        BPF_LEN,
        BPF_LSH,
        BPF_MAXINSNS,
        BPF_MEM,
        BPF_MEMWORDS,
        BPF_MISC,
        BPF_MOD,
        BPF_MUL,
        BPF_NEG,
        BPF_OR,
        BPF_RET,
        BPF_RSH,
        BPF_ST,
        BPF_STX,
        BPF_SUB,
        BPF_TAX,
        BPF_TXA,
        BPF_W,
        BPF_X,
        BPF_XOR,
        OFF_ARCH,
        OFF_ARGS,
        OFF_NR,
        SECCOMP_DATA_SIZE,
        SECCOMP_RET_ACTION_FULL,
        SECCOMP_RET_ALLOW,
        SECCOMP_RET_DATA,
        SECCOMP_RET_ERRNO,
        SECCOMP_RET_KILL_PROCESS,
        SECCOMP_RET_KILL_THREAD,
        SECCOMP_RET_LOG,
        SECCOMP_RET_TRACE,
        SECCOMP_RET_TRAP,
        SECCOMP_RET_USER_NOTIF,
        check_program,
    )
    from .compile import compile_linear, compile_policy
    from .debug import describe_action, disassemble, evaluate, max_path_length, path_length, seccomp_data
    from .default import CLONE_NEWUSER, DEFAULT_POLICY, DEFAULT_POLICY_ALLOWED, DEFAULT_POLICY_REASONS, policy_table
    from .policy import ARG32, MAX_ERRNO, OPS, Action, ArgRule, Seccomp, check_errno

# Each name is imported from its submodule on first use (PEP 562): a Spec needs
# the policy and the default one, not the compiler or the disassembler.
_FROM = {
    "compile": ("compile_linear", "compile_policy"),
    "debug": ("describe_action", "disassemble", "evaluate", "max_path_length", "path_length", "seccomp_data"),
    "default": ("CLONE_NEWUSER", "DEFAULT_POLICY", "DEFAULT_POLICY_ALLOWED", "DEFAULT_POLICY_REASONS", "policy_table"),
    "policy": ("ARG32", "MAX_ERRNO", "OPS", "Action", "ArgRule", "Seccomp", "check_errno"),
}


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "ALLOWED_OPCODES",
    "ALLOW_ALL",
    "ARG32",
    "Action",
    "ArgRule",
    "BPF_A",
    "BPF_ABS",
    "BPF_ADD",
    "BPF_ALU",
    "BPF_AND",
    "BPF_DIV",
    "BPF_IMM",
    "BPF_JA",
    "BPF_JEQ",
    "BPF_JGE",
    "BPF_JGT",
    "BPF_JMP",
    "BPF_JSET",
    "BPF_K",
    "BPF_LD",
    "BPF_LDX",
    "BPF_LEN",
    "BPF_LSH",
    "BPF_MAXINSNS",
    "BPF_MEM",
    "BPF_MEMWORDS",
    "BPF_MISC",
    "BPF_MOD",
    "BPF_MUL",
    "BPF_NEG",
    "BPF_OR",
    "BPF_RET",
    "BPF_RSH",
    "BPF_ST",
    "BPF_STX",
    "BPF_SUB",
    "BPF_TAX",
    "BPF_TXA",
    "BPF_W",
    "BPF_X",
    "BPF_XOR",
    "CLONE_NEWUSER",
    "DEFAULT_POLICY",
    "DEFAULT_POLICY_ALLOWED",
    "DEFAULT_POLICY_REASONS",
    "MAX_ERRNO",
    "OFF_ARCH",
    "OFF_ARGS",
    "OFF_NR",
    "OPS",
    "SECCOMP_DATA_SIZE",
    "SECCOMP_RET_ACTION_FULL",
    "SECCOMP_RET_ALLOW",
    "SECCOMP_RET_DATA",
    "SECCOMP_RET_ERRNO",
    "SECCOMP_RET_KILL_PROCESS",
    "SECCOMP_RET_KILL_THREAD",
    "SECCOMP_RET_LOG",
    "SECCOMP_RET_TRACE",
    "SECCOMP_RET_TRAP",
    "SECCOMP_RET_USER_NOTIF",
    "Seccomp",
    "check_errno",
    "check_program",
    "compile_linear",
    "compile_policy",
    "describe_action",
    "disassemble",
    "evaluate",
    "max_path_length",
    "path_length",
    "policy_table",
    "seccomp_data",
]

# a name of __all__ that no other submodule defines is the assembler's (bpf)
__getattr__ = lazy_getattr(__name__, {name: "bpf" for name in __all__} | {
    name: module for module, names in _FROM.items() for name in names})
