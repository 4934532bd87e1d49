"""The session command line's pure parts, no privileges, no process: session ids, the
`sandbox exec` command line, the holder's check of an exec request, and the message framing
over a socketpair (bounds, fds)."""

from __future__ import annotations

import os
import socket
import struct
from typing import Any

import pytest

from sandbox.session import clisock
from sandbox.session.climain import exec_request as command_line
from sandbox.session.clisock import Refused
from sandbox.session.holder import exec_request


@pytest.mark.parametrize("ident", ["a", "abc-1.2_3", "A" * 64, "0f3a9c1d"])
def test_good_ids(ident: str) -> None:
    assert clisock.check_id(ident) == ident


@pytest.mark.parametrize("ident", ["", "-x", ".x", "_x", "a/b", "../x", "a b", "A" * 65, "x\0", "é"])
def test_bad_ids_are_refused(ident: str) -> None:
    with pytest.raises(Refused, match="bad session id"):
        clisock.check_id(ident)


def test_the_exec_command_line() -> None:
    request, ident = command_line(["--cwd", "/w", "--env", "A=1", "--env=B=2=3", "s1", "--", "sh", "-c", "--env"])
    assert ident == "s1"
    assert request == {"op": "exec", "argv": ["sh", "-c", "--env"], "cwd": "/w", "env": {"A": "1", "B": "2=3"}}
    assert command_line(["s1", "true"]) == ({"op": "exec", "argv": ["true"]}, "s1")


def test_user_is_passed() -> None:
    assert command_line(["--user", "nobody", "s1", "true"])[0]["user"] == "nobody"


@pytest.mark.parametrize(("args", "words"), [
    ([], "usage"), (["s1"], "no COMMAND"), (["s1", "--"], "no COMMAND"), (["--env", "A", "s1", "true"], "NAME=VALUE"),
    (["--bogus", "s1", "true"], "unknown option --bogus"), (["--cwd"], "needs a value"),
    (["../x", "true"], "bad session id"),
])
def test_bad_exec_command_lines(args: list[str], words: str) -> None:
    with pytest.raises(Refused, match=words):
        command_line(args)


def test_an_exec_request_is_checked_field_by_field() -> None:
    good: dict[str, Any] = {"op": "exec", "argv": ["true"], "cwd": "/", "env": {"A": "b"}, "user": "nobody"}
    assert exec_request(good, (0, 1, 2)) == (["true"], "/", {"A": "b"}, "nobody")
    bad: list[tuple[dict[str, Any], str]] = [
        ({**good, "stdin": 0}, "unknown fields"),
        ({**good, "argv": []}, "argv"),
        ({**good, "argv": "true"}, "argv"),
        ({**good, "argv": ["a\0"]}, "argv"),
        ({**good, "argv": [1]}, "argv"),
        ({**good, "cwd": 3}, "cwd"),
        ({**good, "env": {"A=B": "c"}}, "env"),
        ({**good, "env": {"": "c"}}, "env"),
        ({**good, "env": {"A": 1}}, "env"),
        ({**good, "user": ""}, "user"),
        ({**good, "user": 0}, "user"),
    ]
    for message, words in bad:
        with pytest.raises(Refused, match=words):
            exec_request(message, (0, 1, 2))
    for fds in ((), (0,), (0, 1), (0, 1, 2, 3)):
        with pytest.raises(Refused, match=f"not {len(fds)}"):
            exec_request(good, fds)


def test_framing_round_trip_and_bounds() -> None:
    a, b = socket.socketpair()
    with a, b:
        r, w = os.pipe()
        try:
            clisock.send(a, {"op": "exec", "argv": ["x" * 1000]}, (r, w, w))
            message, fds = clisock.receive(b, 3)
            assert message == {"op": "exec", "argv": ["x" * 1000]} and len(fds) == 3
            for fd in fds:
                os.close(fd)
            clisock.send(a, {"op": "info"}, (r,))
            with pytest.raises(Refused, match="not at most 0"):
                clisock.receive(b, 0)
            a.sendall(struct.pack("!I", clisock.MAX_MESSAGE + 1))
            with pytest.raises(Refused, match="more than"):
                clisock.receive(b, 0)
        finally:
            os.close(r)
            os.close(w)
    with pytest.raises(Refused, match="more than"):
        clisock.send(socket.socket(), {"x": "y" * clisock.MAX_MESSAGE})


def test_eof_and_cut_messages() -> None:
    a, b = socket.socketpair()
    with b:
        a.sendall(b"\x00\x00\x00\x05{}")
        a.close()
        with pytest.raises(Refused, match="ended inside"):
            clisock.receive(b, 0)
    a, b = socket.socketpair()
    with b:
        a.close()
        assert clisock.receive(b, 0) == (None, [])
