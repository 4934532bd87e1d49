"""Classic BPF for seccomp: the kernel's words, an assembler, and the kernel's acceptance check.

A program is the bytes of a `struct sock_filter[]` (8 bytes each: u16 code,
u8 jt, u8 jf, u32 k, little endian). `_Asm` builds one from instructions
and labels and resolves the jumps (8-bit forward offsets, so far jumps get
a copy of their RET or a `ja` trampoline); `check_program` rejects what
the kernel would. `ALLOW_ALL` is the one-instruction program that lets
every syscall through (bwrap needs a program even when the Spec has none).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

# seccomp return words (linux/seccomp.h): the action in the high 16 bits, data below
SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_KILL_THREAD = 0x00000000
SECCOMP_RET_TRAP = 0x00030000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_USER_NOTIF = 0x7FC00000
SECCOMP_RET_TRACE = 0x7FF00000
SECCOMP_RET_LOG = 0x7FFC0000
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ACTION_FULL = 0xFFFF0000
SECCOMP_RET_DATA = 0x0000FFFF

BPF_MAXINSNS = 4096
SECCOMP_DATA_SIZE = 64  # struct seccomp_data: nr, arch, instruction_pointer, args[6]
OFF_NR, OFF_ARCH, OFF_ARGS = 0, 4, 16

# classic BPF opcodes (linux/filter.h, linux/bpf_common.h)
BPF_LD, BPF_LDX, BPF_ST, BPF_STX, BPF_ALU, BPF_JMP, BPF_RET, BPF_MISC = range(8)
BPF_W, BPF_ABS, BPF_IMM, BPF_MEM, BPF_LEN = 0x00, 0x20, 0x00, 0x60, 0x80
BPF_K, BPF_X, BPF_A = 0x00, 0x08, 0x10
BPF_JA, BPF_JEQ, BPF_JGT, BPF_JGE, BPF_JSET = 0x00, 0x10, 0x20, 0x30, 0x40
BPF_ADD, BPF_SUB, BPF_MUL, BPF_DIV, BPF_OR, BPF_AND = 0x00, 0x10, 0x20, 0x30, 0x40, 0x50
BPF_LSH, BPF_RSH, BPF_NEG, BPF_MOD, BPF_XOR = 0x60, 0x70, 0x80, 0x90, 0xA0
BPF_TAX, BPF_TXA = 0x00, 0x80
BPF_MEMWORDS = 16


# ---------------------------------------------------------------- assembler

class _Label:
    """A position in the program; placed once, targeted by any number of jumps."""

    __slots__ = ()


@dataclass
class _Insn:
    """One instruction, its jumps still labels (`_Asm.assemble` resolves them)."""

    code: int
    k: int = 0
    jt: _Label | None = None  # jump targets (conditional jumps) or the JA target (jt)
    jf: _Label | None = None


class _Asm:
    """Builds a program from instructions and labels; `assemble` resolves the jumps.

    Return instructions are shared: `ret_label(word)` names one `ret word` placed
    at the end, which every jump to that action targets.
    """

    def __init__(self) -> None:
        self.items: list[_Insn | _Label] = []
        self.rets: dict[int, _Label] = {}

    def place(self, label: _Label) -> None:
        self.items.append(label)

    def ld(self, offset: int) -> None:
        self.items.append(_Insn(BPF_LD | BPF_W | BPF_ABS, offset))

    def and_(self, k: int) -> None:
        self.items.append(_Insn(BPF_ALU | BPF_AND | BPF_K, k))

    def ret(self, word: int) -> None:
        self.items.append(_Insn(BPF_RET | BPF_K, word))

    def ret_label(self, word: int) -> _Label:
        return self.rets.setdefault(word, _Label())

    def jump(self, op: int, k: int, jt: _Label, jf: _Label) -> _Insn:
        insn = _Insn(BPF_JMP | op | BPF_K, k, jt, jf)
        self.items.append(insn)
        return insn

    def assemble(self) -> bytes:
        """Place the shared returns, resolve labels, and encode.

        A conditional jump further than 255 instructions goes to a copy of its
        target placed right after it if that is a RET, else to a JA trampoline.
        """
        for word, label in self.rets.items():
            self.place(label)
            self.ret(word)
        self.rets = {}
        while self._add_trampolines():
            pass
        pos, _ = self._positions()
        insns = [it for it in self.items if isinstance(it, _Insn)]
        return b"".join(_encode(insn, pc, pos) for pc, insn in enumerate(insns))

    def _positions(self) -> tuple[dict[_Label, int], dict[_Label, _Insn]]:
        """Each label's instruction index, and the instruction found there."""
        pos: dict[_Label, int] = {}
        at: dict[_Label, _Insn] = {}
        pending: list[_Label] = []
        n = 0
        for it in self.items:
            if isinstance(it, _Label):
                pos[it] = n
                pending.append(it)
                continue
            for label in pending:
                at[label] = it
            pending = []
            n += 1
        return pos, at

    def _add_trampolines(self) -> bool:
        pos, at = self._positions()
        far: list[tuple[int, str]] = []
        pc = -1
        for idx, it in enumerate(self.items):
            if isinstance(it, _Label):
                continue
            pc += 1
            if it.code & 0x07 == BPF_JMP and it.code != BPF_JMP | BPF_JA:
                far += [(idx, side) for side in ("jt", "jf") if pos[getattr(it, side)] - pc - 1 > 255]
        for idx, side in reversed(far):
            insn = self.items[idx]
            assert isinstance(insn, _Insn)
            target = getattr(insn, side)
            stub = at[target]
            copy = _Insn(stub.code, stub.k) if stub.code & 0x07 == BPF_RET else _Insn(BPF_JMP | BPF_JA, 0, target)
            near = _Label()
            self.items[idx + 1:idx + 1] = [near, copy]
            setattr(insn, side, near)
        return bool(far)


