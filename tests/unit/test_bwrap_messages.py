"""bwrap's exit codes and stderr lines, decoded without running bwrap."""

from __future__ import annotations

import pytest

from sandbox.backends.bwrap.messages import decode_exit_code, last_bwrap_line


@pytest.mark.parametrize("code, expected", [(0, 0), (1, 1), (128, 128), (129, -1), (137, -9), (143, -15),
                                            (192, -64), (193, 193), (255, 255)])
def test_exit_code_mapping(code: int, expected: int) -> None:
    # bwrap reports death by signal N as 128+N; N runs up to 64 (SIGRTMAX).
    assert decode_exit_code(code) == expected


def test_last_bwrap_line() -> None:
    data = b"noise\nbwrap: first\nmore\nbwrap: Can't mkdir /x: Read-only file system\n"
    assert last_bwrap_line(data) == "Can't mkdir /x: Read-only file system"
    assert last_bwrap_line(b"nothing here\n") is None
