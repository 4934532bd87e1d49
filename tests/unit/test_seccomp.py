"""Unit tests of the seccomp policy compiler, run through the pure-Python BPF interpreter."""

from __future__ import annotations

import errno
import json
import math
import struct
from pathlib import Path

import pytest

from sandbox import seccomp as S
from sandbox import syscalls
from sandbox.errors import SpecError
from sandbox.seccomp.compile import _intervals
from sandbox.seccomp.default import _ENOSYS_FALLBACK

NR = syscalls.table()
ALLOW = S.SECCOMP_RET_ALLOW
KILL = S.SECCOMP_RET_KILL_PROCESS
EPERM = S.SECCOMP_RET_ERRNO | errno.EPERM
ENOSYS = S.SECCOMP_RET_ERRNO | errno.ENOSYS
TIOCSTI, TIOCLINUX, TCGETS = 0x5412, 0x541C, 0x5401
CLONE_NEWUSER, CLONE_NEWNS, SIGCHLD = 0x10000000, 0x00020000, 17
DEFAULT = S.compile_policy(S.DEFAULT_POLICY)


def verdict(prog: bytes, name: str, *args: int, arch: int = syscalls.AUDIT_ARCH_X86_64) -> int:
    return S.evaluate(prog, NR[name], args + (0,) * (6 - len(args)), arch)


# ---------------------------------------------------------------- reference semantics

def reference(policy: S.Seccomp, nr: int, args: tuple[int, ...], arch: int = syscalls.AUDIT_ARCH_X86_64) -> int:
    """The documented meaning of a policy, written without the compiler."""
    if arch != syscalls.AUDIT_ARCH_X86_64:
        return KILL
    if nr >= syscalls.X32_SYSCALL_BIT:
        return KILL if policy.default == "kill" else ENOSYS
    name = syscalls.name(nr)
    errnos = policy.errno_map
    if name in policy.allow:
        base = ALLOW
    elif name in policy.deny or name in errnos:
        base = S.SECCOMP_RET_ERRNO | errnos.get(name, policy.errno)
    else:
        base = {"allow": ALLOW, "kill": KILL, "errno": S.SECCOMP_RET_ERRNO | policy.errno}[policy.default]
    for rule in policy.rules:
        if rule.syscall == name and _matches(rule, args[rule.arg_index]):
            return rule.word(policy.errno)
    return base


def _matches(rule: S.ArgRule, arg: int) -> bool:
    a = arg & ((1 << rule.bits) - 1)
    if rule.op == "eq":
        return a == rule.value
    if rule.op == "ne":
        return a != rule.value
    if rule.op == "has_bits":
        return a & rule.value != 0
    assert rule.mask is not None
    return a & rule.mask == rule.value


ARG_SAMPLES: list[tuple[int, ...]] = [
    (0,) * 6,
    (0, TIOCSTI, 0, 0, 0, 0),
    (0, 0x1_0000_5412, 0, 0, 0, 0),
    (0, TIOCLINUX, 0, 0, 0, 0),
    (CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0, 0),
    (0xFFFFFFFF, 1, 2, 3, 4, 5),
    (0x0040000, 0, 0, 0, 0, 0),
    (2**64 - 1,) * 6,
    (0x1_0000_0000, 0x2_0000_0022, 0x22, 0x1_0000_0022, 0, 0),
]


def assert_same_as_reference(policy: S.Seccomp, prog: bytes) -> None:
    numbers = sorted(NR.values())
    extra = [numbers[-1] + 1, 999, syscalls.X32_SYSCALL_BIT, syscalls.X32_SYSCALL_BIT | NR["getpid"], 2**32 - 1]
    for nr in numbers + extra:
        for args in ARG_SAMPLES:
            got, want = S.evaluate(prog, nr, args), reference(policy, nr, args)
            assert got == want, (nr, syscalls.name(nr), args, S.describe_action(got), S.describe_action(want))


# ---------------------------------------------------------------- syscall table

def test_table_comes_from_the_headers() -> None:
    assert NR["read"] == 0 and NR["write"] == 1 and NR["exit_group"] == 231 and NR["clone3"] == 435
    from_cpp, from_file = syscalls._from_preprocessor(), syscalls._from_header_files()
    assert from_cpp and from_file and set(from_cpp) == set(from_file)
    assert dict(from_cpp) == NR
    assert len(NR) > 300


