"""_core/peer.py and _core/fdpass.py: a message's sender, held by its pidfd, and the descent check built on it."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator

import pytest

from sandbox._core.fdpass import SO_PASSPIDFD, recv_with_credentials
from sandbox._core.peer import Peer, Unverified


@pytest.fixture(name="pair")
def passing_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """(sender's end, receiver's end with SO_PASSCRED and SO_PASSPIDFD)."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    try:
        b.setsockopt(socket.SOL_SOCKET, SO_PASSPIDFD, 1)
    except OSError:
        pytest.skip("no SO_PASSPIDFD here (Linux 6.5+)")
    b.settimeout(10)
    with a, b:
        yield a, b


def sender_of(receiver: socket.socket) -> Peer:
    _, fds, _, creds, pidfd = recv_with_credentials(receiver, 64, 1)
    assert creds is not None and not fds
    return Peer.of_sender(creds, pidfd)


def child(sock: socket.socket, stay: bool = True) -> int:
    """A child that sends one message on `sock`, then waits to be killed (`stay`) or exits."""
    pid = os.fork()
    if pid == 0:
        try:
            sock.send(b"x")
            while stay:
                signal.pause()
        finally:
            os._exit(0)
    return pid


def test_a_message_brings_its_senders_pid_uid_and_pidfd(pair: tuple[socket.socket, socket.socket]) -> None:
    pair[0].send(b"x")
    peer = sender_of(pair[1])
    try:
        assert (peer.pid, peer.uid) == (os.getpid(), os.getuid()) and peer.pidfd >= 0
        assert os.get_inheritable(peer.pidfd) is False
        peer.check_owner()
        me = os.pidfd_open(os.getpid())
        try:
            assert peer.descends_from(os.getpid(), me)  # itself
            assert not peer.descends_from(os.getpid() + 1_000_000, me)
        finally:
            os.close(me)
    finally:
        peer.close()


def test_a_child_descends_from_us_and_we_do_not_from_it(pair: tuple[socket.socket, socket.socket]) -> None:
    pid = child(pair[0])
    me, it = os.pidfd_open(os.getpid()), os.pidfd_open(pid)
    peer = sender_of(pair[1])
    try:
        assert peer.pid == pid and peer.descends_from(os.getpid(), me)
        pair[0].send(b"x")
        ours = sender_of(pair[1])
        assert not ours.descends_from(pid, it)
        ours.close()
    finally:
        peer.close()
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(me)
        os.close(it)


def test_an_ancestor_that_has_ended_is_no_ancestor(pair: tuple[socket.socket, socket.socket]) -> None:
    pid = child(pair[0])
    peer = sender_of(pair[1])
    fd = os.pidfd_open(os.getpid())
    os.close(fd)  # a pidfd number that names nothing: the ancestor is not confirmed
    try:
        assert not peer.descends_from(os.getpid(), fd)
    finally:
        peer.close()
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_a_sender_reaped_before_it_was_read_is_not_judged(pair: tuple[socket.socket, socket.socket]) -> None:
    pid = child(pair[0], stay=False)
    os.waitpid(pid, 0)
    _, _, _, creds, pidfd = recv_with_credentials(pair[1], 64, 1)
    assert creds is not None and creds[0] == pid
    peer = Peer.of_sender(creds, pidfd)  # this kernel's pidfd of a reaped process, or none (-1) before 6.16
    me = os.pidfd_open(os.getpid())
    try:
        with pytest.raises(Unverified, match=f"pid {pid} has ended|pid {pid}: the kernel gave no pidfd"):
            peer.descends_from(os.getpid(), me)
    finally:
        peer.close()
        os.close(me)


def test_no_pidfd_proves_nothing() -> None:
    peer = Peer.of_sender((os.getpid(), os.getuid(), os.getgid()), -1)
    with pytest.raises(Unverified, match="gave no pidfd"):
        peer.descends_from(os.getpid(), -1)
    peer.close()


def test_before_scm_pidfd_the_sender_is_opened_by_its_pid() -> None:
    """A kernel before 6.5 attaches no pidfd: `by_pid` opens one from the pid as the message is read, so a
    live sender is held (and checked) as it would be with SCM_PIDFD, and one already reaped is never
    confirmed (unless its pid is taken in that instant: a pid's strength, what the kernel gives there)."""
    me = Peer.of_sender((os.getpid(), os.getuid(), os.getgid()), -1, by_pid=True)
    try:
        assert me.pidfd >= 0
        me.check_owner()
        assert me.descends_from(os.getpid(), me.pidfd)
    finally:
        me.close()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    gone = Peer.of_sender((pid, os.getuid(), os.getgid()), -1, by_pid=True)
    try:
        assert gone.pidfd == -1  # reaped: no pid to open (a reuse this soon would need 4 million forks)
        with pytest.raises(Unverified):
            gone.descends_from(os.getpid(), -1)
    finally:
        gone.close()
    assert Peer.of_sender((os.getpid(), os.getuid(), os.getgid()), -1).pidfd == -1  # without by_pid: none
