"""Seccomp-BPF policies: a validated description (`Seccomp`) and a compiler to classic BPF.

A policy is pure data; `compile_policy` turns it into the bytes of a
`struct sock_filter[]` (8 bytes each: u16 code, u8 jt, u8 jf, u32 k, little
endian) for `prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)` or bwrap's
`--seccomp FD`. The program

1. kills the process unless `seccomp_data.arch` is AUDIT_ARCH_X86_64 (no i386
   `int 0x80` or foreign-ABI detour around the number checks);
2. dispatches on the syscall number with a binary search (`jge`) over the
   intervals of numbers that share an action, so any syscall walks O(log n)
   instructions; numbers with the x32 bit set (>= 0x40000000) form the last
   interval and fail with ENOSYS (KILL_PROCESS under a `default="kill"`
   allowlist), as on a kernel without x32 support;
3. runs a syscall's argument rules, first match wins, then its base action.

Install cost is what this layout is for. At install the kernel converts and
JITs the program (cost per instruction) and then emulates it once for every
syscall number to find the always-allowed ones (cost per instruction walked).
So each RET is emitted once and shared, and the tree splits by how many
syscall numbers each side holds. Jumps past the 8-bit offsets get a copy of
the target RET or a `ja` trampoline. Measured on Linux 6.18 (median of 2000
installs, benchmarks/seccomp_install.py): the default policy installs in
about 24 us as 67 instructions, against 55 us for the same rules as a linear
chain. An empty filter takes about 14 us.

`evaluate` interprets a program in Python as the kernel would, for tests;
`disassemble` prints one. `DEFAULT_POLICY` is on in every sandbox, with
reasons per entry in `DEFAULT_POLICY_REASONS` and `DEFAULT_POLICY_ALLOWED`.

Syscall names come from the installed kernel headers (sandbox.syscalls);
a syscall newer than those headers cannot be named and falls to the default.
"""

from __future__ import annotations

import base64
import dataclasses
import errno as _errno
import functools
import itertools
import struct
import termios
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from . import syscalls
from .errors import SpecError

# ---------------------------------------------------------------- ABI constants

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

MAX_ERRNO = 4095
BPF_MAXINSNS = 4096
SECCOMP_DATA_SIZE = 64  # struct seccomp_data: nr, arch, instruction_pointer, args[6]
OFF_NR, OFF_ARCH, OFF_ARGS = 0, 4, 16
CLONE_NEWUSER = 0x10000000

# classic BPF opcodes (linux/filter.h, linux/bpf_common.h)
BPF_LD, BPF_LDX, BPF_ST, BPF_STX, BPF_ALU, BPF_JMP, BPF_RET, BPF_MISC = range(8)
BPF_W, BPF_ABS, BPF_IMM, BPF_MEM, BPF_LEN = 0x00, 0x20, 0x00, 0x60, 0x80
BPF_K, BPF_X, BPF_A = 0x00, 0x08, 0x10
BPF_JA, BPF_JEQ, BPF_JGT, BPF_JGE, BPF_JSET = 0x00, 0x10, 0x20, 0x30, 0x40
BPF_ADD, BPF_SUB, BPF_MUL, BPF_DIV, BPF_OR, BPF_AND = 0x00, 0x10, 0x20, 0x30, 0x40, 0x50
BPF_LSH, BPF_RSH, BPF_NEG, BPF_MOD, BPF_XOR = 0x60, 0x70, 0x80, 0x90, 0xA0
BPF_TAX, BPF_TXA = 0x00, 0x80
BPF_MEMWORDS = 16

DEFAULTS = ("allow", "errno", "kill")
ACTIONS = ("errno", "kill", "allow")
OPS = ("eq", "ne", "masked_eq", "and_eq", "has_bits")

# Arguments the kernel declares as 32-bit (int, unsigned int, pid_t, uid_t, umode_t) or
# truncates (clone's flags: lower_32_bits), so only their low 32 bits may be compared:
# the caller controls the high half of the register, which the kernel ignores.
# Any other argument is compared on all 64 bits unless an ArgRule says width=32.
ARG32: dict[str, frozenset[int]] = {
    name: frozenset(indexes)
    for name, indexes in {
        "ioctl": (0, 1), "fcntl": (0, 1), "personality": (0,), "clone": (0,), "prctl": (0,),
        "socket": (0, 1, 2), "socketpair": (0, 1, 2), "setsockopt": (0, 1, 2), "getsockopt": (0, 1, 2),
        "kill": (0, 1), "tkill": (0, 1), "tgkill": (0, 1, 2), "setns": (0, 1), "keyctl": (0,),
        "bpf": (0,), "madvise": (2,), "flock": (0, 1), "futex": (1,), "seccomp": (0, 1),
        "arch_prctl": (0,), "open": (1, 2), "openat": (0, 2, 3), "memfd_create": (1,), "umount2": (1,),
        "kcmp": (0, 1, 2), "setuid": (0,), "setgid": (0,), "setreuid": (0, 1), "setregid": (0, 1),
        "setresuid": (0, 1, 2), "setresgid": (0, 1, 2), "chmod": (1,), "fchmod": (0, 1),
        "fchmodat": (0, 2), "mknod": (1, 2), "mknodat": (0, 2, 3), "pidfd_open": (0, 1),
        "perf_event_open": (1, 2, 3), "dup3": (0, 1, 2), "epoll_ctl": (0, 1, 2),
    }.items()
}


# ---------------------------------------------------------------- validation helpers

