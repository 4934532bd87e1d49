"""The client's wire (csrc/client/cliwire.h) as the server reads it (sandbox._core.cliwire) and as C compiles it.

The server parses the header itself through cffi; this compiles the same
header with the C compiler and compares every struct size, field offset and
constant, so the two sides cannot disagree; then a request built as the
client builds it is parsed back whole, and malformed ones are refused.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from sandbox._core import cliwire as wire

HEADER = Path(__file__).resolve().parents[2] / "csrc" / "client" / "cliwire.h"
STRUCTS = {"sbx_cli_request": ["magic", "version", "argc", "envc", "nfds", "size", "exe_dev", "exe_ino", "exe_mtime",
                               "sigmask", "rlim_max"],
           "sbx_cli_frame": ["kind", "value"],
           "sbx_cli_plan": ["kind", "flags", "npass", "blob_size", "argc", "envc", "strings_size", "before_size",
                            "after_size"]}
CONSTANTS = ["SBX_CLI_MAGIC", "SBX_CLI_VERSION", "SBX_CLI_MAX_FDS", "SBX_CLI_MAX_REQUEST", "SBX_CLI_MAX_ANSWER",
             "SBX_CLI_N_RLIMITS", "SBX_CLI_STATUS", "SBX_CLI_FALLBACK", "SBX_CLI_SIGNAL", "SBX_CLI_DIE_WITH_PARENT",
             "SBX_CLI_ACK", "SBX_CLI_PLAN", "SBX_CLI_PLAN_DIE_WITH_PARENT", "SBX_CLI_CHALLENGE", "SBX_CLI_PROOF",
             "SBX_CLI_MAX_PROOF"]


def test_the_installed_header_is_the_sources():
    if not HEADER.exists():
        pytest.skip("no checkout's csrc/ here")
    assert Path(wire.HEADER).read_text() == HEADER.read_text()


def test_c_and_cffi_agree(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or not HEADER.exists():
        pytest.skip("needs a C compiler and the checkout's csrc/")
    lines = []
    for name, fields in STRUCTS.items():
        lines.append(f'printf("sizeof {name} %zu\\n", sizeof(struct {name}));')
        lines += [f'printf("offsetof {name}.{f} %zu\\n", offsetof(struct {name}, {f}));' for f in fields]
    lines += [f'printf("const {c} %lld\\n", (long long){c});' for c in CONSTANTS]
    src = tmp_path / "probe.c"
    src.write_text(f'#include <stddef.h>\n#include <stdio.h>\n#include "{HEADER}"\nint main(void) {{\n'
                   + "\n".join(lines) + "\nreturn 0;\n}\n")
    subprocess.run([cc, "-o", str(tmp_path / "probe"), str(src)], check=True)
    compiled = subprocess.run([str(tmp_path / "probe")], capture_output=True, text=True, check=True).stdout
    ours = []
    for name, fields in STRUCTS.items():
        ours.append(f"sizeof {name} {wire.ffi.sizeof(f'struct {name}')}")
        ours += [f"offsetof {name}.{f} {wire.ffi.offsetof(f'struct {name}', f)}" for f in fields]
    ours += [f"const {c} {getattr(wire.lib, c)}" for c in CONSTANTS]
    assert compiled.splitlines() == ours


def test_the_proofs_prefix_is_the_headers():
    """SBX_CLI_PROOF_PREFIX is a string, outside the cdef: read from the header's text."""
    assert wire.PROOF_PREFIX == "/memfd:sandbox-cli-proof-"
    assert f'#define SBX_CLI_PROOF_PREFIX "{wire.PROOF_PREFIX}"' in Path(wire.HEADER).read_text()


def request(argv=(b"sandbox", b"run", b"true"), cwd=b"/tmp", environ=(b"A=1",), fds=(0, 1, 2, 9),
            exe=(1, 2, 3)) -> bytes:
    """A request laid out as csrc/client/clipeer.c's build_request lays it out."""
    strings = b"".join(s + b"\0" for s in (argv[0], cwd, *argv[1:], *environ))
    head = wire.ffi.new("struct sbx_cli_request *", {
        "magic": wire.MAGIC, "version": wire.VERSION, "argc": len(argv), "envc": len(environ), "nfds": len(fds),
        "size": len(strings), "exe_dev": exe[0], "exe_ino": exe[1], "exe_mtime": exe[2],
        "rlim_max": [wire.RLIM_INFINITY] * wire.N_RLIMITS})
    return bytes(wire.ffi.buffer(head)) + struct.pack(f"{len(fds)}i", *fds) + strings


