"""Reading BPF programs back: an interpreter (`evaluate`, `path_length`,
`max_path_length`) that runs a program as the kernel would, and a
disassembler (`disassemble`, `describe_action`).

Not needed to run a policy: tests, benchmarks, `ArgRule.describe` and
`policy_table` use it.
"""

from __future__ import annotations

import errno as _errno
import struct
from collections.abc import Iterable

from .. import syscalls
from . import bpf

# ---------------------------------------------------------------- interpreter

def seccomp_data(nr: int, args: Iterable[int] = (0,) * 6, arch: int = syscalls.AUDIT_ARCH_X86_64,
                 instruction_pointer: int = 0) -> bytes:
    """The 64-byte `struct seccomp_data` the kernel hands a filter (values wrap as in C)."""
    words = [a & 0xFFFFFFFFFFFFFFFF for a in args]
    if len(words) > 6:
        raise ValueError("a syscall has at most 6 arguments")
    words += [0] * (6 - len(words))
    return struct.pack("<IIQ6Q", nr & 0xFFFFFFFF, arch & 0xFFFFFFFF, instruction_pointer & (2**64 - 1), *words)


def evaluate(prog: bytes, nr: int, args: Iterable[int] = (0,) * 6, arch: int = syscalls.AUDIT_ARCH_X86_64) -> int:
    """Run `prog` on one syscall as the kernel would; return the SECCOMP_RET_* word."""
    return _run(bpf._insns(prog), seccomp_data(nr, args, arch))[0]


def path_length(prog: bytes, nr: int, args: Iterable[int] = (0,) * 6,
                arch: int = syscalls.AUDIT_ARCH_X86_64) -> int:
    """How many instructions `prog` executes for one syscall."""
    return _run(bpf._insns(prog), seccomp_data(nr, args, arch))[1]


def max_path_length(prog: bytes) -> int:
    """The most instructions any path through `prog` executes (jumps go forward only)."""
    insns = bpf._insns(prog)
    longest = [0] * len(insns)
    for pc in range(len(insns) - 1, -1, -1):
        longest[pc] = 1 + max((longest[s] for s in bpf._successors(pc, insns[pc])), default=0)
    return longest[0]


def _run(insns: list[tuple[int, int, int, int]], data: bytes) -> tuple[int, int]:
    """Interpret; return (action word, instructions executed)."""
    regs = {"A": 0, "X": 0}
    mem = [0] * bpf.BPF_MEMWORDS
    pc = steps = 0
    while True:
        if pc >= len(insns):
            raise ValueError("ran off the end of the program")
        code, jt, jf, k = insns[pc]
        steps += 1
        cls = code & 0x07
        if cls == bpf.BPF_RET:
            return (regs["A"] if code & 0x18 == bpf.BPF_A else k), steps
        if cls == bpf.BPF_JMP:
            pc += 1 + _jump(code, jt, jf, k, regs)
            continue
        if cls == bpf.BPF_ALU:
            if not _alu(code, k, regs):
                return 0, steps  # division by zero at run time: the kernel returns 0
        else:
            _load_store(code, k, regs, mem, data)
        pc += 1


def _jump(code: int, jt: int, jf: int, k: int, regs: dict[str, int]) -> int:
    op = code & 0xF0
    if op == bpf.BPF_JA:
        return k
    src = regs["X"] if code & bpf.BPF_X else k
    a = regs["A"]
    taken = {bpf.BPF_JEQ: a == src, bpf.BPF_JGT: a > src, bpf.BPF_JGE: a >= src, bpf.BPF_JSET: bool(a & src)}[op]
    return jt if taken else jf