def _encode(insn: _Insn, pc: int, pos: dict[_Label, int]) -> bytes:
    def off(label: _Label | None) -> int:
        assert label is not None
        delta = pos[label] - pc - 1
        assert delta >= 0, "BPF jumps only go forward"
        return delta

    if insn.code == BPF_JMP | BPF_JA:
        return struct.pack("<HBBI", insn.code, 0, 0, off(insn.jt))
    if insn.code & 0x07 == BPF_JMP:
        return struct.pack("<HBBI", insn.code, off(insn.jt), off(insn.jf), insn.k)
    return struct.pack("<HBBI", insn.code, 0, 0, insn.k)


# ---------------------------------------------------------------- program checks

_LOADS = {BPF_LD | BPF_W | BPF_ABS, BPF_LD | BPF_W | BPF_LEN, BPF_LDX | BPF_W | BPF_LEN,
          BPF_LD | BPF_IMM, BPF_LDX | BPF_IMM, BPF_LD | BPF_MEM, BPF_LDX | BPF_MEM}
_ALU_OPS = (BPF_ADD, BPF_SUB, BPF_MUL, BPF_DIV, BPF_OR, BPF_AND, BPF_LSH, BPF_RSH, BPF_MOD, BPF_XOR)
_JUMPS = {BPF_JMP | op | src for op in (BPF_JEQ, BPF_JGT, BPF_JGE, BPF_JSET) for src in (BPF_K, BPF_X)}
ALLOWED_OPCODES = frozenset(
    _LOADS | _JUMPS
    | {BPF_ALU | op | src for op in _ALU_OPS for src in (BPF_K, BPF_X)}
    | {BPF_ALU | BPF_NEG, BPF_ST, BPF_STX, BPF_JMP | BPF_JA, BPF_RET | BPF_K, BPF_RET | BPF_A,
       BPF_MISC | BPF_TAX, BPF_MISC | BPF_TXA}
)