def test_table_is_a_fresh_copy_and_lookups_agree() -> None:
    syscalls.table()["read"] = 12345
    assert syscalls.table()["read"] == 0
    assert syscalls.number("ioctl") == 16 and syscalls.name(16) == "ioctl"
    assert syscalls.number("nosuchcall") is None and syscalls.name(99999) is None
    assert syscalls.unknown_names(["read", "bogus", "x"]) == ["bogus", "x"]


def test_abi_constants_and_arch() -> None:
    assert syscalls.AUDIT_ARCH_X86_64 == 0xC000003E
    assert syscalls.X32_SYSCALL_BIT == 0x40000000
    assert syscalls.arch() == syscalls.AUDIT_ARCH_X86_64


# ---------------------------------------------------------------- default policy

@pytest.mark.parametrize("name", [n for n in S.DEFAULT_POLICY.deny if n != "personality"])
def test_default_denies(name: str) -> None:
    want = ENOSYS if name in _ENOSYS_FALLBACK else EPERM
    assert verdict(DEFAULT, name) == want
    assert verdict(DEFAULT, name, 1, 2, 3, 4, 5, 6) == want


def test_default_errnos_for_fallback_callers() -> None:
    assert verdict(DEFAULT, "clone3") == ENOSYS
    for name in ("fsopen", "fsconfig", "fsmount", "fspick", "open_tree", "move_mount", "mount_setattr"):
        assert verdict(DEFAULT, name) == ENOSYS, name
    assert verdict(DEFAULT, "keyctl") == EPERM


@pytest.mark.parametrize("name", [
    "read", "write", "openat", "close", "mmap", "execve", "exit_group", "getpid", "wait4", "futex", "ptrace",
    "process_vm_readv", "mount", "umount2", "pivot_root", "chroot", "setns", "name_to_handle_at", "adjtimex",
    "seccomp", "prctl", "fork", "vfork", "socket", "rt_sigreturn", "set_mempolicy_home_node",
])
def test_default_allows(name: str) -> None:
    assert verdict(DEFAULT, name) == ALLOW
    assert verdict(DEFAULT, name, 2**64 - 1, 2**64 - 1) == ALLOW


def test_default_ioctl_terminal_injection_on_low_32_bits() -> None:
    for request in (TIOCSTI, TIOCLINUX, 0x1_0000_5412, 0xFFFF_FFFF_0000_5412, 0x1_0000_541C):
        assert verdict(DEFAULT, "ioctl", 0, request) == EPERM, hex(request)
    for request in (TCGETS, 0x5413, 0x5412_0000, 0x1_0000_5413):
        assert verdict(DEFAULT, "ioctl", 0, request) == ALLOW, hex(request)
    assert verdict(DEFAULT, "ioctl", TIOCSTI, TCGETS) == ALLOW  # the fd argument is not the request


def test_default_clone_and_unshare_new_user_namespace() -> None:
    assert verdict(DEFAULT, "clone", SIGCHLD) == ALLOW
    assert verdict(DEFAULT, "clone", 0x003D0F00) == ALLOW  # pthread_create's flags
    assert verdict(DEFAULT, "clone", CLONE_NEWUSER | SIGCHLD) == EPERM
    assert verdict(DEFAULT, "clone", CLONE_NEWUSER | CLONE_NEWNS | (1 << 40)) == EPERM
    assert verdict(DEFAULT, "clone", CLONE_NEWNS | SIGCHLD) == ALLOW  # left to capabilities
    assert verdict(DEFAULT, "unshare", CLONE_NEWUSER) == EPERM
    assert verdict(DEFAULT, "unshare", CLONE_NEWUSER | CLONE_NEWNS) == EPERM
    assert verdict(DEFAULT, "unshare", CLONE_NEWNS) == ALLOW
    assert verdict(DEFAULT, "clone3", 0, 88) == ENOSYS