def _alu(code: int, k: int, regs: dict[str, int]) -> bool:
    op, a = code & 0xF0, regs["A"]
    src = regs["X"] if code & bpf.BPF_X else k
    if op in (bpf.BPF_DIV, bpf.BPF_MOD) and src == 0:
        return False
    result = {
        bpf.BPF_ADD: lambda: a + src, bpf.BPF_SUB: lambda: a - src, bpf.BPF_MUL: lambda: a * src,
        bpf.BPF_DIV: lambda: a // src, bpf.BPF_MOD: lambda: a % src, bpf.BPF_OR: lambda: a | src,
        bpf.BPF_AND: lambda: a & src, bpf.BPF_XOR: lambda: a ^ src, bpf.BPF_NEG: lambda: -a,
        bpf.BPF_LSH: lambda: a << (src & 31), bpf.BPF_RSH: lambda: a >> (src & 31),
    }[op]()
    regs["A"] = result & 0xFFFFFFFF
    return True


def _load_store(code: int, k: int, regs: dict[str, int], mem: list[int], data: bytes) -> None:
    cls = code & 0x07
    if cls == bpf.BPF_MISC:
        if code & 0xF8 == bpf.BPF_TXA:
            regs["A"] = regs["X"]
        else:
            regs["X"] = regs["A"]
        return
    if cls in (bpf.BPF_ST, bpf.BPF_STX):
        mem[k] = regs["A" if cls == bpf.BPF_ST else "X"]
        return
    mode = code & 0xE0
    value = {
        bpf.BPF_ABS: lambda: int.from_bytes(data[k:k + 4], "little"),
        bpf.BPF_LEN: lambda: len(data),
        bpf.BPF_IMM: lambda: k,
        bpf.BPF_MEM: lambda: mem[k],
    }[mode]()
    regs["A" if cls == bpf.BPF_LD else "X"] = value


# ---------------------------------------------------------------- disassembler

_RET_NAMES = {
    bpf.SECCOMP_RET_KILL_PROCESS: "KILL_PROCESS", bpf.SECCOMP_RET_KILL_THREAD: "KILL_THREAD",
    bpf.SECCOMP_RET_TRAP: "TRAP", bpf.SECCOMP_RET_ERRNO: "ERRNO", bpf.SECCOMP_RET_USER_NOTIF: "USER_NOTIF",
    bpf.SECCOMP_RET_TRACE: "TRACE", bpf.SECCOMP_RET_LOG: "LOG", bpf.SECCOMP_RET_ALLOW: "ALLOW",
}
_ALU_NAMES = {bpf.BPF_ADD: "add", bpf.BPF_SUB: "sub", bpf.BPF_MUL: "mul", bpf.BPF_DIV: "div", bpf.BPF_OR: "or",
              bpf.BPF_AND: "and", bpf.BPF_LSH: "lsh", bpf.BPF_RSH: "rsh", bpf.BPF_NEG: "neg", bpf.BPF_MOD: "mod",
              bpf.BPF_XOR: "xor"}
_JMP_NAMES = {bpf.BPF_JA: "ja", bpf.BPF_JEQ: "jeq", bpf.BPF_JGT: "jgt", bpf.BPF_JGE: "jge", bpf.BPF_JSET: "jset"}


def describe_action(word: int) -> str:
    """'ALLOW', 'KILL_PROCESS', 'ERRNO(EPERM)', ... for a SECCOMP_RET_* word."""
    action, data = word & bpf.SECCOMP_RET_ACTION_FULL, word & bpf.SECCOMP_RET_DATA
    name = _RET_NAMES.get(action, f"{action:#x}")
    if action == bpf.SECCOMP_RET_ERRNO:
        return f"ERRNO({_errno.errorcode.get(data, data)})"
    return f"{name}({data})" if data else name


def _field_name(offset: int) -> str:
    if offset == bpf.OFF_NR:
        return "nr"
    if offset == bpf.OFF_ARCH:
        return "arch"
    if offset < bpf.OFF_ARGS:
        return "instruction_pointer " + ("lo" if offset == 8 else "hi")
    i, half = divmod(offset - bpf.OFF_ARGS, 8)
    return f"args[{i}] " + ("lo" if half == 0 else "hi")


