"""The task broker's wire (sandbox.task.wire): what a message may be, checked before and while it is parsed."""

from __future__ import annotations

import time

import pytest

from sandbox.task import wire


@pytest.mark.parametrize(("data", "problem"), [
    (b"[" * 100_000 + b"]" * 100_000, "nested deeper than 16"),
    (b"[" * 17 + b"]" * 17, "nested deeper than 16"),
    (b'{"a": ' + b"{" * 17, "nested deeper than 16"),  # unclosed counts too
    (b'{"a": "\\"' + b"[" * 30 + b'"]', "not JSON"),  # the scan is not fooled into a string and out of it
    (b"x" * (wire.MAX_MESSAGE + 1), "larger than"),
    (b'{"a": "\xff"}', "not UTF-8"),
    (b'{"a": ', "not JSON"),
    (b"[1]", "not a JSON object"),
    (b'{"a": ' + b"9" * 5000 + b"}", "not JSON"),  # an int past Python's digit limit
])
def test_a_bad_message_is_refused_naming_the_problem(data: bytes, problem: str) -> None:
    with pytest.raises(wire.MessageError, match=problem):
        wire.parse(data)


def test_brackets_in_strings_are_not_depth() -> None:
    assert wire.parse(b'{"a": "' + b"[" * 1000 + b'", "b": "\\\\", "c": [[[]]]}')["b"] == "\\"
    assert wire.parse(b'{"d": ' + b"[" * 15 + b"]" * 15 + b"}")  # 16 levels: the most a message may nest


def test_the_scan_is_linear() -> None:
    # A long unterminated string of escaped quotes is skipped once, not rescanned from each quote.
    start = time.monotonic()
    with pytest.raises(wire.MessageError):
        wire.parse(b'{"a": "' + b'\\"' * 400_000 + b"[" * 20)
    assert time.monotonic() - start < 2
