"""Fuzzing the three ways a sandbox description enters (issue 11, "Beyond single attacks").

- Spec JSON: `Spec.from_json` of arbitrary text, arbitrary JSON and
  mutations of real specs' JSON yields SpecError or a Spec that round-trips
  (to_json, from_json) to itself; nothing else ever escapes.
- bwrap argv: `parse_bwrap_args` of argv built from its own option names and
  awkward values yields BwrapArgsError/SpecError or (Spec, argv, extras).
  Values never name an open fd (the parser reads and closes the fds it is
  given) nor a readable --spec file (they are relative, under a missing cwd).
- The native wire format: real plans serialized, then mutated (bytes flipped,
  u32 fields overwritten, truncated, extended), checked by the compiled
  core's own sbx_check_blob (nothing is spawned): -EINVAL or 0, never a
  crash. An accepted blob is then read by the C code that names a failing
  op's paths (sbx_format_error, sbx_error_path), which would fault on an
  out-of-range offset the checker let through.

Each test is bounded by max_examples (whole file well under 20 s);
SANDBOX_FUZZ_SCALE=N runs N times as many. No example database is written.
"""

from __future__ import annotations

import errno
import json
import os
import string
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandbox import Limits, Namespaces, Spec
from sandbox.bwrap.grammar import OPTIONS
from sandbox.bwrap.parse import parse_bwrap_args
from sandbox.errors import SpecError
from sandbox.host import HostInfo
from sandbox.mounts import Bind, Chmod, Dev, Dir, File, Proc, RemountRo, RoBind, Symlink, Tmpfs
from sandbox.plan import compile_plan

SCALE = int(os.environ.get("SANDBOX_FUZZ_SCALE", "1"))
FUZZ = settings(max_examples=300 * SCALE, deadline=None, database=None, suppress_health_check=list(HealthCheck))

SPECS = (
    Spec(seccomp=None),
    Spec(mounts=(RoBind("/usr"), Bind("/tmp", "/work"), Bind("/missing", "/opt/m", optional=True), Proc(), Dev(),
                 Tmpfs("/tmp", size=1 << 20, perms=0o1777))),
    Spec(mounts=(Tmpfs("/"), File("/etc/hosts", data=b"127.0.0.1 localhost\n", perms=0o644),
                 File("/etc/binary", data=bytes(range(256)), readonly=True), Dir("/a/b/c", perms=0o700),
                 Symlink("usr/bin", "/bin"), RemountRo("/a"), Chmod("/a/b", 0o755)), hostname="box", cwd="/a"),
    Spec(mounts=(RoBind("/usr"), Bind("/tmp")), landlock=True, seccomp=None, namespaces=Namespaces(pid=False),
         uid=0, gid=0, limits=Limits(cpu_s=10, nofile=64, file_bytes=4096)),
    Spec(mounts=(RoBind("/usr"),), probe_paths=("/etc/shadow", "/home"), cap_add=("CAP_NET_RAW",),
         disable_userns=True, forward=((8080, 80), (9000, "/run/app.sock")), env=(("A", "b"),), env_inherit=("HOME",)),
)

# ---------------------------------------------------------------- Spec JSON

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)


def _accept_or_refuse(text: str | bytes) -> None:
    """from_json gives SpecError, or a Spec that round-trips exactly."""
    try:
        spec = Spec.from_json(text)
    except SpecError:
        return
    again = Spec.from_json(spec.to_json())
    assert again == spec and again.to_json() == spec.to_json()


@FUZZ
@given(st.text(max_size=200) | st.binary(max_size=200))
def test_spec_from_arbitrary_text(text: str | bytes) -> None:
    _accept_or_refuse(text)


@FUZZ
@given(JSON)
def test_spec_from_arbitrary_json(value: object) -> None:
    _accept_or_refuse(json.dumps(value))


def _paths(d: object, at: tuple = ()) -> list[tuple]:
    """Every path (tuple of keys/indexes) into a JSON value."""
    out = [at]
    if isinstance(d, dict):
        for k, v in d.items():
            out += _paths(v, (*at, k))
    elif isinstance(d, list):
        for i, v in enumerate(d):
            out += _paths(v, (*at, i))
    return out


@FUZZ
@given(st.sampled_from(SPECS), st.data())
def test_spec_from_mutated_json(spec: Spec, data: st.DataObject) -> None:
    doc = json.loads(spec.to_json())
    for _ in range(data.draw(st.integers(1, 3))):
        where = data.draw(st.sampled_from(_paths(doc)))
        value = data.draw(JSON)
        if not where:
            doc = value
            continue
        parent = doc
        for key in where[:-1]:
            parent = parent[key]
        action = data.draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "replace":
            parent[where[-1]] = value
        elif action == "delete":
            del parent[where[-1]]
        elif isinstance(parent, dict):
            parent[data.draw(st.text(max_size=10))] = value
        else:
            parent.insert(where[-1], value)
    _accept_or_refuse(json.dumps(doc))


# ---------------------------------------------------------------- bwrap argv