def _register_sources(insns: list[tuple[int, int, int, int]]) -> list[str | None]:
    """For each instruction, which seccomp_data field A surely holds on entry (or None)."""
    unset = object()
    state: list[object] = [unset] * len(insns)
    state[0] = None
    for pc, insn in enumerate(insns):
        code, k = insn[0], insn[3]
        held = state[pc] if state[pc] is not unset else None
        if code & 0x07 == bpf.BPF_LD:
            held = _field_name(k) if code == bpf.BPF_LD | bpf.BPF_W | bpf.BPF_ABS else None
        elif code & 0x07 in (bpf.BPF_ALU, bpf.BPF_MISC):
            held = None
        for nxt in bpf._successors(pc, insn):
            if nxt < len(insns):
                state[nxt] = held if state[nxt] is unset or state[nxt] == held else None
    return [s if isinstance(s, str) else None for s in state]


def _jump_comment(held: str | None, k: int) -> str:
    if held == "nr":
        return "x32 bit" if k == syscalls.X32_SYSCALL_BIT else syscalls.name(k) or f"syscall {k}"
    if held == "arch":
        return {syscalls.AUDIT_ARCH_X86_64: "x86_64", syscalls.AUDIT_ARCH_I386: "i386"}.get(k, "")
    return ""


def _disasm_one(pc: int, insn: tuple[int, int, int, int], held: str | None) -> str:
    code, jt, jf, k = insn
    cls, op = code & 0x07, code & 0xF0
    comment = ""
    if cls == bpf.BPF_RET:
        text = "ret  A" if code & 0x18 == bpf.BPF_A else f"ret  #{k:#x}"
        comment = "" if code & 0x18 == bpf.BPF_A else describe_action(k)
    elif code == bpf.BPF_JMP | bpf.BPF_JA:
        text = f"ja   {pc + 1 + k:04d}"
    elif cls == bpf.BPF_JMP:
        src = "x" if code & bpf.BPF_X else f"#{k:#x}"
        text = f"{_JMP_NAMES[op]:<4} {src:<12} jt {pc + 1 + jt:04d}  jf {pc + 1 + jf:04d}"
        comment = "" if code & bpf.BPF_X else _jump_comment(held, k)
    elif cls == bpf.BPF_ALU:
        text = "neg" if op == bpf.BPF_NEG else f"{_ALU_NAMES[op]:<4} " + ("x" if code & bpf.BPF_X else f"#{k:#x}")
    elif cls == bpf.BPF_MISC:
        text = "txa" if code & 0xF8 == bpf.BPF_TXA else "tax"
    elif cls in (bpf.BPF_ST, bpf.BPF_STX):
        text = f"{'st' if cls == bpf.BPF_ST else 'stx':<4} M[{k}]"
    else:
        text, comment = _disasm_load(code, k)
    return f"{pc:04d}: {text:<40}" + (f" ; {comment}" if comment else "")


def _disasm_load(code: int, k: int) -> tuple[str, str]:
    reg = "ld" if code & 0x07 == bpf.BPF_LD else "ldx"
    mode = code & 0xE0
    if mode == bpf.BPF_ABS:
        return f"{reg:<4} [{k}]", _field_name(k)
    if mode == bpf.BPF_LEN:
        return f"{reg:<4} #len", ""
    if mode == bpf.BPF_MEM:
        return f"{reg:<4} M[{k}]", ""
    return f"{reg:<4} #{k:#x}", ""


def disassemble(prog: bytes) -> list[str]:
    """One readable line per instruction, with jump targets as absolute indexes.

    Comments name the seccomp_data field a load reads, the syscall a number test
    compares with, and the action a RET returns.
    """
    insns = bpf._insns(prog)
    held = _register_sources(insns)
    return [_disasm_one(pc, insn, held[pc]) for pc, insn in enumerate(insns)]

