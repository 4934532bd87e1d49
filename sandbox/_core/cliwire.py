"""The client's wire (csrc/client/cliwire.h), read through cffi from the header itself.

One wire for one conversation: a C client hands a warm Python server its
argv, cwd, environment and fds, and gets frames back. The installed
`sandbox` command speaks it to the CLI server (sandbox/cliserver/), and
sandbox-launch to the harness's handoff (sandbox/compat/handoff.py), which
adds a ticket; both read it here.

The header is installed beside the executables (sandbox/_bin/cliwire.h) and
its CDEF region is the one definition of the request and the frames: this
module parses it with cffi (ABI level: no compiler at run time) and reads
and writes them by field name. tests/unit/test_cliwire.py compiles the
header and checks every size, offset and constant against this reading.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from cffi import FFI  # type: ignore[import-untyped]

from .cdef import read_cdef

HEADER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_bin", "cliwire.h")


class WireError(ValueError):
    """A request that does not follow csrc/client/cliwire.h (the server drops it)."""


def _proof_prefix(path: str = HEADER) -> str:
    """SBX_CLI_PROOF_PREFIX, a string constant (outside the CDEF region: cffi reads no strings)."""
    with open(path) as f:
        match = re.search(r'#define SBX_CLI_PROOF_PREFIX "([^"]+)"', f.read())
    if not match:
        raise RuntimeError(f"{path}: no SBX_CLI_PROOF_PREFIX")
    return match.group(1)


ffi = FFI()
ffi.cdef(read_cdef(HEADER))
lib: Any = ffi.dlopen(None)  # the header's constants and enum values (no symbols are looked up)

MAGIC: int = lib.SBX_CLI_MAGIC
VERSION: int = lib.SBX_CLI_VERSION
MAX_FDS: int = lib.SBX_CLI_MAX_FDS
MAX_REQUEST: int = lib.SBX_CLI_MAX_REQUEST
MAX_ANSWER: int = lib.SBX_CLI_MAX_ANSWER
N_RLIMITS: int = lib.SBX_CLI_N_RLIMITS
STATUS: int = lib.SBX_CLI_STATUS
FALLBACK: int = lib.SBX_CLI_FALLBACK
SIGNAL: int = lib.SBX_CLI_SIGNAL
DIE_WITH_PARENT: int = lib.SBX_CLI_DIE_WITH_PARENT
ACK: int = lib.SBX_CLI_ACK
PLAN: int = lib.SBX_CLI_PLAN
PLAN_DIE_WITH_PARENT: int = lib.SBX_CLI_PLAN_DIE_WITH_PARENT
CHALLENGE: int = lib.SBX_CLI_CHALLENGE
PROOF: int = lib.SBX_CLI_PROOF
ERROR: int = lib.SBX_CLI_ERROR
SECRET_SIZE: int = lib.SBX_CLI_SECRET_SIZE
MAX_PROOF: int = lib.SBX_CLI_MAX_PROOF
PROOF_PREFIX: str = _proof_prefix()
REQUEST_SIZE: int = ffi.sizeof("struct sbx_cli_request")
FRAME_SIZE: int = ffi.sizeof("struct sbx_cli_frame")
PLAN_SIZE: int = ffi.sizeof("struct sbx_cli_plan")
RLIM_INFINITY = (1 << 64) - 1  # as the wire carries it


@dataclass(frozen=True)
class Request:
    """One client's command line: argv (argv[0] as the client was invoked),
    its cwd (as text; the server uses the client's own cwd), environment,
    fd numbers, the identity of the client's executable, its signal mask and
    its hard limits (by RLIMIT_* number; RLIM_INFINITY: none)."""

    argv: list[bytes]
    cwd: bytes
    environ: list[bytes]
    fd_numbers: list[int]
    exe: tuple[int, int, int]  # st_dev, st_ino, st_mtime_ns
    sigmask: int = 0  # the client's signal mask (bit N-1: signal N) from before it sent this
    rlim_max: tuple[int, ...] = (RLIM_INFINITY,) * N_RLIMITS


def parse_request(data: bytes) -> Request:
    """The request in `data` (one datagram), checked whole: WireError if anything is off."""
    if len(data) < REQUEST_SIZE:
        raise WireError(f"a request of {len(data)} bytes is shorter than its header ({REQUEST_SIZE})")
    h = ffi.cast("struct sbx_cli_request *", ffi.from_buffer(data))
    if h.magic != MAGIC or h.version != VERSION:
        raise WireError(f"magic/version {h.magic:#x}/{h.version} (expected {MAGIC:#x}/{VERSION})")
    if h.nfds > MAX_FDS or h.argc < 1:
        raise WireError(f"{h.nfds} fds, {h.argc} arguments")
    head = REQUEST_SIZE + 4 * h.nfds
    if len(data) != head + h.size:
        raise WireError(f"a request of {len(data)} bytes, its header says {head + h.size}")
    numbers = list(ffi.from_buffer("int32_t[]", data[REQUEST_SIZE:head])) if h.nfds else []
    strings = data[head:].split(b"\0")
    if strings[-1:] != [b""] or len(strings) - 1 != h.argc + 1 + h.envc:
        raise WireError(f"{len(strings) - 1} strings, the header says {h.argc + 1 + h.envc}")
    argv = [strings[0], *strings[2:h.argc + 1]]
    return Request(argv=argv, cwd=strings[1], environ=strings[h.argc + 1:-1], fd_numbers=numbers,
                   exe=(int(h.exe_dev), int(h.exe_ino), int(h.exe_mtime)), sigmask=int(h.sigmask),
                   rlim_max=tuple(int(v) for v in h.rlim_max))


def ticket_of(data: bytes) -> tuple[int, bytes]:
    """The (ticket, secret) a request in `data` carries (sandbox-launch's handoff; the CLI's are 0 and
    zeros). WireError if `data` is not a request of this version."""
    if len(data) < REQUEST_SIZE:
        raise WireError(f"a request of {len(data)} bytes is shorter than its header ({REQUEST_SIZE})")
    h = ffi.cast("struct sbx_cli_request *", ffi.from_buffer(data))
    if h.magic != MAGIC or h.version != VERSION:
        raise WireError(f"magic/version {h.magic:#x}/{h.version} (expected {MAGIC:#x}/{VERSION})")
    return int(h.ticket), bytes(ffi.buffer(h.secret))


def announced_fds(data: bytes) -> int:
    """How many fds the request in `data` announces (its header's nfds): checked against the fds
    that came before anything else looks at it. WireError if `data` is shorter than a header."""
    if len(data) < REQUEST_SIZE:
        raise WireError(f"a request of {len(data)} bytes is shorter than its header ({REQUEST_SIZE})")
    return int(ffi.cast("struct sbx_cli_request *", ffi.from_buffer(data)).nfds)


def frame(kind: int, value: int = 0) -> bytes:
    """One frame (struct sbx_cli_frame)."""
    f = ffi.new("struct sbx_cli_frame *", {"kind": kind, "value": value})
    return bytes(ffi.buffer(f))


def parse_frame(data: bytes) -> tuple[int, int]:
    """(kind, value) of a frame; WireError if it is not one."""
    if len(data) != FRAME_SIZE:
        raise WireError(f"a frame of {len(data)} bytes (expected {FRAME_SIZE})")
    f = ffi.cast("struct sbx_cli_frame *", ffi.from_buffer(data))
    return int(f.kind), int(f.value)


def plan_answer(blob: bytes, argv: list[bytes], env: list[bytes], pass_fds: list[int], *, die_with_parent: bool,
                before: bytes = b"", after: bytes = b"") -> bytes:
    """A PLAN answer (struct sbx_cli_plan and what follows it): the client runs `blob` itself,
    `argv` with the environment `env`, its fds `pass_fds` open in the command; `before` and
    `after` are written on its stderr before and once the sandbox has started."""
    strings = b"".join(s + b"\0" for s in (*argv, *env))
    head = ffi.new("struct sbx_cli_plan *", {
        "kind": PLAN, "flags": PLAN_DIE_WITH_PARENT if die_with_parent else 0, "npass": len(pass_fds),
        "blob_size": len(blob), "argc": len(argv), "envc": len(env), "strings_size": len(strings),
        "before_size": len(before), "after_size": len(after)})
    fds = ffi.new("int32_t[]", pass_fds) if pass_fds else b""
    return b"".join((bytes(ffi.buffer(head)), bytes(ffi.buffer(fds)) if pass_fds else b"", blob, strings, before,
                     after))