def _insns(prog: bytes) -> list[tuple[int, int, int, int]]:
    if len(prog) % 8:
        raise ValueError(f"{len(prog)} bytes is not a whole number of 8-byte instructions")
    return list(struct.iter_unpack("<HBBI", prog))


def _successors(pc: int, insn: tuple[int, int, int, int]) -> tuple[int, ...]:
    code, jt, jf, k = insn
    if code & 0x07 == BPF_RET:
        return ()
    if code == BPF_JMP | BPF_JA:
        return (pc + 1 + k,)
    if code & 0x07 == BPF_JMP:
        return (pc + 1 + jt, pc + 1 + jf)
    return (pc + 1,)


def check_program(prog: bytes) -> None:
    """Raise ValueError unless the kernel would accept `prog` as a seccomp filter.

    Mirrors bpf_check_classic() and seccomp_check_filter(): 1..4096 instructions,
    only the opcodes seccomp allows, loads within struct seccomp_data, jumps
    inside the program, no scratch-memory read before a write, a RET last.
    """
    insns = _insns(prog)
    if not 1 <= len(insns) <= BPF_MAXINSNS:
        raise ValueError(f"must hold 1 to {BPF_MAXINSNS} instructions, not {len(insns)}")
    if insns[-1][0] & 0x07 != BPF_RET:
        raise ValueError("the last instruction must be a RET")
    for pc, insn in enumerate(insns):
        problem = _insn_problem(insn)
        if problem is None and any(s >= len(insns) for s in _successors(pc, insn)):
            problem = "jumps past the end"
        if problem:
            raise ValueError(f"instruction {pc} ({_hex(insn)}): {problem}")
    _check_memory(insns)


def _insn_problem(insn: tuple[int, int, int, int]) -> str | None:
    code, _jt, _jf, k = insn
    if code not in ALLOWED_OPCODES:
        return "opcode not allowed in a seccomp filter"
    if code == BPF_LD | BPF_W | BPF_ABS and (k % 4 or k > SECCOMP_DATA_SIZE - 4):
        return "load outside struct seccomp_data or unaligned"
    if code in (BPF_LD | BPF_MEM, BPF_LDX | BPF_MEM, BPF_ST, BPF_STX) and k >= BPF_MEMWORDS:
        return "scratch memory index out of range"
    if code in (BPF_ALU | BPF_DIV | BPF_K, BPF_ALU | BPF_MOD | BPF_K) and k == 0:
        return "division by zero"
    if code in (BPF_ALU | BPF_LSH | BPF_K, BPF_ALU | BPF_RSH | BPF_K) and k >= 32:
        return "shift by 32 or more"
    return None


def _check_memory(insns: list[tuple[int, int, int, int]]) -> None:
    """Reject a scratch-memory load that some path reaches before any store to that word."""
    full = (1 << BPF_MEMWORDS) - 1
    valid = [full] * len(insns)
    valid[0] = 0
    for pc, insn in enumerate(insns):
        code, k = insn[0], insn[3]
        if code in (BPF_LD | BPF_MEM, BPF_LDX | BPF_MEM) and not valid[pc] >> k & 1:
            raise ValueError(f"instruction {pc} reads scratch word M[{k}] before any store to it")
        out = valid[pc] | (1 << k if code in (BPF_ST, BPF_STX) else 0)
        for nxt in _successors(pc, insn):
            valid[nxt] &= out


def _hex(insn: tuple[int, int, int, int]) -> str:
    code, jt, jf, k = insn
    return f"code={code:#06x} jt={jt} jf={jf} k={k:#x}"



def _allow_all() -> bytes:
    asm = _Asm()
    asm.ret(SECCOMP_RET_ALLOW)
    return asm.assemble()


#: `ret #SECCOMP_RET_ALLOW`: a filter that changes nothing.
ALLOW_ALL: bytes = _allow_all()