def test_default_personality() -> None:
    assert verdict(DEFAULT, "personality", 0) == ALLOW
    assert verdict(DEFAULT, "personality", 0xFFFFFFFF) == ALLOW
    assert verdict(DEFAULT, "personality", 2**64 - 1) == ALLOW  # the kernel reads an unsigned int
    for persona in (0x0040000, 0x0400000, 0x0008, 1):  # ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC, PER_LINUX32
        assert verdict(DEFAULT, "personality", persona) == EPERM, hex(persona)


def test_x32_abi_refused() -> None:
    for name in ("getpid", "read", "keyctl", "ioctl"):
        assert S.evaluate(DEFAULT, syscalls.X32_SYSCALL_BIT | NR[name]) == ENOSYS
    assert S.evaluate(DEFAULT, 2**32 - 1) == ENOSYS  # syscall(-1)
    kill_list = S.compile_policy(S.Seccomp(allow=("getpid",), default="kill"))
    assert S.evaluate(kill_list, syscalls.X32_SYSCALL_BIT | NR["getpid"]) == KILL


@pytest.mark.parametrize("arch", [syscalls.AUDIT_ARCH_I386, 0, 0x40000028, syscalls.AUDIT_ARCH_X86_64 ^ 1])
def test_foreign_arch_killed(arch: int) -> None:
    for name in ("getpid", "read", "exit_group"):
        assert verdict(DEFAULT, name, arch=arch) == KILL


def test_default_matches_reference_everywhere() -> None:
    assert_same_as_reference(S.DEFAULT_POLICY, DEFAULT)
    assert_same_as_reference(S.DEFAULT_POLICY, S.compile_linear(S.DEFAULT_POLICY))


def test_reasons_cover_exactly_the_special_syscalls() -> None:
    special = {name for name, _ in S.policy_table()}
    assert special == set(S.DEFAULT_POLICY_REASONS)
    assert all(len(reason) > 20 for reason in S.DEFAULT_POLICY_REASONS.values())
    assert not special & set(S.DEFAULT_POLICY_ALLOWED)
    for name in S.DEFAULT_POLICY_ALLOWED:
        assert verdict(DEFAULT, name) == ALLOW, name


def test_policy_table_describes_effects() -> None:
    rows = dict(S.policy_table())
    assert rows["keyctl"] == "ERRNO(EPERM)"
    assert rows["clone3"] == "ERRNO(ENOSYS)"
    assert rows["ioctl"].startswith("ERRNO(EPERM) if args[1] == 0x5412 (low 32 bits);")
    assert rows["ioctl"].endswith("else ALLOW")
    assert rows["personality"].endswith("else ERRNO(EPERM)")


def hardening_page() -> str:
    """docs/hardening.md of the source tree, beside the tests (run-tests.sh stages docs/ with tests/)."""
    page = Path(__file__).resolve().parents[2] / "docs" / "hardening.md"
    if not page.is_file():
        pytest.skip(f"{page} is not beside the tests (a copy of tests/ alone)")
    return page.read_text()


def default_policy_rows() -> list[str]:
    """docs/hardening.md's two default-policy tables, body rows only, as policy_table() and the reasons give them:
    consecutive syscalls with the same effect and reason share a row."""
    effects = dict(S.policy_table())

    def errno_column(name: str) -> str:
        effect = effects[name]
        return "EPERM for the arguments named" if " if " in effect else effect.removeprefix("ERRNO(").rstrip(")")

    def grouped(keys: list[tuple[str, tuple[str, ...]]]) -> list[str]:
        rows: list[tuple[list[str], tuple[str, ...]]] = []
        for name, cells in keys:
            if rows and rows[-1][1] == cells:
                rows[-1][0].append(name)
            else:
                rows.append(([name], cells))
        return ["| " + " | ".join([", ".join(f"`{n}`" for n in names), *cells]) + " |" for names, cells in rows]

    denied = [(n, (errno_column(n), why)) for n, why in S.DEFAULT_POLICY_REASONS.items()]
    allowed = [(n, (why,)) for n, why in S.DEFAULT_POLICY_ALLOWED.items()]
    return grouped(denied) + grouped(allowed)


def test_readme_table_matches_the_default_policy() -> None:
    section = hardening_page().split("## The default policy", 1)[1].split("\n## ", 1)[0]
    documented = [line for line in section.splitlines() if line.startswith("| `")]
    expected = default_policy_rows()
    assert documented == expected, "docs/hardening.md's default-policy table should read:\n" + "\n".join(expected)