def test_a_request_is_read_whole():
    got = wire.parse_request(request())
    assert got == wire.Request(argv=[b"sandbox", b"run", b"true"], cwd=b"/tmp", environ=[b"A=1"],
                               fd_numbers=[0, 1, 2, 9], exe=(1, 2, 3))
    assert wire.parse_request(request(fds=())).fd_numbers == []


def test_the_request_carries_the_clients_hard_limits():
    import resource

    data = bytearray(request())
    at = wire.ffi.offsetof("struct sbx_cli_request", "rlim_max") + 8 * resource.RLIMIT_NOFILE
    data[at:at + 8] = struct.pack("Q", 99)
    got = wire.parse_request(bytes(data)).rlim_max
    assert got[resource.RLIMIT_NOFILE] == 99 and got[resource.RLIMIT_CPU] == wire.RLIM_INFINITY
    assert len(got) == wire.N_RLIMITS


def test_a_plan_answer_is_laid_out_as_its_header_says():
    """csrc/client/cliplan.c reads it back: the header, the fd numbers, the blob, the strings, the two texts."""
    blob = bytes(range(16))
    data = wire.plan_answer(blob, [b"sh", b"-c", b"x"], [b"A=1"], [5, 9], die_with_parent=True, before=b"w\n",
                            after=b"v\n")
    head = wire.ffi.cast("struct sbx_cli_plan *", wire.ffi.from_buffer(data))
    assert (head.kind, head.flags, head.npass, head.blob_size, head.argc, head.envc) == (
        wire.PLAN, wire.PLAN_DIE_WITH_PARENT, 2, 16, 3, 1)
    rest = data[wire.PLAN_SIZE:]
    assert struct.unpack("2i", rest[:8]) == (5, 9)
    assert rest[8:24] == blob
    assert rest[24:24 + head.strings_size] == b"sh\0-c\0x\0A=1\0"
    assert rest[24 + head.strings_size:] == b"w\nv\n" and head.before_size == head.after_size == 2


@pytest.mark.parametrize("damage", ["short", "magic", "version", "size", "strings", "fds"])
def test_a_malformed_request_is_refused(damage):
    data = bytearray(request())
    if damage == "short":
        data = data[:wire.REQUEST_SIZE - 1]
    elif damage == "magic":
        data[0] ^= 1
    elif damage == "version":
        data[4] += 1
    elif damage == "size":
        data += b"x\0"
    elif damage == "strings":
        data[-1:] = b"x"
    elif damage == "fds":
        data[16:20] = struct.pack("I", wire.MAX_FDS + 1)
    with pytest.raises(wire.WireError):
        wire.parse_request(bytes(data))


def test_frames_round_trip():
    for kind in (wire.STATUS, wire.FALLBACK, wire.SIGNAL, wire.DIE_WITH_PARENT, wire.ACK, wire.PLAN):
        assert wire.parse_frame(wire.frame(kind, -9)) == (kind, -9)
    with pytest.raises(wire.WireError):
        wire.parse_frame(b"\0" * (wire.FRAME_SIZE + 1))


@pytest.mark.parametrize(("argv", "asked"), [
    (["sandbox", "run", "--ro-bind", "/", "/", "--die-with-parent", "true"], True),
    (["/x/bwrap", "--bind", "/a", "/b", "--die-with-parent", "true"], True),
    (["sandbox", "run", "--ro-bind", "/", "--die-with-parent", "true"], False),  # a value, not the option
    (["sandbox", "run", "--", "cmd", "--die-with-parent"], False),  # the command's own argument
    (["sandbox", "run", "true", "--die-with-parent"], False),
    (["sandbox", "run", "--version", "--die-with-parent"], False),  # parsing stops at --version
    (["sandbox", "probe", "--die-with-parent"], False),
])
def test_the_worker_asks_for_die_with_parent_only_when_the_options_hold_it(argv, asked):
    """The worker asks the client for PR_SET_PDEATHSIG early when the command line's options hold
    --die-with-parent (an --args file's is asked for when parsing finds it)."""
    from sandbox.cliserver.worker import _asks_die_with_parent

    assert _asks_die_with_parent(argv) is asked