# Values: free text without digits, "/" or "." (never an fd number, never a
# path that resolves to an existing file), plus awkward fixed ones.
SAFE_TEXT = st.text(alphabet=string.ascii_letters + "-_=:, \t\u00e9\u2603", max_size=12)
AWKWARD = st.sampled_from([
    "", "-", "--", "987654", "2147483647", "2147483648", "-1", " 987654", "0x10", "0777777", "07777", "010000",
    "0", "/", "/usr", "/tmp/x", "/a/../b", "//x", "x\0y", "{", "{}", '{"mounts": 1}', '{"network": "host"}',
    '{"seccomp": null}', "none", "pool", "host", "bwrap", "native", "auto", "1k", "ALL", "CAP_NET_RAW", "cap_sys_admin",
])
TOKENS = st.sampled_from([o.name for o in OPTIONS]) | AWKWARD | SAFE_TEXT
HOST_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent-fuzz"}


@settings(FUZZ, max_examples=600 * SCALE)
@given(st.lists(TOKENS, max_size=14))
def test_bwrap_argv_parser(argv: list[str]) -> None:
    try:
        spec, command, _ = parse_bwrap_args(argv, environ=HOST_ENV, cwd="/nonexistent-fuzz", uid=1000, gid=1000)
    except SpecError:  # BwrapArgsError is one
        return
    assert isinstance(spec, Spec) and all(isinstance(a, str) for a in command)
    assert Spec.from_json(spec.to_json()) == spec


# ---------------------------------------------------------------- native wire format

native = pytest.importorskip("sandbox.backends.native")
wire = pytest.importorskip("sandbox._core.blob")
ffi, lib = wire.ffi, wire.lib
HOST = HostInfo(executor=native.TRAITS, uid=1000, gid=1001, cwd="/home/u/project",
                environ={"HOME": "/home/u", "PATH": "/host/bin"})
BLOBS = tuple(wire.serialize(compile_plan(s, HOST), "/tmp") for s in SPECS)


def _check(data: bytes) -> tuple[int, object]:
    buf = ffi.new("uint64_t[]", max(1, (len(data) + 7) // 8))
    ffi.memmove(buf, data, len(data))
    return lib.sbx_check_blob(buf, len(data)), buf


def _read_paths(buf: object, size: int, n_ops: int) -> None:
    """What the C core reads from an accepted blob to word a failure, for every op and step."""
    res = ffi.new("struct sbx_result *")
    out = ffi.new("char[]", 2 * size + 512)
    for op in (-1, *range(min(n_ops, 64))):
        for step in range(lib.sbx_n_steps):
            res.op, res.step, res.err = op, step, errno.ENOENT
            lib.sbx_format_error(res, buf, size, b"cmd", out, len(out))
            lib.sbx_error_path(res, buf, size)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(BLOBS)))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["byte", "u32", "u32-header", "truncate", "extend"]))
        if not data:
            data += draw(st.binary(min_size=1, max_size=64))
        elif kind == "byte":
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        elif kind in ("u32", "u32-header"):
            limit = wire.HEADER_SIZE if kind == "u32-header" else len(data)
            at = draw(st.integers(0, max(0, limit - 4) // 4)) * 4
            value = draw(st.sampled_from([0, 1, 7, 8, len(data) - 1, len(data), len(data) + 8, 2**31, 2**32 - 1])
                         | st.integers(0, 2**32 - 1))
            data[at:at + 4] = struct.pack("=I", value)
        elif kind == "truncate":
            del data[draw(st.integers(0, len(data))):]
        else:
            data += draw(st.binary(max_size=64))
    if draw(st.booleans()) and len(data) >= wire.HEADER_SIZE:  # keep the size field honest, so deeper checks run
        h = wire.header(bytes(data))
        h.size = len(data)
        data[:wire.HEADER_SIZE] = bytes(ffi.buffer(h))
    return bytes(data)


@settings(FUZZ, max_examples=1500 * SCALE)
@given(mutated())
def test_wire_mutations_are_refused_or_valid(data: bytes) -> None:
    rc, buf = _check(data)
    assert rc in (0, -errno.EINVAL)
    if rc == 0:
        _read_paths(buf, len(data), wire.header(data).n_ops)


def test_every_real_blob_is_accepted() -> None:
    for blob in BLOBS:
        rc, buf = _check(blob)
        assert rc == 0
        _read_paths(buf, len(blob), wire.header(blob).n_ops)


# ---------------------------------------------------------------- what the fuzzing found (fixed)

@pytest.mark.parametrize("kind", [[1], {"a": 1}])
def test_a_mount_type_that_is_a_list_or_object_is_a_spec_error(kind: object) -> None:
    with pytest.raises(SpecError, match="unknown mount type"):
        Spec.from_dict({"mounts": [{"type": kind, "dest": "/x"}]})


def test_a_spec_path_with_a_nul_byte_is_an_argv_error() -> None:
    with pytest.raises(SpecError, match="NUL"):
        parse_bwrap_args(["--spec", "x\0y", "true"], environ=HOST_ENV, cwd="/nonexistent-fuzz", uid=1000, gid=1000)