# ---------------------------------------------------------------- other policies

def test_denylist_with_errno_and_overrides() -> None:
    policy = S.Seccomp(deny=("ptrace", "kill"), errno="EACCES", errnos={"getcwd": errno.ENOENT})
    prog = S.compile_policy(policy)
    assert verdict(prog, "ptrace") == S.SECCOMP_RET_ERRNO | errno.EACCES
    assert verdict(prog, "getcwd") == S.SECCOMP_RET_ERRNO | errno.ENOENT
    assert verdict(prog, "getpid") == ALLOW
    assert policy.errno == errno.EACCES
    assert_same_as_reference(policy, prog)


def test_allowlist_errno_and_kill() -> None:
    allow = ("read", "write", "exit_group", "ioctl")
    rules = (S.ArgRule("ioctl", 1, "eq", TIOCSTI),)
    errno_list = S.Seccomp(allow=allow, default="errno", errno=errno.EACCES, rules=rules,
                           deny=("ptrace",), errnos={"clone3": "ENOSYS"})
    prog = S.compile_policy(errno_list)
    assert verdict(prog, "read") == ALLOW
    assert verdict(prog, "openat") == S.SECCOMP_RET_ERRNO | errno.EACCES
    assert verdict(prog, "ptrace") == S.SECCOMP_RET_ERRNO | errno.EACCES
    assert verdict(prog, "clone3") == ENOSYS
    assert verdict(prog, "ioctl", 0, TIOCSTI) == S.SECCOMP_RET_ERRNO | errno.EACCES
    assert verdict(prog, "ioctl", 0, TCGETS) == ALLOW
    assert_same_as_reference(errno_list, prog)
    kill_list = errno_list.replace(default="kill")
    prog = S.compile_policy(kill_list)
    assert verdict(prog, "openat") == KILL
    assert verdict(prog, "ptrace") == S.SECCOMP_RET_ERRNO | errno.EACCES
    assert_same_as_reference(kill_list, prog)


def test_rule_operators_on_64_bit_arguments() -> None:
    rules = (
        S.ArgRule("mmap", 3, "eq", 0x1_0000_0022, action="kill"),
        S.ArgRule("mmap", 1, "masked_eq", 0x2_0000_0000, mask=0xF_0000_0000),
        S.ArgRule("mprotect", 2, "has_bits", 0x1_0000_0004),
        S.ArgRule("madvise", 0, "ne", 0x22, action="allow"),
        S.ArgRule("madvise", 0, "and_eq", 0, mask=0xFF, errno=errno.EINVAL),
    )
    policy = S.Seccomp(rules=rules, deny=("madvise",))
    prog = S.compile_policy(policy)
    assert verdict(prog, "mmap", 0, 0, 0, 0x1_0000_0022) == KILL
    assert verdict(prog, "mmap", 0, 0, 0, 0x22) == ALLOW
    assert verdict(prog, "mmap", 0, 0x2_1234_5678) == EPERM
    assert verdict(prog, "mprotect", 0, 0, 0x1_0000_0000) == EPERM
    assert verdict(prog, "mprotect", 0, 0, 0x4) == EPERM
    assert verdict(prog, "mprotect", 0, 0, 0x3) == ALLOW
    assert verdict(prog, "madvise", 0x1_0000_0022) == ALLOW  # ne on all 64 bits
    assert verdict(prog, "madvise", 0x22) == EPERM
    assert_same_as_reference(policy, prog)


def test_rule_width() -> None:
    assert S.ArgRule("ioctl", 1, "eq", TIOCSTI).bits == 32
    assert S.ArgRule("ioctl", 2, "eq", 1).bits == 64
    assert S.ArgRule("mmap", 2, "eq", 1, width=32).bits == 32
    with pytest.raises(SpecError) as exc:
        S.ArgRule("ioctl", 1, "eq", 0x1_0000_5412)
    assert exc.value.field == "rule.value"
    assert S.ArgRule("kill", 1, "eq", -1).value == 0xFFFFFFFF


