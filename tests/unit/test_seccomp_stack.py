"""sandbox.seccomp.stack: several programs as one, judged against the kernel's
rule for stacked filters (the newest runs first, the action of highest
precedence wins, the first one run wins a tie) by the BPF interpreter."""

from __future__ import annotations

import errno as E
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox import syscalls
from sandbox.seccomp import ArgRule, Seccomp, compile_policy
from sandbox.seccomp.bpf import check_program
from sandbox.seccomp.debug import evaluate
from sandbox.seccomp.stack import stack

NAMES = ("chmod", "chown", "mkdir", "getpid", "uname", "listen", "prctl")


def kernel(programs: list[bytes], nr: int, args: tuple[int, ...]) -> int:
    """What the kernel returns for `programs` installed in this order."""
    def signed(action: int) -> int:
        a = action & 0xFFFF0000
        return a - (1 << 32) if a & 0x80000000 else a
    best = None
    for prog in reversed(programs):
        result = evaluate(prog, nr, args)
        if best is None or signed(result) < signed(best):
            best = result
    assert best is not None
    return best


policies = st.builds(
    Seccomp,
    deny=st.lists(st.sampled_from(NAMES), unique=True, max_size=3).map(tuple),
    allow=st.just(()),
    errno=st.sampled_from([E.EPERM, E.EACCES, E.ENOSYS]),
)


@settings(max_examples=60, deadline=None, database=None)  # no example database: the tests write nothing
@given(st.lists(policies, min_size=2, max_size=4))
def test_stack_returns_what_the_kernel_would(policies: list[Seccomp]) -> None:
    programs = [compile_policy(p) for p in policies]
    merged = stack(programs)
    check_program(merged)
    for name, args in itertools.product(NAMES, [(0,) * 6, (1, 2, 3, 4, 5, 6)]):
        nr = syscalls.number(name)
        assert nr is not None
        assert evaluate(merged, nr, args) == kernel(programs, nr, args), name


def test_a_single_program_is_kept_as_it_is() -> None:
    prog = compile_policy(Seccomp(deny=("chmod",)))
    assert stack([prog]) == prog


def test_precedence_and_ties() -> None:
    nr = syscalls.number("chmod")
    assert nr is not None
    eperm = compile_policy(Seccomp(deny=("chmod",), errno=E.EPERM))
    eacces = compile_policy(Seccomp(deny=("chmod",), errno=E.EACCES))
    # equal actions: the newest program's data wins
    assert evaluate(stack([eperm, eacces]), nr) & 0xFFFF == E.EACCES
    assert evaluate(stack([eacces, eperm]), nr) & 0xFFFF == E.EPERM
    # an allow-all never weakens a deny, whichever order
    allow = compile_policy(Seccomp(deny=()))
    assert evaluate(stack([allow, eperm]), nr) & 0xFFFF == E.EPERM
    assert evaluate(stack([eperm, allow]), nr) & 0xFFFF == E.EPERM


def test_arg_rules_survive_stacking() -> None:
    ioctl = syscalls.number("ioctl")
    assert ioctl is not None
    rule = compile_policy(Seccomp(deny=(), rules=(ArgRule("ioctl", 1, "eq", 0x5412),)))
    plain = compile_policy(Seccomp(deny=("chmod",)))
    merged = stack([rule, plain])
    for args in [(0, 0x5412, 0, 0, 0, 0), (0, 1, 0, 0, 0, 0)]:
        assert evaluate(merged, ioctl, args) == kernel([rule, plain], ioctl, args)


def test_too_long_is_refused() -> None:
    from sandbox.errors import SpecError

    big = compile_policy(Seccomp(deny=NAMES))
    with pytest.raises(SpecError, match="4096"):
        stack([big] * 400)
