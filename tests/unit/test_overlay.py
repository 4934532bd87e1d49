"""The Overlay mount kind: its validation and JSON form (sandbox.mounts), its
Plan op (sandbox.plan), its blob (_core/blob.py) and the C check of
it (csrc/core/wire.c). Pure: nothing runs."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox import Proc, Spec
from sandbox._core import blob as wire
from sandbox._core.binding import ffi, lib
from sandbox.backends.native import TRAITS as NATIVE
from sandbox.errors import SpecError
from sandbox.host import HostInfo
from sandbox.mounts import MAX_OVERLAY_LOWERS
from sandbox.plan import OpFlag, OpKind, compile_plan
from sandbox.spec import Overlay

HOST = HostInfo(executor=NATIVE, uid=1000, gid=1001, cwd="/", environ={})


def test_an_overlay_round_trips_through_json() -> None:
    spec = Spec(mounts=(Overlay("/", ["/s/l0", "/s/l1"], size=4096), Overlay("/k", ["/s/l0"], upper="/keep"),
                        Overlay("/r", ("/s/l0",), writable=False), Proc()))
    again = Spec.from_json(spec.to_json())
    assert again == spec
    assert again.mounts[0] == Overlay("/", ("/s/l0", "/s/l1"), size=4096)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"lowers": []}, "lowers"),
    ({"lowers": "/s/l0"}, "lowers"),
    ({"lowers": ["s/l0"]}, "lowers[0]"),
    ({"lowers": ["/s/l0", "/a/../b"]}, "lowers[1]"),
    ({"lowers": ["/s/l0"], "upper": "rel"}, "upper"),
    ({"lowers": ["/s/l0"], "upper": "/k", "writable": False}, "upper"),
    ({"lowers": ["/s/l0"], "upper": "/k", "size": 10}, "size"),
    ({"lowers": ["/s/l0"], "writable": False, "size": 10}, "size"),
    ({"lowers": ["/s/l0"], "size": 0}, "size"),
    ({"lowers": ["/s/l0"], "writable": "yes"}, "writable"),
    ({"lowers": [f"/s/{k}" for k in range(MAX_OVERLAY_LOWERS + 1)]}, "lowers"),
])
def test_bad_overlays_are_refused_naming_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as err:
        Overlay("/x", **kwargs)
    assert err.value.field == f"overlay.{field}"
    with pytest.raises(SpecError) as err:  # from JSON, named by its place in the Spec
        Spec.from_dict({"mounts": [{"type": "ro-bind", "src": "/usr"}, {"type": "overlay", "dest": "/x", **kwargs}]})
    assert err.value.field == f"mounts[1].{field}"


def test_an_unknown_key_in_json_is_refused() -> None:
    with pytest.raises(SpecError, match="lower"):
        Spec.from_json('{"mounts": [{"type": "overlay", "dest": "/", "lower": ["/a"]}]}')


def test_the_op_stacks_the_lowers_top_first_with_its_flags() -> None:
    spec = Spec(mounts=(Overlay("/", ["/s/bottom", "/s/middle", "/s/top"], size=1 << 20),
                        Overlay("/k", ["/s/l"], upper="/keep"), Overlay("/r", ["/s/l"], writable=False)))
    root, kept, ro = compile_plan(spec, HOST).ops
    assert (root.kind, root.dest, root.lowers, root.src, root.size) == (
        OpKind.OVERLAY, "/", ("/s/top", "/s/middle", "/s/bottom"), "", 1 << 20)
    assert root.flags == OpFlag.NOSUID | OpFlag.NODEV
    assert (kept.src, kept.flags) == ("/keep", OpFlag.NOSUID | OpFlag.NODEV)
    assert ro.flags == OpFlag.NOSUID | OpFlag.NODEV | OpFlag.RDONLY


def test_landlock_grants_a_writable_overlay_writes_and_a_read_only_one_reads() -> None:
    spec = Spec(mounts=(Overlay("/", ["/s/l"]), Overlay("/r", ["/s/l"], writable=False)), landlock=True)
    assert dict(compile_plan(spec, HOST).landlock_rules) == {"/": True, "/r": False}


def _op(blob: bytes, index: int) -> Any:
    h = wire.header(blob)
    op = ffi.new("struct sbx_op *")
    ffi.memmove(op, blob[h.ops_off + index * wire.OP_SIZE:], wire.OP_SIZE)
    return op


def _check(data: bytes) -> int:
    buf = ffi.new("uint64_t[]", max(1, (len(data) + 7) // 8))
    ffi.memmove(buf, data, len(data))
    return int(lib.sbx_check_blob(buf, len(data)))


def _with_op(blob: bytes, index: int, **fields: int) -> bytes:
    h = wire.header(blob)
    op = _op(blob, index)
    for name, value in fields.items():
        setattr(op, name, value)
    at = h.ops_off + index * wire.OP_SIZE
    return blob[:at] + bytes(ffi.buffer(op)) + blob[at + wire.OP_SIZE:]


def test_the_blob_carries_the_lowers_and_the_upper_by_name() -> None:
    spec = Spec(mounts=(Overlay("/", ["/s/l0", "/s/l1"]), Overlay("/k", ["/s/l0"], upper="/keep")))
    blob = wire.serialize(compile_plan(spec, HOST), "/tmp")
    assert _check(blob) == 0
    root, kept = _op(blob, 0), _op(blob, 1)
    assert root.kind == lib.SBX_OP_OVERLAY == OpKind.OVERLAY
    assert blob[root.data:root.data + root.data_len] == b"/s/l1\0/s/l0\0"
    assert root.src == 0
    assert blob[kept.src:blob.index(b"\0", kept.src)] == b"/keep"


def test_the_c_check_refuses_a_malformed_overlay() -> None:
    spec = Spec(mounts=(Overlay("/", ["/s/l0", "/s/l1"]), Overlay("/k", ["/s/l0"], upper="/keep")))
    blob = wire.serialize(compile_plan(spec, HOST), "/tmp")
    root, kept = _op(blob, 0), _op(blob, 1)
    assert _check(_with_op(blob, 0, data=0, data_len=0)) != 0  # no lower
    assert _check(_with_op(blob, 0, data_len=root.data_len - 1)) != 0  # the last lower unterminated
    assert _check(_with_op(blob, 0, data=root.data + 1, data_len=root.data_len - 1)) != 0  # a relative lower
    assert _check(_with_op(blob, 1, flags=kept.flags | lib.SBX_F_RDONLY)) != 0  # read-only with an upper
    assert _check(_with_op(blob, 1, src=kept.src + 1)) != 0  # a relative upper
    assert _check(_with_op(blob, 0, kind=lib.SBX_OP_OVERLAY + 1)) != 0  # no such kind


def test_explain_shows_an_overlay_in_bwrap_0_11_words_and_the_refusal() -> None:
    import sandbox
    from sandbox.backends.bwrap.render import overlay_args

    spec = Spec(mounts=(Overlay("/", ["/s/bottom", "/s/top"]), Overlay("/k", ["/s/l"], upper="/keep"),
                        Overlay("/r", ["/s/a", "/s/b"], writable=False), Overlay("/one", ["/s/l"], writable=False)))
    root, kept, ro, one = compile_plan(spec, HOST).ops
    assert overlay_args(root) == ["--overlay-src", "/s/bottom", "--overlay-src", "/s/top", "--tmp-overlay", "/"]
    assert overlay_args(kept) == ["--overlay-src", "/s/l", "--overlay", "/keep/upper", "/keep/work", "/k"]
    assert overlay_args(ro) == ["--overlay-src", "/s/a", "--overlay-src", "/s/b", "--ro-overlay", "/r"]
    assert overlay_args(one) == ["--ro-bind", "/s/l", "/one"]
    text = sandbox.explain(spec, ["true"], backend="bwrap")
    assert "refused before anything runs" in text and "--tmp-overlay /" in text
