"""Seccomp policies as validated data: `Seccomp` (deny/allow lists, errnos, a raw
program) and `ArgRule` (an argument comparison), with their JSON forms.

Construction validates and normalizes every field and raises SpecError
naming it; sandbox.seccomp.compile turns a policy into BPF. Syscall names
come from the installed kernel headers (sandbox.syscalls): a syscall newer
than those headers cannot be named.
"""

from __future__ import annotations

import dataclasses
import errno as _errno
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, get_args

from .. import syscalls
from ..errors import SpecError
from ..validate import check_items, init_fields, json_object, replaced
from .bpf import SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO, SECCOMP_RET_KILL_PROCESS, check_program
from .debug import describe_action

MAX_ERRNO = 4095
_T = TypeVar("_T")

#: What a syscall (its default, its entry or an argument rule) gets: "allow" it,
#: fail it with an "errno", or "kill" the process (SECCOMP_RET_KILL_PROCESS).
Action = Literal["allow", "errno", "kill"]
_ACTIONS: tuple[str, ...] = get_args(Action)
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
    value = check_items(where, value, "syscall names")
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
    what = "must be a mapping of syscall names to errno values"
    if isinstance(value, Mapping):
        items = list(value.items())
    else:
        pairs = check_items(where, value, "(syscall name, errno) pairs, or a mapping")
        if not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in pairs):
            raise SpecError(where, value, what)
        items = [tuple(p) for p in pairs]
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

@dataclass(frozen=True, init=False)
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
    action: Action = "errno"
    errno: int | None = None
    width: int | None = None

    def __init__(self, syscall: str, arg_index: int, op: str, value: int, mask: int | None = None,
                 action: Action = "errno", errno: int | str | None = None, width: int | None = None) -> None:
        init_fields(self, syscall=syscall, arg_index=arg_index, op=op, value=value, mask=mask, action=action,
                    errno=errno, width=width)

    def __post_init__(self) -> None:
        self.validate("rule")

    def validate(self, where: str) -> None:
        """Check and normalize the fields; raise SpecError naming `where`.field."""
        _syscall_names(f"{where}.syscall", [self.syscall])
        idx = self.arg_index
        if isinstance(idx, bool) or not isinstance(idx, int) or not 0 <= idx <= 5:
            raise SpecError(f"{where}.arg_index", idx, "must be 0..5")
        if not isinstance(self.op, str) or self.op not in OPS:
            raise SpecError(f"{where}.op", self.op, f"must be one of {', '.join(OPS)}")
        if not isinstance(self.action, str) or self.action not in _ACTIONS:
            raise SpecError(f"{where}.action", self.action, f"must be one of {', '.join(_ACTIONS)}")
        if self.errno is not None:
            object.__setattr__(self, "errno", check_errno(f"{where}.errno", self.errno))
        if self.width is not None and (isinstance(self.width, bool) or self.width not in (32, 64)):
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
        body = json_object(where, data, {f.name for f in dataclasses.fields(cls)})
        return _construct(cls, body, "rule", where)


@dataclass(frozen=True, init=False)
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
    default: Action = "allow"
    errno: int = _errno.EPERM
    rules: tuple[ArgRule, ...] = ()
    raw: bytes | None = None
    errnos: tuple[tuple[str, int], ...] = ()

    def __init__(self, deny: Iterable[str] = (), allow: Iterable[str] = (), default: Action = "allow",
                 errno: int | str = _errno.EPERM, rules: Sequence[ArgRule] = (),
                 raw: bytes | bytearray | memoryview | None = None,
                 errnos: Mapping[str, int | str] | Sequence[tuple[str, int | str]] = ()) -> None:
        init_fields(self, deny=deny, allow=allow, default=default, errno=errno, rules=rules, raw=raw, errnos=errnos)

    def __post_init__(self) -> None:
        self.validate("seccomp")

    def validate(self, where: str) -> None:
        """Check and normalize the fields; raise SpecError naming `where`.field."""
        set_ = object.__setattr__
        set_(self, "deny", _syscall_names(f"{where}.deny", self.deny))
        set_(self, "allow", _syscall_names(f"{where}.allow", self.allow))
        if not isinstance(self.default, str) or self.default not in _ACTIONS:
            raise SpecError(f"{where}.default", self.default, f"must be one of {', '.join(_ACTIONS)}")
        set_(self, "errno", check_errno(f"{where}.errno", self.errno))
        set_(self, "errnos", _errno_pairs(f"{where}.errnos", self.errnos))
        set_(self, "rules", self._checked_rules(where))
        self._check_raw(where)
        self._check_conflicts(where)

    def _checked_rules(self, where: str) -> tuple[ArgRule, ...]:
        if isinstance(self.rules, (str, bytes)) or not isinstance(self.rules, Sequence):
            raise SpecError(f"{where}.rules", self.rules, "must be a list of ArgRule, in order")
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
        return replaced(self, "seccomp", changes)

    def extend(self, deny: Iterable[str] = (), rules: Iterable[ArgRule] = (),
               errnos: Mapping[str, int | str] | None = None) -> Seccomp:
        """A copy that also denies `deny`, runs `rules` after its own and adds `errnos`."""
        more = {} if errnos is None else dict(_errno_pairs("errnos", errnos))
        return self.replace(deny=(*self.deny, *check_items("deny", deny, "syscall names")),
                            rules=(*self.rules, *check_items("rules", rules, "ArgRule")),
                            errnos={**self.errno_map, **more})

    # ------------------------------------------------------------ JSON

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; `Seccomp.from_dict` inverts it."""
        import base64  # only for the JSON form, here and in from_dict

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
        body = json_object(where, data, known)
        raw = body.pop("raw_base64", None)
        if raw is not None:
            import base64

            try:
                body["raw"] = base64.b64decode(raw, validate=True)
            except (ValueError, TypeError):
                raise SpecError(f"{where}.raw_base64", raw, "is not valid base64") from None
        if "rules" in body:
            if not isinstance(body["rules"], list):
                raise SpecError(f"{where}.rules", body["rules"], "must be a list")
            body["rules"] = tuple(ArgRule.from_dict(r, f"{where}.rules[{i}]") for i, r in enumerate(body["rules"]))
        return _construct(cls, body, "seccomp", where)


def _construct(cls: type[_T], body: dict[str, Any], own: str, where: str) -> _T:
    """`cls(**body)`, with SpecError fields renamed from `own`... to `where`..."""
    try:
        return cls(**body)
    except TypeError as exc:
        raise SpecError(where, body, f"missing a required key: {exc}") from None
    except SpecError as exc:
        field = where + exc.field[len(own):] if exc.field.startswith(own) else exc.field
        raise SpecError(field, exc.value, exc.problem) from None

