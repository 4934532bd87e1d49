"""Several classic BPF seccomp programs as one (bwrap's `--add-seccomp-fd`).

The kernel runs every installed filter, the most recently installed first,
and keeps the result whose action has the highest precedence: the lowest
action value read as a signed 32-bit number (KILL_PROCESS < KILL_THREAD <
TRAP < ERRNO < USER_NOTIF < TRACE < LOG < ALLOW); between equal actions, the
first one run wins. `stack()` builds one program that computes the same: each
program runs in turn (in the kernel's order) with A and X cleared, its
returns become jumps to a step that keeps the better result in a scratch
memory slot none of the programs use, and the last step returns it. So
installing the one program equals installing the list in order.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from ..errors import SpecError

_INSN = struct.Struct("=HBBI")
LD_IMM, LDX_IMM, ST, LD_MEM, LDX_MEM = 0x00, 0x01, 0x02, 0x60, 0x61
STX, RET_K, RET_A, JA, JGT_X, AND_K, XOR_K, TAX = 0x03, 0x06, 0x16, 0x05, 0x2D, 0x54, 0xA4, 0x07
ACTION_FULL = 0xFFFF0000  # SECCOMP_RET_ACTION_FULL
SIGN = 0x80000000  # flipping it orders signed values as unsigned ones
MEMWORDS = 16
BPF_MAXINSNS = 4096

Insn = tuple[int, int, int, int]


def stack(programs: Sequence[bytes]) -> bytes:
    """One program equal to installing `programs` in order (a single one is returned as it is)."""
    if len(programs) == 1:
        return programs[0]
    bodies = [[_INSN.unpack_from(p, i) for i in range(0, len(p), 8)] for p in programs]
    best, cand = _free_slots(bodies)
    out: list[Insn] = []
    for n, body in enumerate(reversed(bodies)):  # the kernel runs the newest first
        out += [(LD_IMM, 0, 0, 0), (LDX_IMM, 0, 0, 0)]
        out += _relocated(body, len(out))
        if n == 0:
            out.append((ST, 0, 0, best))
        else:
            out += [(ST, 0, 0, cand), (AND_K, 0, 0, ACTION_FULL), (XOR_K, 0, 0, SIGN), (TAX, 0, 0, 0),
                    (LD_MEM, 0, 0, best), (AND_K, 0, 0, ACTION_FULL), (XOR_K, 0, 0, SIGN),
                    (JGT_X, 0, 2, 0),  # the kept result ranks below the new one: take the new one
                    (LD_MEM, 0, 0, cand), (ST, 0, 0, best)]
    out += [(LD_MEM, 0, 0, best), (RET_A, 0, 0, 0)]
    if len(out) > BPF_MAXINSNS:
        raise SpecError("seccomp", len(out), f"the stacked programs need more than {BPF_MAXINSNS} instructions")
    return b"".join(_INSN.pack(*insn) for insn in out)


def _relocated(body: list[Insn], at: int) -> list[Insn]:
    """`body` placed at index `at`, each return turned into a jump to a
    trampoline after it (which loads a constant result into A), and every
    trampoline into a jump to the instruction that follows them all."""
    returns = [i for i, insn in enumerate(body) if insn[0] in (RET_K, RET_A)]
    trampoline, pos = {}, at + len(body)
    for i in returns:
        trampoline[i] = pos
        pos += 2 if body[i][0] == RET_K else 1
    collect = pos
    out = [(JA, 0, 0, trampoline[i] - (at + i) - 1) if i in trampoline else insn for i, insn in enumerate(body)]
    for i in returns:
        here = at + len(out)
        if body[i][0] == RET_K:
            out += [(LD_IMM, 0, 0, body[i][3]), (JA, 0, 0, collect - (here + 1) - 1)]
        else:
            out.append((JA, 0, 0, collect - here - 1))
    return out


def _free_slots(bodies: list[list[Insn]]) -> tuple[int, int]:
    used = {insn[3] for body in bodies for insn in body if insn[0] in (ST, STX, LD_MEM, LDX_MEM)}
    free = [slot for slot in range(MEMWORDS) if slot not in used]
    if len(free) < 2:
        raise SpecError("seccomp", sorted(used), "the programs leave no scratch memory to stack them")
    return free[0], free[1]