def test_raw_program_used_as_is() -> None:
    own = S.compile_policy(S.Seccomp(deny=("getpid",)))
    policy = S.Seccomp(raw=own)
    assert S.compile_policy(policy) == own
    assert verdict(S.compile_policy(policy), "getpid") == EPERM
    tiny = struct.pack("<HBBI", S.BPF_RET | S.BPF_K, 0, 0, S.SECCOMP_RET_ERRNO | errno.EIO)
    assert S.evaluate(S.compile_policy(S.Seccomp(raw=tiny)), NR["read"]) == S.SECCOMP_RET_ERRNO | errno.EIO
    assert S.Seccomp.from_dict(json.loads(json.dumps(policy.to_dict()))) == policy


def test_large_policy_needs_long_jumps() -> None:
    names = sorted(NR, key=NR.get)
    rules = tuple(S.ArgRule(n, i % 6, "eq", i, action="kill") for i, n in enumerate(names[::2]))
    policy = S.Seccomp(deny=tuple(names[1::4]), rules=rules)
    prog = S.compile_policy(policy)
    assert len(prog) // 8 > 256
    S.check_program(prog)
    assert_same_as_reference(policy, prog)
    assert any(" ja " in line for line in S.disassemble(prog))


# ---------------------------------------------------------------- validation

def test_unknown_names_all_listed() -> None:
    with pytest.raises(SpecError) as exc:
        S.Seccomp(deny=("read", "nosuchcall", "alsonot", "keyctl"))
    assert exc.value.field == "seccomp.deny"
    assert exc.value.value == ("alsonot", "nosuchcall")
    assert "alsonot" in str(exc.value) and "nosuchcall" in str(exc.value)
    with pytest.raises(SpecError, match="nope") as exc:
        S.Seccomp(allow=("nope",), default="errno")
    assert exc.value.field == "seccomp.allow"
    with pytest.raises(SpecError) as exc:
        S.Seccomp(errnos={"bogus": 1})
    assert exc.value.field == "seccomp.errnos"
    with pytest.raises(SpecError) as exc:
        S.ArgRule("notacall", 0, "eq", 1)
    assert exc.value.field == "rule.syscall"


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"deny": ("read", "write"), "allow": ("write",), "default": "errno"}, "seccomp.deny"),
    ({"allow": ("read",)}, "seccomp.default"),
    ({"default": "deny"}, "seccomp.default"),
    ({"errno": 0}, "seccomp.errno"),
    ({"errno": 4096}, "seccomp.errno"),
    ({"errno": True}, "seccomp.errno"),
    ({"errno": "ENOTANERRNO"}, "seccomp.errno"),
    ({"errnos": {"read": -1}}, "seccomp.errnos['read']"),
    ({"errnos": {"read": 1}, "allow": ("read",), "default": "kill"}, "seccomp.errnos"),
    ({"deny": "read"}, "seccomp.deny"),
    ({"deny": (1,)}, "seccomp.deny"),
    ({"rules": ("x",)}, "seccomp.rules[0]"),
    ({"raw": b"\x06\x00\x00\x00\x00\x00\xff"}, "seccomp.raw"),
    ({"raw": b""}, "seccomp.raw"),
    ({"raw": b"\x06\x00\x00\x00\x00\x00\xff\x7f", "deny": ("read",)}, "seccomp.raw"),
    ({"raw": b"\x06\x00\x00\x00\x00\x00\xff\x7f", "errno": 2}, "seccomp.raw"),
    ({"raw": "text"}, "seccomp.raw"),
])
def test_invalid_policies(kwargs: dict, field: str) -> None:
    with pytest.raises(SpecError) as exc:
        S.Seccomp(**kwargs)
    assert exc.value.field == field


@pytest.mark.parametrize(("args", "kwargs", "field"), [
    (("ioctl", 6, "eq", 1), {}, "rule.arg_index"),
    (("ioctl", 1, "lt", 1), {}, "rule.op"),
    (("ioctl", 1, "eq", 1), {"action": "trap"}, "rule.action"),
    (("ioctl", 1, "eq", 1), {"errno": 0}, "rule.errno"),
    (("ioctl", 1, "eq", 1), {"mask": 1}, "rule.mask"),
    (("ioctl", 1, "masked_eq", 1), {}, "rule.mask"),
    (("ioctl", 1, "masked_eq", 3), {"mask": 1}, "rule.value"),
    (("ioctl", 1, "masked_eq", 0), {"mask": 0}, "rule.mask"),
    (("ioctl", 1, "has_bits", 0), {}, "rule.value"),
    (("mmap", 1, "eq", 2**64), {}, "rule.value"),
    (("mmap", 1, "eq", "1"), {}, "rule.value"),
    (("mmap", 1, "eq", 1), {"width": 16}, "rule.width"),
])
def test_invalid_rules(args: tuple, kwargs: dict, field: str) -> None:
    with pytest.raises(SpecError) as exc:
        S.ArgRule(*args, **kwargs)
    assert exc.value.field == field


