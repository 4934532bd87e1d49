"""The id maps a Session writes (sandbox/session/ids.py): pure, no privileges."""

from __future__ import annotations

import pytest

from sandbox.session.ids import IdMap


@pytest.mark.parametrize(("own", "lines", "words"), [
    (0, ["0 0 1", "1 1879048192 65535"], "0-65535"),
    (999, ["999 0 1", "0 1879048192 999", "1000 1879049191 64536"], "0-65535"),
    (65535, ["65535 0 1", "0 1879048192 65535"], "0-65534 and 65535"),
    (100000, ["100000 0 1", "0 1879048192 65535"], "0-65534 and 100000"),
])
def test_own_id_beside_a_range(own: int, lines: list[str], words: str) -> None:
    m = IdMap(own, 0, 0x70000000, 65535)
    assert m.text().splitlines() == lines
    assert m.words() == words
    inside = sorted({*range(0, 65536 if own < 65535 else 65535), own})
    assert [i for i in (*inside, 65536, 2**31) if i in m] == inside
    hosts = [m.host_id(i) for i in inside]
    assert m.host_id(own) == 0 and sorted(hosts) == [0, *range(0x70000000, 0x70000000 + 65535)]
    with pytest.raises(ValueError, match="not mapped"):
        m.host_id(2**31)


def test_one_id() -> None:
    m = IdMap(1000, 4242)
    assert m.text() == "1000 4242 1\n" and m.words() == "1000"
    assert 1000 in m and 0 not in m and "1000" not in m and m.host_id(1000) == 4242


def test_a_filter_that_denies_the_switch_means_one_id() -> None:
    from sandbox.seccomp import DEFAULT_POLICY, Seccomp
    from sandbox.seccomp.compile import compile_policy
    from sandbox.session.ids import allows_switch

    assert allows_switch(b"") and allows_switch(compile_policy(DEFAULT_POLICY))
    for name in ("setresuid", "setresgid", "setgroups", "capset", "prctl"):
        assert not allows_switch(compile_policy(Seccomp(deny=(name,)))), name
