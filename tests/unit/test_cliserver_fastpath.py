"""cliserver/fastpath.py: which command lines a plan carries, and --args read without taking it.

The server reads a client's --args fds before it knows whether a worker will
run the command line after all; a worker must then find them as the client
left them. These check that reading (a file from its offset, a pipe whose
writers are gone), that nothing else is read (a pipe still open for writing,
a socket), that take() leaves each as the Python CLI's read to the end would,
and the grammar's walk that finds the command line's own --args.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from sandbox._core import cliwire as wire
from sandbox.bwrap.grammar import BY_NAME, OPTIONS
from sandbox.cliserver import fastpath


def _pipe_with(data: bytes, close_writer: bool = True) -> tuple[int, int]:
    r, w = os.pipe()
    os.write(w, data)
    if close_writer:
        os.close(w)
        w = -1
    return r, w


def test_a_file_is_read_from_its_offset_and_taken_to_its_end(tmp_path: Path) -> None:
    path = tmp_path / "args"
    path.write_bytes(b"skip\0--a\0b\0")
    fd = os.open(path, os.O_RDONLY)
    try:
        os.lseek(fd, 5, os.SEEK_SET)
        f = fastpath._peek(9, fd)
        assert f.data == b"--a\0b\0" and os.lseek(fd, 0, os.SEEK_CUR) == 5  # read, not taken
        fastpath.take([f])
        assert os.lseek(fd, 0, os.SEEK_CUR) == path.stat().st_size
    finally:
        os.close(fd)


def test_a_pipe_whose_writers_are_gone_is_read_then_taken() -> None:
    r, _ = _pipe_with(b"--a\0b\0")
    try:
        f = fastpath._peek(9, r)
        assert f.data == b"--a\0b\0"
        copy = fastpath._peek(9, r)  # still there: tee copied it
        assert copy.data == f.data
        fastpath.take([f])
        assert os.read(r, 16) == b""  # taken, as a read to the end takes it
    finally:
        os.close(r)


def test_a_larger_pipe_is_read_whole() -> None:
    import fcntl

    r, w = os.pipe()
    fcntl.fcntl(w, fastpath.F_SETPIPE_SZ, 1 << 18)
    data = b"x" * (fastpath.PIPE_PAGE + 4096)
    os.write(w, data)
    os.close(w)
    try:
        assert fastpath._peek(9, r).data == data
    finally:
        os.close(r)


def test_a_pipe_that_may_still_be_written_to_goes_to_a_worker() -> None:
    r, w = _pipe_with(b"--a\0", close_writer=False)
    try:
        with pytest.raises(fastpath.Worker, match="may still be written to"):
            fastpath._peek(9, r)
        assert os.read(r, 16) == b"--a\0"  # untouched
    finally:
        os.close(r)
        os.close(w)


def test_a_socket_goes_to_a_worker() -> None:
    a, b = socket.socketpair()
    with a, b:
        b.send(b"--a\0")
        with pytest.raises(fastpath.Worker, match="neither a file nor a pipe"):
            fastpath._peek(9, a.fileno())
        assert a.recv(16) == b"--a\0"


@pytest.mark.parametrize(("args", "found"), [
    (["--ro-bind", "/", "/", "--args", "5", "true"], [4]),
    (["--args", "5", "--args", "6", "--", "true"], [1, 3]),
    (["--setenv", "X", "--args", "--args", "5", "true"], [4]),  # the first --args is a value
    (["--ro-bind", "/", "/", "true", "--args", "5"], []),  # the command's own argument
])
def test_the_command_lines_own_args_fds(args: list[str], found: list[int]) -> None:
    assert fastpath._top_level_args(args, [0, 1, 2, 5, 6]) == found


@pytest.mark.parametrize(("args", "why"), [
    (["--info-fd", "5", "true"], "--info-fd is not carried by a plan"),
    (["--no-such-option", "true"], "--no-such-option is not carried by a plan"),
    (["--args", "7", "true"], "--args 7 is not an fd of the client's"),  # not one it sent
    (["--args", "0", "true"], "--args 0 is not an fd of the client's above stdio"),  # the CLI makes it /dev/null
    (["--ro-bind", "/"], "--ro-bind lacks its value"),
])
def test_what_needs_a_worker_before_anything_is_read(args: list[str], why: str) -> None:
    with pytest.raises(fastpath.Worker, match=why):
        fastpath._top_level_args(args, [0, 1, 2, 5])


def test_the_answer_key_leaves_out_the_signal_mask() -> None:
    head = wire.ffi.new("struct sbx_cli_request *", {"magic": wire.MAGIC, "version": wire.VERSION, "argc": 1,
                                                     "size": 4, "sigmask": 1 << 14})
    data = bytes(wire.ffi.buffer(head)) + b"a\0/\0"
    other = bytearray(data)
    other[wire.ffi.offsetof("struct sbx_cli_request", "sigmask")] ^= 0xFF
    assert fastpath._key(data) == fastpath._key(bytes(other)) and fastpath._key(data) != fastpath._key(data[:-1])


@pytest.mark.parametrize("name", [o.name for o in OPTIONS if "FD" in o.metavar or o.name == "--args"])
def test_an_option_of_an_args_file_that_names_an_fd_needs_a_worker(name: str) -> None:
    """Parsing it in the server would read the server's fd of that number, not the client's."""
    option = BY_NAME[name]
    words = ["--unshare-pid", name, *(["3"] * option.nargs), "true"]
    f = fastpath.ArgsFile(9, -1, "\0".join(words).encode(), pipe=True)
    with pytest.raises(fastpath.Worker, match=f"^{name} in its --args 9 file is not carried by a plan"):
        fastpath._screen_file(f)


def test_an_args_file_of_pure_options_is_planned() -> None:
    f = fastpath.ArgsFile(9, -1, b"--ro-bind\0/\0/\0--unshare-pid\0--\0--file\0" + b"3\0/x\0", pipe=True)
    fastpath._screen_file(f)  # what follows the options is not applied (bwrap ignores it there)