def test_json_round_trip() -> None:
    text = json.dumps(S.DEFAULT_POLICY.to_dict())
    again = S.Seccomp.from_dict(json.loads(text))
    assert again == S.DEFAULT_POLICY
    assert S.compile_policy(again) is DEFAULT
    named = S.Seccomp.from_dict({"deny": ["ptrace"], "errno": "EACCES", "errnos": {"clone3": "ENOSYS"}})
    assert named.errno == errno.EACCES and named.errno_map == {"clone3": errno.ENOSYS}


def test_json_errors_name_the_field() -> None:
    with pytest.raises(SpecError) as exc:
        S.Seccomp.from_dict({"deny": [], "colour": "red"})
    assert exc.value.field == "seccomp" and exc.value.value == "colour"
    with pytest.raises(SpecError) as exc:
        S.Seccomp.from_dict({"rules": [{"syscall": "ioctl", "arg_index": 1, "op": "bad", "value": 1}]})
    assert exc.value.field == "seccomp.rules[0].op"
    with pytest.raises(SpecError) as exc:
        S.Seccomp.from_dict({"rules": [{"syscall": "ioctl"}]})
    assert exc.value.field == "seccomp.rules[0]"
    with pytest.raises(SpecError) as exc:
        S.Seccomp.from_dict({"raw_base64": "!!"})
    assert exc.value.field == "seccomp.raw_base64"
    with pytest.raises(SpecError) as exc:
        S.Seccomp.from_dict({"deny": ["nosuch"]}, where="spec.seccomp")
    assert exc.value.field == "spec.seccomp.deny"


def test_normalized_and_extended() -> None:
    a = S.Seccomp(deny=["write", "read", "read"], errnos=[("read", 5)])
    b = S.Seccomp(deny=("read", "write"), errnos={"read": errno.EIO})
    assert a == b and hash(a) == hash(b) and a.deny == ("read", "write")
    more = S.DEFAULT_POLICY.extend(deny=["ptrace"], errnos={"io_uring_setup": "ENOSYS"})
    prog = S.compile_policy(more)
    assert verdict(prog, "ptrace") == EPERM
    assert verdict(prog, "io_uring_setup") == ENOSYS
    assert verdict(prog, "ioctl", 0, 0x1_0000_5412) == EPERM
    assert verdict(DEFAULT, "ptrace") == ALLOW


# ---------------------------------------------------------------- cache and size

def test_compile_cached_by_content() -> None:
    policy = S.Seccomp(deny=("acct", "swapon"), errno=errno.EROFS)
    twin = S.Seccomp(deny=["swapon", "acct"], errno="EROFS")
    assert policy is not twin
    before = S.compile_policy.cache_info()
    first = S.compile_policy(policy)
    second = S.compile_policy(twin)
    after = S.compile_policy.cache_info()
    assert first is second
    assert after.misses == before.misses + 1 and after.hits == before.hits + 1


def test_path_length_logarithmic() -> None:
    names = sorted(NR, key=NR.get)
    for step in (32, 8, 3, 2):
        policy = S.Seccomp(deny=tuple(names[::step]))
        prog = S.compile_policy(policy)
        intervals = len(_intervals(policy))
        bound = 5 + math.ceil(math.log2(intervals))  # ld arch, jeq, ld nr, the tree, ret; +1 for weighting
        assert S.max_path_length(prog) <= bound, (step, intervals)
        assert max(S.path_length(prog, nr) for nr in NR.values()) <= bound
    linear = S.compile_linear(S.DEFAULT_POLICY)
    assert S.max_path_length(DEFAULT) <= 16 < S.max_path_length(linear)


