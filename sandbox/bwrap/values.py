"""Reading option values as bwrap reads them: numbers, fds and paths.

Numbers follow C's strtol/strtoul (leading blanks, a sign, the whole text
consumed), so a value bwrap refuses is refused here with the same message.
The fds given to `--args`, `--file`, ... are read to the end and closed,
as bwrap does while it parses.
"""

from __future__ import annotations

import os
import posixpath
import re

from .state import MAX_ID, MAX_PERMS, MAX_TMPFS_BYTES, BwrapArgsError, ParseState

# ---------------------------------------------------------------- number syntax (C strtol rules)

# Patterns compiled (and cached by re) when a number is first read, not at import: most command lines
# have none, and compiling these three is ~0.25 ms of a direct run.
_SPACE = "[ \t\n\v\f\r]*"
_DECIMAL = _SPACE + r"([+-]?)([0-9]+)"
_OCTAL = _SPACE + r"([+-]?)([0-7]+)"
_SIZE = r"0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*"


def _c_number(pattern: str, text: str, base: int) -> int | None:
    """What strtol/strtoul would read from the whole of `text`, or None."""
    m = re.fullmatch(pattern, text)
    if m is None:
        return None
    value = int(m.group(2), base)
    return -value if m.group(1) == "-" else value


def parse_int(text: str, what: str, option: str) -> int:
    """A non-negative decimal (an fd, uid or gid), as bwrap reads it."""
    value = _c_number(_DECIMAL, text, 10)
    if value is None or not 0 <= value <= MAX_ID:
        raise BwrapArgsError(f"Invalid {what}: {text}", option, text)
    return value


def parse_octal(text: str, option: str) -> int:
    """A mode (--perms, --chmod): octal, at most 07777."""
    value = _c_number(_OCTAL, text, 8)
    if value is None or not 0 <= value <= MAX_PERMS:
        raise BwrapArgsError(f"{option} takes an octal argument <= 07777", option, text)
    return value


def parse_size(text: str) -> int:
    """A --size in bytes: C's base prefixes (0x, 0), non-zero, at most bwrap's tmpfs bound."""
    if not re.fullmatch(_SIZE, text):
        raise BwrapArgsError("--size takes a non-zero number of bytes", "--size", text)
    value = int(text, 16) if text[:2] in ("0x", "0X") else int(text, 8 if text.startswith("0") else 10)
    if value == 0 or value >= 2**64:
        raise BwrapArgsError("--size takes a non-zero number of bytes", "--size", text)
    if value > MAX_TMPFS_BYTES:
        raise BwrapArgsError(f"--size (for tmpfs) is limited to {MAX_TMPFS_BYTES}", "--size", text)
    return value


def parse_positive(text: str, option: str) -> int:
    """A --limit-* value: a positive decimal."""
    if not re.fullmatch("[0-9]+", text) or int(text) == 0:
        raise BwrapArgsError(f"{option} takes a positive integer", option, text)
    return int(text)


def parse_cpus(text: str, option: str) -> float:
    """A --limit-cpu-cores value: a positive decimal number of CPUs (0.5, 2)."""
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)?", text) or float(text) == 0:
        raise BwrapArgsError(f"{option} takes a positive number of CPUs, e.g. 0.5", option, text)
    return float(text)


# ---------------------------------------------------------------- file descriptors

def consume_fd(st: ParseState, option: str, text: str, failure: str) -> bytes:
    """Read fd `text` to the end and close it, as bwrap does with the fds it is given.
    An unreadable or already consumed fd raises "<failure>: <strerror>" (bwrap's EBADF)."""
    fd = parse_int(text, "fd", option)
    if fd in st.consumed:
        raise BwrapArgsError(f"{failure}: Bad file descriptor (fd {fd} was already used)", option, fd)
    chunks = []
    try:
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    except OSError as exc:
        raise BwrapArgsError(f"{failure}: {exc.strerror}", option, fd) from None
    _release_fd(fd)
    st.consumed.append(fd)
    return b"".join(chunks)


def _release_fd(fd: int) -> None:
    """Close `fd`; a stdio fd becomes /dev/null so its number is not reused."""
    if fd > 2:
        os.close(fd)
        return
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, fd, inheritable=True)
    os.close(null)


def split_args(data: bytes) -> list[str]:
    """NUL-separated arguments; a final NUL is optional."""
    if not data:
        return []
    items = data.split(b"\0")
    if items[-1] == b"":
        items.pop()
    return [os.fsdecode(item) for item in items]


# ---------------------------------------------------------------- paths

def dest_path(path: str) -> str:
    """A destination inside the sandbox; a relative one counts from '/'."""
    return path if path.startswith("/") else "/" + path


def source_path(st: ParseState, path: str) -> str:
    """A host source path: relative to the caller's cwd; '..' resolved like realpath."""
    full = path if path.startswith("/") else posixpath.join(st.cwd, path)
    if ".." in full.split("/"):
        full = os.path.realpath(full)
    return full
