"""The Template server's protocol (csrc/core/sandbox.h, struct sbx_request and
after): one request message per sandbox, and the server's answer to a store.
The caller sends a request and reads its sandbox's report through C
(csrc/core/wire.c: sbx_template_send, sbx_template_report, which check each
report whole).

Every struct is the cdef's, built and read through cffi by field name, as
the native blob is (_core/blob.py): its layout has one source.
The server checks a request whole (csrc/core/wire.c, sbx_parse_request and
sbx_check_store, which tests/unit/test_wire_template.py calls on what this
module builds); its version (SBX_REQ_VERSION) says what follows the header.
"""

from __future__ import annotations

import fcntl
import functools
import os
from collections.abc import Sequence
from typing import Any

from ..._core.binding import ffi, lib
from ..._core.blob import serialize
from ...errors import RequestTooLargeError
from ...plan import Plan
from ...warm_overlay import sandbox_newroot

REQUEST_SIZE = ffi.sizeof("struct sbx_request")
# Requests larger than this go in a memfd (SBX_REQ_IN_MEMFD) rather than in
# the message itself: one SOCK_SEQPACKET message carries at most the send
# buffer (net.core.wmem_default, 208 KiB by default), the server reads at
# most MAX_MSG (256 KiB, csrc/template/template.h). A smaller one refused for its size
# (a host with a smaller send buffer) is sent so too.
INLINE_MAX = 128 * 1024
FAILURE_SIZE = ffi.sizeof("struct sbx_report")

Failure = tuple[int, int, int, int]  # step, op, err, detail


@functools.lru_cache(maxsize=512)
def sandbox_blob(plan: Plan) -> bytes:
    """A sandbox plan's blob: its ops apply in place, on the copy of the template's root
    (or, for an Overlay, on a new root pivoted into: sandbox.warm_overlay)."""
    return serialize(plan, sandbox_newroot(plan))


def header(*, blob_len: int, argc: int = 0, envc: int = 0, n_pass: int = 0, flags: int = 0,
           stdio_mask: int = 0, n_cgroup: int = 0) -> bytes:
    """A struct sbx_request, its fields set by name."""
    head = ffi.new("struct sbx_request *", {
        "magic": lib.SBX_REQ_MAGIC, "version": lib.SBX_REQ_VERSION, "blob_len": blob_len, "argc": argc,
        "envc": envc, "n_pass": n_pass, "flags": flags, "stdio_mask": stdio_mask, "n_cgroup": n_cgroup})
    return bytes(ffi.buffer(head))


def request(blob: bytes, argv: Sequence[str], env: tuple[str, ...], targets: Sequence[int], *,
            join_netns: bool, stdio_mask: int, n_cgroup: int = 0, cgroup_next: bool = False) -> bytes:
    """One request message (the fds travel beside it, see csrc/core/sandbox.h).
    An empty `blob` names the one the server stored; `n_cgroup` entry fds of
    the sandbox's cgroups come after the network namespace's (`cgroup_next`:
    of the standby that replaces the one taking it, SBX_REQ_CGROUP_NEXT)."""
    if not blob:  # the stored plan's: the same few commands, again and again
        return _stored_request(tuple(argv), env, tuple(targets), join_netns, stdio_mask, n_cgroup, cgroup_next)
    return _request(blob, argv, env, targets, join_netns, stdio_mask, n_cgroup, cgroup_next)


@functools.lru_cache(maxsize=256)
def _stored_request(argv: tuple[str, ...], env: tuple[str, ...], targets: tuple[int, ...], join_netns: bool,
                    stdio_mask: int, n_cgroup: int, cgroup_next: bool) -> bytes:
    return _request(b"", argv, env, targets, join_netns, stdio_mask, n_cgroup, cgroup_next)


def _request(blob: bytes, argv: Sequence[str], env: tuple[str, ...], targets: Sequence[int], join_netns: bool,
             stdio_mask: int, n_cgroup: int, cgroup_next: bool) -> bytes:
    strings = b"".join([*(os.fsencode(s) + b"\0" for s in argv), _environment(env)])
    head = header(blob_len=len(blob), argc=len(argv), envc=len(env), n_pass=len(targets),
                  flags=(lib.SBX_REQ_JOIN_NETNS if join_netns else 0) | (lib.SBX_REQ_CGROUP_NEXT if cgroup_next else 0),
                  stdio_mask=stdio_mask, n_cgroup=n_cgroup)
    c_targets = ffi.new("uint32_t[]", list(targets)) if targets else None
    return b"".join((head, blob, b"\0" * (-len(blob) % 8),
                     bytes(ffi.buffer(c_targets)) if c_targets is not None else b"", strings))


def store_request(blob: bytes, flags: int, n_cgroup: int = 0) -> bytes:
    """The message that stores `blob` in the server (SBX_REQ_STORE_BLOB and
    `flags`; with SBX_REQ_STANDBY, `n_cgroup` entry fds per standby follow)."""
    return header(blob_len=len(blob), flags=lib.SBX_REQ_STORE_BLOB | flags, n_cgroup=n_cgroup) + blob


@functools.lru_cache(maxsize=64)
def _environment(env: tuple[str, ...]) -> bytes:
    return b"".join(os.fsencode(s) + b"\0" for s in env)


def in_memfd(msg: bytes) -> tuple[bytes, int]:
    """`msg` as a request in a sealed memfd (SBX_REQ_IN_MEMFD): the header to
    send in its place, and the memfd to send as the last of its fds (the
    caller closes it once sent). RequestTooLargeError past SBX_REQ_MAX_SIZE."""
    if len(msg) > lib.SBX_REQ_MAX_SIZE:
        raise RequestTooLargeError("a Template request's size in bytes (its argv, environment and plan)", len(msg),
                                   lib.SBX_REQ_MAX_SIZE)
    fd = os.memfd_create("sandbox-request", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(msg)
        while view:
            view = view[os.write(fd, view):]
        # the server takes a memfd whose size and content are fixed (csrc/template/template_request.c)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
                    | fcntl.F_SEAL_SEAL)
    except BaseException:
        os.close(fd)
        raise
    return header(blob_len=0, flags=lib.SBX_REQ_IN_MEMFD), fd


def _read(ctype: str, data: bytes) -> Any:
    return ffi.from_buffer(ctype, data)  # read in place: `data` is exactly one record


def parse_failure(data: bytes) -> Failure | None:
    """A struct sbx_report (step, op, err, detail), or None if `data` is not one."""
    if len(data) != FAILURE_SIZE:
        return None
    r = _read("struct sbx_report *", data)
    return r.step, r.op, r.err, r.detail