def check_errno(where: str, value: object) -> int:
    """An errno number (1..4095) from an int or a name such as 'ENOSYS'."""
    if isinstance(value, str) and value.isupper() and isinstance(getattr(_errno, value, None), int):
        value = getattr(_errno, value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_ERRNO:
        raise SpecError(where, value, f"must be an errno number 1..{MAX_ERRNO} or a name like 'EPERM'")
    return value


def _syscall_names(where: str, value: object) -> tuple[str, ...]:
    """Sorted, deduplicated syscall names; every unknown name is listed in one error."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple, set, frozenset)):
        raise SpecError(where, value, "must be a list of syscall names")
    bad = [v for v in value if not isinstance(v, str)]
    if bad:
        raise SpecError(where, tuple(bad), "syscall names must be strings")
    unknown = syscalls.unknown_names(sorted(set(value)))
    if unknown:
        raise SpecError(where, tuple(unknown), f"unknown syscall name(s): {', '.join(unknown)} "
                                               "(not in the x86_64 table of the installed kernel headers)")
    return tuple(sorted(set(value)))


def _errno_pairs(where: str, value: object) -> tuple[tuple[str, int], ...]:
    """Normalize a mapping (or pairs) of syscall name -> errno to sorted pairs."""
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, (list, tuple)) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in value):
        items = [tuple(p) for p in value]
    else:
        raise SpecError(where, value, "must be a mapping of syscall names to errno values")
    names = _syscall_names(where, [k for k, _ in items])
    if len(names) != len(items):
        raise SpecError(where, value, "names a syscall twice")
    return tuple(sorted((k, check_errno(f"{where}[{k!r}]", v)) for k, v in items))


def _to_unsigned(where: str, value: object, width: int) -> int:
    """`value` as an unsigned `width`-bit integer (negative values wrap, as in C)."""
    if isinstance(value, bool) or not isinstance(value, int) or not -(1 << (width - 1)) <= value < (1 << width):
        raise SpecError(where, value, f"must be an integer that fits in {width} bits")
    return value & ((1 << width) - 1)


# ---------------------------------------------------------------- policy data

@dataclass(frozen=True)
class ArgRule:
    """Compare argument `arg_index` (0..5) of `syscall`; on a match return `action`.

    ops: `eq` (arg == value), `ne` (arg != value), `masked_eq` or its alias
    `and_eq` (arg & mask == value), `has_bits` (arg & value != 0).
    `action` is "errno" (fail with `errno`, default the policy's), "kill"
    (SECCOMP_RET_KILL_PROCESS) or "allow". Rules of a syscall run in order;
    the first match wins, else the syscall's own action applies. `width`
    (32 or 64) is how many low bits of the argument are compared; None takes
    32 for arguments in ARG32 (ints the kernel truncates, e.g. ioctl's
    request) and 64 otherwise.
    """

    syscall: str
    arg_index: int
    op: str
    value: int
    mask: int | None = None
    action: str = "errno"
    errno: int | None = None
    width: int | None = None

    def __post_init__(self) -> None:
        self.validate("rule")

    def validate(self, where: str) -> None:
        """Check and normalize the fields; raise SpecError naming `where`.field."""
        _syscall_names(f"{where}.syscall", [self.syscall])
        idx = self.arg_index
        if isinstance(idx, bool) or not isinstance(idx, int) or not 0 <= idx <= 5:
            raise SpecError(f"{where}.arg_index", idx, "must be 0..5")
        if self.op not in OPS:
            raise SpecError(f"{where}.op", self.op, f"must be one of {', '.join(OPS)}")
        if self.action not in ACTIONS:
            raise SpecError(f"{where}.action", self.action, f"must be one of {', '.join(ACTIONS)}")
        if self.errno is not None:
            object.__setattr__(self, "errno", check_errno(f"{where}.errno", self.errno))
        if self.width is not None and self.width not in (32, 64):
            raise SpecError(f"{where}.width", self.width, "must be 32, 64 or None")
        self._check_operands(where)

    def _check_operands(self, where: str) -> None:
        bits = self.bits
        set_ = object.__setattr__
        set_(self, "value", _to_unsigned(f"{where}.value", self.value, bits))
        if self.op in ("masked_eq", "and_eq"):
            if self.mask is None:
                raise SpecError(f"{where}.mask", None, f"op {self.op} needs a mask")
            set_(self, "mask", _to_unsigned(f"{where}.mask", self.mask, bits))
            if self.mask == 0:
                raise SpecError(f"{where}.mask", 0, "a zero mask matches every value")
            if self.value & ~self.mask:
                raise SpecError(f"{where}.value", self.value, f"has bits outside mask {self.mask:#x}: never matches")
        elif self.mask is not None:
            raise SpecError(f"{where}.mask", self.mask, f"only masked_eq/and_eq take a mask, not {self.op}")
        if self.op == "has_bits" and self.value == 0:
            raise SpecError(f"{where}.value", 0, "has_bits needs at least one bit")

    @property
    def bits(self) -> int:
        """How many low bits of the argument are compared (32 or 64)."""
        if self.width is not None:
            return self.width
        return 32 if self.arg_index in ARG32.get(self.syscall, ()) else 64

    def describe(self, policy_errno: int = _errno.EPERM) -> str:
        """A one-line summary, e.g. 'ERRNO(EPERM) if args[1] == 0x5412 (low 32 bits)'."""
        op = {"eq": "==", "ne": "!=", "has_bits": "has bits"}.get(self.op)
        cond = f"args[{self.arg_index}] {op} {self.value:#x}" if op else \
            f"args[{self.arg_index}] & {self.mask:#x} == {self.value:#x}"
        low = " (low 32 bits)" if self.bits == 32 else ""
        return f"{describe_action(self.word(policy_errno))} if {cond}{low}"

    def word(self, policy_errno: int) -> int:
        """The SECCOMP_RET_* word this rule returns on a match."""
        if self.action == "allow":
            return SECCOMP_RET_ALLOW
        if self.action == "kill":
            return SECCOMP_RET_KILL_PROCESS
        return SECCOMP_RET_ERRNO | (self.errno or policy_errno)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; `ArgRule.from_dict` inverts it."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: object, where: str = "rule") -> ArgRule:
        """Build an ArgRule from `to_dict` output; unknown keys raise SpecError."""
        body = _checked_keys(where, data, {f.name for f in dataclasses.fields(cls)})
        return _construct(cls, body, "rule", where)


@dataclass(frozen=True)
class Seccomp:
    """A seccomp policy: a denylist, an allowlist, or the caller's own BPF program.

    deny: syscalls that fail with `errno` (or their entry in `errnos`).
    allow: for an allowlist; needs `default` "errno" or "kill".
    default: what every syscall not listed gets: "allow" (denylist policy),
        "errno" (fail with `errno`) or "kill" (SECCOMP_RET_KILL_PROCESS).
    errno: the errno of denied syscalls (an int or a name like "EPERM").
    rules: ArgRule argument checks, first match wins per syscall.
    raw: a complete BPF program of the caller's (a multiple of 8 bytes), used as is;
        it excludes every other field.
    errnos: per-syscall errno (e.g. {"clone3": "ENOSYS"}); a syscall named here is
        denied with that errno. Given as a mapping, kept as sorted pairs (hashable).

    Validation at construction raises SpecError naming the field and value.
    """

    deny: tuple[str, ...] = ()
    allow: tuple[str, ...] = ()
    default: str = "allow"
    errno: int = _errno.EPERM
    rules: tuple[ArgRule, ...] = ()
    raw: bytes | None = None
    errnos: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        self.validate("seccomp")

    def validate(self, where: str) -> None:
        """Check and normalize the fields; raise SpecError naming `where`.field."""
        set_ = object.__setattr__
        set_(self, "deny", _syscall_names(f"{where}.deny", self.deny))
        set_(self, "allow", _syscall_names(f"{where}.allow", self.allow))
        if self.default not in DEFAULTS:
            raise SpecError(f"{where}.default", self.default, f"must be one of {', '.join(DEFAULTS)}")
        set_(self, "errno", check_errno(f"{where}.errno", self.errno))
        set_(self, "errnos", _errno_pairs(f"{where}.errnos", self.errnos))
        set_(self, "rules", self._checked_rules(where))
        self._check_raw(where)
        self._check_conflicts(where)

    def _checked_rules(self, where: str) -> tuple[ArgRule, ...]:
        if not isinstance(self.rules, (list, tuple)):
            raise SpecError(f"{where}.rules", self.rules, "must be a list of ArgRule")
        for i, rule in enumerate(self.rules):
            if not isinstance(rule, ArgRule):
                raise SpecError(f"{where}.rules[{i}]", rule, "must be an ArgRule")
            rule.validate(f"{where}.rules[{i}]")
        return tuple(self.rules)

    def _check_raw(self, where: str) -> None:
        if self.raw is None:
            return
        if not isinstance(self.raw, (bytes, bytearray, memoryview)):
            raise SpecError(f"{where}.raw", self.raw, "must be bytes (a struct sock_filter array)")
        raw = bytes(self.raw)
        object.__setattr__(self, "raw", raw)
        if len(raw) % 8:
            raise SpecError(f"{where}.raw", f"<{len(raw)} bytes>",
                            "length must be a multiple of 8 (struct sock_filter)")
        try:
            check_program(raw)
        except ValueError as exc:
            raise SpecError(f"{where}.raw", f"<{len(raw)} bytes>", str(exc)) from None
        others = [f.name for f in dataclasses.fields(self)
                  if f.name != "raw" and getattr(self, f.name) != f.default]
        if others:
            raise SpecError(f"{where}.raw", f"<{len(raw)} bytes>",
                            f"a raw program excludes the other fields, but {', '.join(others)} given")

    def _check_conflicts(self, where: str) -> None:
        both = sorted(set(self.deny) & set(self.allow))
        if both:
            raise SpecError(f"{where}.deny", tuple(both), "also in allow: a syscall is either allowed or denied")
        allowed_errnos = sorted({k for k, _ in self.errnos} & set(self.allow))
        if allowed_errnos:
            raise SpecError(f"{where}.errnos", tuple(allowed_errnos), "sets an errno for allowed syscalls")
        if self.allow and self.default == "allow":
            raise SpecError(f"{where}.default", self.default, "an allowlist needs default 'errno' or 'kill'")

    # ------------------------------------------------------------ conveniences

    @property
    def errno_map(self) -> dict[str, int]:
        """`errnos` as a dict."""
        return dict(self.errnos)

    def replace(self, **changes: Any) -> Seccomp:
        """A copy with `changes` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    def extend(self, deny: Iterable[str] = (), rules: Iterable[ArgRule] = (),
               errnos: Mapping[str, int | str] | None = None) -> Seccomp:
        """A copy that also denies `deny`, runs `rules` after its own and adds `errnos`."""
        merged = {**self.errno_map, **(errnos or {})}
        return self.replace(deny=(*self.deny, *deny), rules=(*self.rules, *rules), errnos=merged)

    # ------------------------------------------------------------ JSON

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; `Seccomp.from_dict` inverts it."""
        return {
            "deny": list(self.deny),
            "allow": list(self.allow),
            "default": self.default,
            "errno": self.errno,
            "rules": [r.to_dict() for r in self.rules],
            "raw_base64": None if self.raw is None else base64.b64encode(self.raw).decode(),
            "errnos": self.errno_map,
        }

    @classmethod
    def from_dict(cls, data: object, where: str = "seccomp") -> Seccomp:
        """Build a policy from `to_dict` output; unknown keys raise SpecError by name."""
        known = {f.name for f in dataclasses.fields(cls)} - {"raw"} | {"raw_base64"}
        body = _checked_keys(where, data, known)
        raw = body.pop("raw_base64", None)
        if raw is not None:
            try:
                body["raw"] = base64.b64decode(raw, validate=True)
            except (ValueError, TypeError):
                raise SpecError(f"{where}.raw_base64", raw, "is not valid base64") from None
        if "rules" in body:
            if not isinstance(body["rules"], list):
                raise SpecError(f"{where}.rules", body["rules"], "must be a list")
            body["rules"] = tuple(ArgRule.from_dict(r, f"{where}.rules[{i}]") for i, r in enumerate(body["rules"]))
        return _construct(cls, body, "seccomp", where)


def _construct(cls: type, body: dict[str, Any], own: str, where: str) -> Any:
    """`cls(**body)`, with SpecError fields renamed from `own`... to `where`..."""
    try:
        return cls(**body)
    except TypeError as exc:
        raise SpecError(where, body, f"missing a required key: {exc}") from None
    except SpecError as exc:
        field = where + exc.field[len(own):] if exc.field.startswith(own) else exc.field
        raise SpecError(field, exc.value, exc.problem) from None


def _checked_keys(where: str, data: object, known: set[str]) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise SpecError(where, data, "must be a JSON object")
    unknown = sorted(set(data) - known)
    if unknown:
        raise SpecError(where, unknown[0], f"unknown key (known: {', '.join(sorted(known))})")
    return dict(data)


# ---------------------------------------------------------------- assembler

class _Label:
    """A position in the program; placed once, targeted by any number of jumps."""

    __slots__ = ()


@dataclass
class _Insn:
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


# ---------------------------------------------------------------- compiler

@dataclass(frozen=True)
class _Block:
    """What one syscall number runs: its argument rules, then `word`."""

    word: int
    rules: tuple[ArgRule, ...] = ()


def _default_word(policy: Seccomp) -> int:
    return {"allow": SECCOMP_RET_ALLOW, "kill": SECCOMP_RET_KILL_PROCESS}.get(
        policy.default, SECCOMP_RET_ERRNO | policy.errno)


def _x32_word(policy: Seccomp) -> int:
    return SECCOMP_RET_KILL_PROCESS if policy.default == "kill" else SECCOMP_RET_ERRNO | _errno.ENOSYS


def _blocks(policy: Seccomp) -> dict[int, _Block]:
    """The syscall numbers whose handling differs from the default, and their blocks."""
    nums = syscalls.table()
    words: dict[int, int] = {nums[n]: SECCOMP_RET_ALLOW for n in policy.allow}
    errnos = policy.errno_map
    for name in (*policy.deny, *errnos):
        words[nums[name]] = SECCOMP_RET_ERRNO | errnos.get(name, policy.errno)
    rules: dict[int, list[ArgRule]] = {}
    for rule in policy.rules:
        rules.setdefault(nums[rule.syscall], []).append(rule)
    default = _default_word(policy)
    out = {nr: _Block(words.get(nr, default), tuple(rules.get(nr, ()))) for nr in {*words, *rules}}
    return {nr: b for nr, b in out.items() if b.rules or b.word != default}


def _intervals(policy: Seccomp) -> list[tuple[int, _Block]]:
    """[(start, block)] covering 0..2**32-1: each start up to the next one runs `block`."""
    blocks = _blocks(policy)
    default = _Block(_default_word(policy))
    out: list[tuple[int, _Block]] = []

    def add(start: int, block: _Block) -> None:
        if out and out[-1][0] == start:
            out.pop()
        if not (out and out[-1][1] == block):
            out.append((start, block))

    add(0, default)
    for nr in sorted(blocks):
        add(nr, blocks[nr])
        if nr + 1 not in blocks:
            add(nr + 1, default)
    add(syscalls.X32_SYSCALL_BIT, _Block(_x32_word(policy)))
    return out


def _emit_header(asm: _Asm) -> None:
    """Kill unless the native arch; leave the syscall number in A."""
    native = _Label()
    asm.ld(OFF_ARCH)
    asm.jump(BPF_JEQ, syscalls.arch(), native, asm.ret_label(SECCOMP_RET_KILL_PROCESS))
    asm.place(native)
    asm.ld(OFF_NR)


def _weights(intervals: list[tuple[int, _Block]]) -> list[int]:
    """1 + how many syscall numbers the kernel knows fall in each interval.

    At install the kernel walks the filter once per syscall number, so wide
    intervals (long runs of allowed syscalls) are placed nearer the root.
    """
    horizon = max(syscalls.table().values()) + 1
    ends = [start for start, _ in intervals[1:]] + [1 << 32]
    return [1 + max(0, min(end, horizon) - start) for (start, _), end in zip(intervals, ends, strict=True)]


def _split(prefix: list[int], lo: int, hi: int) -> int:
    """The index mid in lo+1..hi that best balances the weights of lo..mid-1 and mid..hi."""
    total = prefix[hi + 1] - prefix[lo]
    return min(range(lo + 1, hi + 1), key=lambda mid: abs(2 * (prefix[mid] - prefix[lo]) - total))


def _emit_range(asm: _Asm, intervals: list[tuple[int, _Block]], prefix: list[int], lo: int, hi: int,
                policy: Seccomp) -> _Label:
    """Code dispatching nr (in A, known to lie in intervals lo..hi); return where it starts.

    An interval without rules is just the shared RET of its action; the others
    are emitted here, left subtree first so that it follows its jge directly.
    """
    if lo == hi and not intervals[lo][1].rules:
        return asm.ret_label(intervals[lo][1].word)
    start = _Label()
    asm.place(start)
    if lo == hi:
        _emit_block(asm, intervals[lo][1], policy)
        return start
    mid = _split(prefix, lo, hi)
    node = asm.jump(BPF_JGE, intervals[mid][0], start, start)
    node.jf = _emit_range(asm, intervals, prefix, lo, mid - 1, policy)
    node.jt = _emit_range(asm, intervals, prefix, mid, hi, policy)
    return start


def _emit_block(asm: _Asm, block: _Block, policy: Seccomp) -> None:
    """The rules of one syscall (first match wins), falling through to its base action."""
    held: int | None = None  # the seccomp_data offset A surely holds on the miss path
    for i, rule in enumerate(block.rules):
        last = i == len(block.rules) - 1
        miss = asm.ret_label(block.word) if last else _Label()
        held = _emit_check(asm, rule, asm.ret_label(rule.word(policy.errno)), miss, held)
        if not last:
            asm.place(miss)


def _rule_parts(rule: ArgRule) -> list[tuple[int, int | None, int]]:
    """(offset, mask or None, value) per 32-bit half to test, low half first."""
    lo = OFF_ARGS + 8 * rule.arg_index
    halves = [(lo, 0)] if rule.bits == 32 else [(lo, 0), (lo + 4, 32)]
    value, mask = rule.value, rule.mask
    parts: list[tuple[int, int | None, int]] = []
    for off, shift in halves:
        v = (value >> shift) & 0xFFFFFFFF
        m = None if mask is None else (mask >> shift) & 0xFFFFFFFF
        if (rule.op == "has_bits" and v == 0) or m == 0:
            continue  # a half that cannot decide the outcome
        parts.append((off, None if m == 0xFFFFFFFF else m, v))
    return parts


def _emit_check(asm: _Asm, rule: ArgRule, match: _Label, miss: _Label, held: int | None) -> int | None:
    """Test one rule; return the offset A holds when it goes to `miss`, if only one can."""
    parts = _rule_parts(rule)
    if rule.op == "has_bits":
        _emit_any_bits(asm, parts, match, miss, held)
    elif rule.op == "ne":
        _emit_all_equal(asm, parts, miss, match, held)
    else:
        _emit_all_equal(asm, parts, match, miss, held)
    single = len(parts) == 1 and parts[0][1] is None
    return parts[0][0] if single else None


def _load(asm: _Asm, offset: int, held: int | None) -> None:
    if offset != held:
        asm.ld(offset)


def _emit_all_equal(asm: _Asm, parts: list[tuple[int, int | None, int]], yes: _Label, no: _Label,
                    held: int | None) -> None:
    """Go to `yes` if every (masked) half equals its value, else to `no`."""
    for i, (off, mask, value) in enumerate(parts):
        nxt = yes if i == len(parts) - 1 else _Label()
        _load(asm, off, held if i == 0 else None)
        if mask is not None:
            asm.and_(mask)
        asm.jump(BPF_JEQ, value, nxt, no)
        if nxt is not yes:
            asm.place(nxt)


def _emit_any_bits(asm: _Asm, parts: list[tuple[int, int | None, int]], yes: _Label, no: _Label,
                   held: int | None) -> None:
    """Go to `yes` if any half has any of its bits set, else to `no`."""
    for i, (off, _mask, value) in enumerate(parts):
        nxt = no if i == len(parts) - 1 else _Label()
        _load(asm, off, held if i == 0 else None)
        asm.jump(BPF_JSET, value, yes, nxt)
        if nxt is not no:
            asm.place(nxt)


def _finish(asm: _Asm) -> bytes:
    prog = asm.assemble()
    if len(prog) // 8 > BPF_MAXINSNS:
        raise SpecError("seccomp", f"<{len(prog) // 8} instructions>",
                        f"the policy compiles to more than the kernel's {BPF_MAXINSNS} BPF instructions")
    check_program(prog)
    return prog


@functools.lru_cache(maxsize=128)
def compile_policy(policy: Seccomp) -> bytes:
    """The classic-BPF program (bytes of `struct sock_filter[]`) enforcing `policy`.

    Results are cached by policy content: equal policies return the same bytes object.
    A `raw` policy returns its program unchanged.
    """
    if policy.raw is not None:
        return policy.raw
    asm = _Asm()
    _emit_header(asm)
    intervals = _intervals(policy)
    prefix = list(itertools.accumulate(_weights(intervals), initial=0))
    root = _emit_range(asm, intervals, prefix, 0, len(intervals) - 1, policy)
    if root in asm.rets.values():  # one action for every number: nothing to dispatch
        asm.ret(next(w for w, label in asm.rets.items() if label is root))
    return _finish(asm)


def compile_linear(policy: Seccomp) -> bytes:
    """The same policy as a naive linear chain of `jeq nr` tests, one per listed syscall.

    Same verdicts as `compile_policy`; exists to measure what the tree saves.
    """
    if policy.raw is not None:
        return policy.raw
    asm = _Asm()
    _emit_header(asm)
    native = _Label()
    asm.jump(BPF_JGE, syscalls.X32_SYSCALL_BIT, asm.ret_label(_x32_word(policy)), native)
    asm.place(native)
    for nr, block in sorted(_blocks(policy).items()):
        nxt = _Label()
        if block.rules:
            body = _Label()
            asm.jump(BPF_JEQ, nr, body, nxt)
            asm.place(body)
            _emit_block(asm, block, policy)
        else:
            asm.jump(BPF_JEQ, nr, asm.ret_label(block.word), nxt)
        asm.place(nxt)
    asm.ret(_default_word(policy))
    return _finish(asm)


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
    return _run(_insns(prog), seccomp_data(nr, args, arch))[0]


def path_length(prog: bytes, nr: int, args: Iterable[int] = (0,) * 6,
                arch: int = syscalls.AUDIT_ARCH_X86_64) -> int:
    """How many instructions `prog` executes for one syscall."""
    return _run(_insns(prog), seccomp_data(nr, args, arch))[1]


def max_path_length(prog: bytes) -> int:
    """The most instructions any path through `prog` executes (jumps go forward only)."""
    insns = _insns(prog)
    longest = [0] * len(insns)
    for pc in range(len(insns) - 1, -1, -1):
        longest[pc] = 1 + max((longest[s] for s in _successors(pc, insns[pc])), default=0)
    return longest[0]


def _run(insns: list[tuple[int, int, int, int]], data: bytes) -> tuple[int, int]:
    """Interpret; return (action word, instructions executed)."""
    regs = {"A": 0, "X": 0}
    mem = [0] * BPF_MEMWORDS
    pc = steps = 0
    while True:
        if pc >= len(insns):
            raise ValueError("ran off the end of the program")
        code, jt, jf, k = insns[pc]
        steps += 1
        cls = code & 0x07
        if cls == BPF_RET:
            return (regs["A"] if code & 0x18 == BPF_A else k), steps
        if cls == BPF_JMP:
            pc += 1 + _jump(code, jt, jf, k, regs)
            continue
        if cls == BPF_ALU:
            if not _alu(code, k, regs):
                return 0, steps  # division by zero at run time: the kernel returns 0
        else:
            _load_store(code, k, regs, mem, data)
        pc += 1


def _jump(code: int, jt: int, jf: int, k: int, regs: dict[str, int]) -> int:
    op = code & 0xF0
    if op == BPF_JA:
        return k
    src = regs["X"] if code & BPF_X else k
    a = regs["A"]
    taken = {BPF_JEQ: a == src, BPF_JGT: a > src, BPF_JGE: a >= src, BPF_JSET: bool(a & src)}[op]
    return jt if taken else jf


def _alu(code: int, k: int, regs: dict[str, int]) -> bool:
    op, a = code & 0xF0, regs["A"]
    src = regs["X"] if code & BPF_X else k
    if op in (BPF_DIV, BPF_MOD) and src == 0:
        return False
    result = {
        BPF_ADD: lambda: a + src, BPF_SUB: lambda: a - src, BPF_MUL: lambda: a * src,
        BPF_DIV: lambda: a // src, BPF_MOD: lambda: a % src, BPF_OR: lambda: a | src,
        BPF_AND: lambda: a & src, BPF_XOR: lambda: a ^ src, BPF_NEG: lambda: -a,
        BPF_LSH: lambda: a << (src & 31), BPF_RSH: lambda: a >> (src & 31),
    }[op]()
    regs["A"] = result & 0xFFFFFFFF
    return True


def _load_store(code: int, k: int, regs: dict[str, int], mem: list[int], data: bytes) -> None:
    cls = code & 0x07
    if cls == BPF_MISC:
        if code & 0xF8 == BPF_TXA:
            regs["A"] = regs["X"]
        else:
            regs["X"] = regs["A"]
        return
    if cls in (BPF_ST, BPF_STX):
        mem[k] = regs["A" if cls == BPF_ST else "X"]
        return
    mode = code & 0xE0
    value = {
        BPF_ABS: lambda: int.from_bytes(data[k:k + 4], "little"),
        BPF_LEN: lambda: len(data),
        BPF_IMM: lambda: k,
        BPF_MEM: lambda: mem[k],
    }[mode]()
    regs["A" if cls == BPF_LD else "X"] = value


# ---------------------------------------------------------------- disassembler

_RET_NAMES = {
    SECCOMP_RET_KILL_PROCESS: "KILL_PROCESS", SECCOMP_RET_KILL_THREAD: "KILL_THREAD",
    SECCOMP_RET_TRAP: "TRAP", SECCOMP_RET_ERRNO: "ERRNO", SECCOMP_RET_USER_NOTIF: "USER_NOTIF",
    SECCOMP_RET_TRACE: "TRACE", SECCOMP_RET_LOG: "LOG", SECCOMP_RET_ALLOW: "ALLOW",
}
_ALU_NAMES = {BPF_ADD: "add", BPF_SUB: "sub", BPF_MUL: "mul", BPF_DIV: "div", BPF_OR: "or", BPF_AND: "and",
              BPF_LSH: "lsh", BPF_RSH: "rsh", BPF_NEG: "neg", BPF_MOD: "mod", BPF_XOR: "xor"}
_JMP_NAMES = {BPF_JA: "ja", BPF_JEQ: "jeq", BPF_JGT: "jgt", BPF_JGE: "jge", BPF_JSET: "jset"}


def describe_action(word: int) -> str:
    """'ALLOW', 'KILL_PROCESS', 'ERRNO(EPERM)', ... for a SECCOMP_RET_* word."""
    action, data = word & SECCOMP_RET_ACTION_FULL, word & SECCOMP_RET_DATA
    name = _RET_NAMES.get(action, f"{action:#x}")
    if action == SECCOMP_RET_ERRNO:
        return f"ERRNO({_errno.errorcode.get(data, data)})"
    return f"{name}({data})" if data else name


def _field_name(offset: int) -> str:
    if offset == OFF_NR:
        return "nr"
    if offset == OFF_ARCH:
        return "arch"
    if offset < OFF_ARGS:
        return "instruction_pointer " + ("lo" if offset == 8 else "hi")
    i, half = divmod(offset - OFF_ARGS, 8)
    return f"args[{i}] " + ("lo" if half == 0 else "hi")


def _register_sources(insns: list[tuple[int, int, int, int]]) -> list[str | None]:
    """For each instruction, which seccomp_data field A surely holds on entry (or None)."""
    unset = object()
    state: list[object] = [unset] * len(insns)
    state[0] = None
    for pc, insn in enumerate(insns):
        code, k = insn[0], insn[3]
        held = state[pc] if state[pc] is not unset else None
        if code & 0x07 == BPF_LD:
            held = _field_name(k) if code == BPF_LD | BPF_W | BPF_ABS else None
        elif code & 0x07 in (BPF_ALU, BPF_MISC):
            held = None
        for nxt in _successors(pc, insn):
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
    if cls == BPF_RET:
        text = "ret  A" if code & 0x18 == BPF_A else f"ret  #{k:#x}"
        comment = "" if code & 0x18 == BPF_A else describe_action(k)
    elif code == BPF_JMP | BPF_JA:
        text = f"ja   {pc + 1 + k:04d}"
    elif cls == BPF_JMP:
        src = "x" if code & BPF_X else f"#{k:#x}"
        text = f"{_JMP_NAMES[op]:<4} {src:<12} jt {pc + 1 + jt:04d}  jf {pc + 1 + jf:04d}"
        comment = "" if code & BPF_X else _jump_comment(held, k)
    elif cls == BPF_ALU:
        text = "neg" if op == BPF_NEG else f"{_ALU_NAMES[op]:<4} " + ("x" if code & BPF_X else f"#{k:#x}")
    elif cls == BPF_MISC:
        text = "txa" if code & 0xF8 == BPF_TXA else "tax"
    elif cls in (BPF_ST, BPF_STX):
        text = f"{'st' if cls == BPF_ST else 'stx':<4} M[{k}]"
    else:
        text, comment = _disasm_load(code, k)
    return f"{pc:04d}: {text:<40}" + (f" ; {comment}" if comment else "")


def _disasm_load(code: int, k: int) -> tuple[str, str]:
    reg = "ld" if code & 0x07 == BPF_LD else "ldx"
    mode = code & 0xE0
    if mode == BPF_ABS:
        return f"{reg:<4} [{k}]", _field_name(k)
    if mode == BPF_LEN:
        return f"{reg:<4} #len", ""
    if mode == BPF_MEM:
        return f"{reg:<4} M[{k}]", ""
    return f"{reg:<4} #{k:#x}", ""


def disassemble(prog: bytes) -> list[str]:
    """One readable line per instruction, with jump targets as absolute indexes.

    Comments name the seccomp_data field a load reads, the syscall a number test
    compares with, and the action a RET returns.
    """
    insns = _insns(prog)
    held = _register_sources(insns)
    return [_disasm_one(pc, insn, held[pc]) for pc, insn in enumerate(insns)]


# ---------------------------------------------------------------- the default policy

_ENOSYS_FALLBACK = ("clone3", "fsopen", "fsconfig", "fsmount", "fspick", "open_tree", "move_mount",
                    "mount_setattr")
_ROOT_ONLY = "needs a capability in the initial user namespace, which a sandbox never holds; denied outright"
_MOUNT_API = ("the new mount API: recent, large code reachable from a user namespace (fsconfig's heap "
              "overflow CVE-2022-0185 was); ENOSYS, as on an older kernel, so libmount and systemd fall back "
              "to mount(2), which stays subject to capabilities")
_KEYS = ("kernel keyrings are not namespaced: the sandbox could read or plant keys of the caller's user; "
         "long history of kernel bugs")
_IO_URING = ("io_uring performs file and network operations that are not syscalls, so no seccomp rule "
             "sees them, and it has been the largest single source of kernel privilege escalations; EPERM "
             "as with kernel.io_uring_disabled=2, callers fall back to plain syscalls")

DEFAULT_POLICY_REASONS: dict[str, str] = {
    "keyctl": _KEYS,
    "add_key": _KEYS,
    "request_key": _KEYS,
    "bpf": "eBPF programs and maps are a large kernel attack surface; unprivileged use is meant to be off",
    "perf_event_open": "performance counters leak timing and kernel addresses and have a history of "
                       "privilege-escalation bugs",
    "userfaultfd": "lets a process stall the kernel at a page fault of its choosing: the usual way to win "
                   "races in kernel exploits",
    "io_uring_setup": _IO_URING,
    "io_uring_enter": _IO_URING,
    "io_uring_register": _IO_URING,
    "kexec_load": "loads a new kernel; " + _ROOT_ONLY,
    "kexec_file_load": "loads a new kernel; " + _ROOT_ONLY,
    "init_module": "loads a kernel module; " + _ROOT_ONLY,
    "finit_module": "loads a kernel module; " + _ROOT_ONLY,
    "delete_module": "unloads a kernel module; " + _ROOT_ONLY,
    "open_by_handle_at": "opens any inode of a filesystem from a file handle, bypassing the mount tree "
                         "(the 'shocker' container escape)",
    "fsopen": _MOUNT_API,
    "fsconfig": _MOUNT_API,
    "fsmount": _MOUNT_API,
    "fspick": _MOUNT_API,
    "open_tree": _MOUNT_API,
    "move_mount": _MOUNT_API,
    "mount_setattr": _MOUNT_API,
    "clone3": "its flags sit in a struct seccomp cannot read, so CLONE_NEWUSER could not be filtered; "
              "ENOSYS makes glibc fall back to clone(2), which is filtered",
    "clone": "denied only when the flags include CLONE_NEWUSER: a new user namespace grants a full capability "
             "set over fresh namespaces, the door to most unprivileged kernel exploits; fork and threads work",
    "unshare": "denied only when the flags include CLONE_NEWUSER (see clone); other namespace flags are left "
               "to capabilities",
    "personality": "only PER_LINUX (0) and the query 0xffffffff pass: other personas switch off ASLR "
                   "(ADDR_NO_RANDOMIZE), make data executable (READ_IMPLIES_EXEC) or pick legacy code paths",
    "ioctl": "TIOCSTI (0x5412) and TIOCLINUX (0x541c) are denied, compared on the low 32 bits as the kernel "
             "reads the request (CVE-2019-10063's high-bit bypass): they type into, or control, a terminal "
             "shared with the outside; every other ioctl passes",
    "acct": "process accounting writes host-wide records; " + _ROOT_ONLY,
    "swapon": "host-wide swap configuration; " + _ROOT_ONLY,
    "swapoff": "host-wide swap configuration; " + _ROOT_ONLY,
    "reboot": "reboots the host, or with CAP_SYS_BOOT in the sandbox kills its pid namespace",
    "syslog": "reads the kernel log, which leaks kernel addresses when kernel.dmesg_restrict is 0",
    "settimeofday": "sets the host clock (time is not namespaced); " + _ROOT_ONLY,
    "clock_settime": "sets the host clock (time is not namespaced); " + _ROOT_ONLY,
    "iopl": "raw I/O port access; " + _ROOT_ONLY,
    "ioperm": "raw I/O port access; " + _ROOT_ONLY,
    "lookup_dcookie": "obsolete oprofile interface",
    "quotactl": "disk quota administration of host filesystems",
    "quotactl_fd": "disk quota administration of host filesystems",
    "nfsservctl": "removed kernel NFS server interface",
    "vhangup": "hangs up the controlling terminal, which may be shared with the outside",
    "uselib": "obsolete a.out library loader with a history of bugs",
}

_SANDBOX_PIDS = ("with the default pid namespace the sandbox addresses only its own processes, none of which "
                 "shares memory with the outside, so debuggers and strace work; with namespaces.pid=False it "
                 "could reach the caller's other same-uid processes, as kill(2) could")
_MOUNTS = ("fails with EPERM without CAP_SYS_ADMIN in the sandbox's user namespace; with cap_add it acts on "
           "the sandbox's own mount namespace only (including its own read-only binds: that is what the "
           "capability means), never on the caller's")

DEFAULT_POLICY_ALLOWED: dict[str, str] = {
    "ptrace": _SANDBOX_PIDS,
    "process_vm_readv": _SANDBOX_PIDS,
    "process_vm_writev": _SANDBOX_PIDS,
    "pidfd_getfd": _SANDBOX_PIDS,
    "kcmp": _SANDBOX_PIDS,
    "mount": _MOUNTS,
    "umount2": _MOUNTS,
    "pivot_root": _MOUNTS,
    "chroot": "needs CAP_SYS_CHROOT in the sandbox's user namespace and cannot reach above the sandbox's root",
    "setns": "joining a namespace needs CAP_SYS_ADMIN over it, which the sandbox never has over the "
             "caller's namespaces",
    "name_to_handle_at": "only encodes a handle for a path the caller can already open; using a handle "
                         "needs open_by_handle_at, which is denied",
    "adjtimex": "with modes 0 it only reads the clock state (ntp_gettime); setting the clock needs "
                "CAP_SYS_TIME in the initial user namespace",
    "clock_adjtime": "as adjtimex",
    "seccomp": "a process may stack filters of its own; filters only ever restrict",
}


def _default_policy() -> Seccomp:
    """The policy every sandbox gets unless its Spec says otherwise.

    It denies whatever reaches kernel code that is not namespaced or is widely
    exploited. The reasons are in DEFAULT_POLICY_REASONS. Errors are EPERM,
    except ENOSYS where callers have a fallback for a missing syscall (clone3,
    the new mount API). It leaves alone what capabilities already decide.
    mount, umount2, pivot_root and chroot stay allowed: with the capabilities
    dropped they fail anyway. A caller who adds CAP_SYS_ADMIN or
    CAP_SYS_CHROOT asked for them, and then they act only on the sandbox's
    own mount namespace. Denying them would just break that choice. The new
    mount API is denied even so. It is young code, it is reachable from a
    user namespace (CVE-2022-0185), and it has a clean ENOSYS fallback to
    mount(2). DEFAULT_POLICY_ALLOWED explains the other notable syscalls
    left allowed (ptrace, setns, ...).

    The filter belongs last in setup, right before execve. The sandbox's own
    unshare(CLONE_NEWUSER) and mounts come before it.
    """
    tiocs = (termios.TIOCSTI, termios.TIOCLINUX)
    rules = (
        *(ArgRule("ioctl", 1, "eq", req) for req in tiocs),
        ArgRule("clone", 0, "has_bits", CLONE_NEWUSER),
        ArgRule("unshare", 0, "has_bits", CLONE_NEWUSER),
        ArgRule("personality", 0, "eq", 0, action="allow"),
        ArgRule("personality", 0, "eq", 0xFFFFFFFF, action="allow"),
    )
    conditional = {r.syscall for r in rules} - {"personality"}
    deny = tuple(n for n in DEFAULT_POLICY_REASONS if n not in conditional)
    return Seccomp(deny=deny, rules=rules, errnos={n: _errno.ENOSYS for n in _ENOSYS_FALLBACK})


DEFAULT_POLICY: Seccomp = _default_policy()


def policy_table(policy: Seccomp = DEFAULT_POLICY) -> list[tuple[str, str]]:
    """(syscall, effect) for every syscall a policy treats specially, sorted by name.

    e.g. ("ioctl", "ERRNO(EPERM) if args[1] == 0x5412 (low 32 bits); ...; else ALLOW").
    Pair with DEFAULT_POLICY_REASONS / DEFAULT_POLICY_ALLOWED to print the README table.
    """
    nums = syscalls.table()
    blocks = _blocks(policy)
    rows = []
    for name in sorted(n for n in nums if nums[n] in blocks):
        block = blocks[nums[name]]
        parts = [r.describe(policy.errno) for r in block.rules]
        base = describe_action(block.word)
        rows.append((name, "; ".join([*parts, f"else {base}"]) if parts else base))
    return rows