def test_default_program_is_small() -> None:
    assert len(DEFAULT) % 8 == 0
    assert len(DEFAULT) // 8 < 100
    assert S.path_length(DEFAULT, NR["getpid"]) <= 12
    assert S.path_length(DEFAULT, NR["getpid"], arch=syscalls.AUDIT_ARCH_I386) == 3


# ---------------------------------------------------------------- BPF machinery

def insn(code: int, k: int = 0, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def test_interpreter_alu_memory_and_registers() -> None:
    prog = b"".join([
        insn(S.BPF_LD | S.BPF_W | S.BPF_ABS, 16),          # A = args[0] lo
        insn(S.BPF_ALU | S.BPF_ADD | S.BPF_K, 3),
        insn(S.BPF_ALU | S.BPF_LSH | S.BPF_K, 4),
        insn(S.BPF_ST, 2),                                 # M[2] = A
        insn(S.BPF_LDX | S.BPF_W | S.BPF_LEN),             # X = 64
        insn(S.BPF_LD | S.BPF_MEM, 2),
        insn(S.BPF_ALU | S.BPF_SUB | S.BPF_X),             # A -= X
        insn(S.BPF_MISC | S.BPF_TAX),
        insn(S.BPF_MISC | S.BPF_TXA),
        insn(S.BPF_ALU | S.BPF_OR | S.BPF_K, S.SECCOMP_RET_ERRNO),
        insn(S.BPF_RET | S.BPF_A),
    ])
    S.check_program(prog)
    assert S.evaluate(prog, 0, (1,)) == S.SECCOMP_RET_ERRNO | ((1 + 3) << 4) - 64
    divide = insn(S.BPF_LDX | S.BPF_IMM, 0) + insn(S.BPF_ALU | S.BPF_DIV | S.BPF_X) + insn(S.BPF_RET | S.BPF_K, 7)
    assert S.evaluate(divide, 0) == S.SECCOMP_RET_KILL_THREAD


def test_check_program_rejects_what_the_kernel_rejects() -> None:
    ret = insn(S.BPF_RET | S.BPF_K, ALLOW)
    bad = {
        "not allowed": insn(0x28, 0) + ret,                               # BPF_LD|BPF_H|BPF_ABS
        "outside": insn(S.BPF_LD | S.BPF_W | S.BPF_ABS, 64) + ret,
        "past the end": insn(S.BPF_JMP | S.BPF_JEQ, 0, 0, 5) + ret,
        "last": ret + insn(S.BPF_LD | S.BPF_W | S.BPF_ABS, 0),
        "before any store": insn(S.BPF_LD | S.BPF_MEM, 1) + ret,
        "division": insn(S.BPF_ALU | S.BPF_DIV | S.BPF_K, 0) + ret,
        "1 to 4096": b"",
    }
    for problem, prog in bad.items():
        with pytest.raises(ValueError, match=problem):
            S.check_program(prog)
    S.check_program(DEFAULT)


def test_disassemble() -> None:
    lines = S.disassemble(DEFAULT)
    assert len(lines) == len(DEFAULT) // 8
    assert lines[0].startswith("0000: ld   [4]") and lines[0].endswith("; arch")
    assert "; x86_64" in lines[1] and lines[2].endswith("; nr")
    assert any("jge" in line and line.endswith("; ioctl") for line in lines)
    assert any("ret  #0x80000000" in line and "KILL_PROCESS" in line for line in lines)
    assert any("ERRNO(ENOSYS)" in line for line in lines)
    assert any("args[1] lo" in line for line in lines)


def test_describe_action() -> None:
    assert S.describe_action(ALLOW) == "ALLOW"
    assert S.describe_action(KILL) == "KILL_PROCESS"
    assert S.describe_action(EPERM) == "ERRNO(EPERM)"
    assert S.describe_action(S.SECCOMP_RET_TRACE | 3) == "TRACE(3)"


def test_allow_all_is_one_allow() -> None:
    assert S.ALLOW_ALL == struct.pack("<HBBI", S.BPF_RET | S.BPF_K, 0, 0, S.SECCOMP_RET_ALLOW)
    S.check_program(S.ALLOW_ALL)
    assert S.evaluate(S.ALLOW_ALL, NR["getpid"]) == ALLOW
