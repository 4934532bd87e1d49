"""The socket between the `sandbox session`/`sandbox exec` commands and a
session's holder (holder.py): where it is, its messages, and who may talk.

Where: the caller's per-user directory, the CLI server's
(`cliserver.socket_dir()`: /run/user/UID/sandbox-cli, root's
/run/sandbox-cli-0, else /tmp/sandbox-cli-UID), made with mode 0700 (only
its last component) and opened as an fd, checked as ours and 0700, never
through a link (`cliserver.owndir`). Everything in it is named beneath
that fd: `session-ID.sock` (mode 0600 from its bind) and `session-ID.log`.
$SANDBOX_SESSION_DIR names another directory (checked the same way: a
test's own, or sessions kept apart from the CLI server's files).

Messages: a 4-byte big-endian length, then that many bytes of one JSON
object, at most MAX_MESSAGE. The first message of an exec carries the
caller's stdin, stdout and stderr by SCM_RIGHTS; fds on any other message,
or more than asked for, are closed on receipt (the kernel drops those a
plain read does not take).

Who: each side checks the other's credentials from the kernel
(SO_PEERCRED, confirmed through SO_PEERPIDFD): the same uid, the same
user, pid and mount namespaces and root as this process, and the same
no_new_privs, seccomp mode and seccomp filter count, so that neither
another user nor a process inside a sandbox (which has at least a pid and
a mount namespace of its own, even when it runs as the same uid) nor one
under a seccomp filter or no_new_privs (as Landlock needs) has a command
run for it outside its confinement, and a client never hands its terminal
to a socket someone else listens on. What /proc does not show is not
compared: a Landlock domain applied by root without no_new_privs, an LSM
label (the CLI server's worker path goes further: cliserver/peer.py).
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import struct

from .._core.fdpass import recv_fds, send_fds
from .._core.peer import Peer, Unverified, status_fields
from ..cliserver import socket_dir
from ..cliserver.owndir import open_own_dir

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (type checkers read the name)
if TYPE_CHECKING:
    from typing import Any

MAX_MESSAGE = 1 << 20  # bytes of JSON: the argv and environment a sandbox.spawn takes
MAX_FDS = 3
HEAD = struct.Struct("!I")
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
NAMESPACES = ("user", "pid", "mnt")
CONFINEMENT = ("NoNewPrivs", "Seccomp", "Seccomp_filters")  # /proc/PID/status fields
EXIT_SETUP = 125
DIR_ENV = "SANDBOX_SESSION_DIR"


class Refused(Exception):
    """A peer, a message or a path this side does not accept; the message says why."""


def check_id(text: str) -> str:
    """`text` if it can name a session (letters, digits, `_.-`, at most 64), else Refused."""
    if not ID_PATTERN.match(text):
        raise Refused(f"bad session id {text!r}: letters, digits, '_', '.' and '-', at most 64, "
                      "not starting with '_', '.' or '-'")
    return text


def socket_name(ident: str) -> str:
    """The socket's name in the directory."""
    return f"session-{ident}.sock"


def log_name(ident: str) -> str:
    """The holder's log's name in the directory."""
    return f"session-{ident}.log"


def open_dir(create: bool) -> int:
    """An fd of the per-user directory, checked (ours, 0700, no link). `create`: make its last
    component if missing. OSError if it is not usable."""
    path = session_dir()
    if create:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
    return open_own_dir(path)


def _default_dir() -> str:
    return socket_dir()


def session_dir() -> str:
    """The directory of this user's sessions (not checked)."""
    return os.environ.get(DIR_ENV) or _default_dir()


def connect(directory: int, ident: str) -> tuple[socket.socket, Peer]:
    """A connection to the holder of session `ident` in the directory of fd `directory`, and the
    holder as a checked Peer (close it). FileNotFoundError: no such session; ConnectionRefusedError:
    its holder is gone; Refused: the name is not a socket of ours, or the listener is not ours."""
    name = socket_name(check_id(ident))
    st = os.stat(name, dir_fd=directory, follow_symlinks=False)
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.getuid():
        raise Refused(f"{name} is not a socket of ours (a planted file or link?)")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.connect(f"/proc/self/fd/{directory}/{name}")
        return sock, check_peer(sock)
    except BaseException:
        sock.close()
        raise


def check_peer(sock: socket.socket) -> Peer:
    """The peer of `sock` if it is this process's uid, in its user, pid and mount namespaces and
    root, confined as this process is (no_new_privs, seccomp mode and filter count); else Refused
    naming what differs."""
    try:
        peer = Peer.of(sock)
    except Unverified as exc:
        raise Refused(str(exc)) from None
    try:
        try:
            peer.check_owner()
        except Unverified as exc:
            raise Refused(str(exc)) from None
        theirs, ours = _world(peer), _world(None)
        for (what, value), (_, own) in zip(theirs, ours, strict=True):
            if value != own:
                raise Refused(f"pid {peer.pid} differs in its {what} ({value!r}, ours {own!r}): a sandbox?")
    except BaseException:
        peer.close()
        raise
    return peer


def _world(peer: Peer | None) -> list[tuple[str, str]]:
    """What must be equal between the two sides, of `peer` (None: this process), read through one
    fd of its /proc entry and confirmed afterwards (its pid not reused meanwhile): a sandbox has
    at least a pid and a mount namespace of its own, a chroot another root, and a process under
    a seccomp filter or no_new_privs (which Landlock needs) must not have a command run for it
    outside them."""
    try:
        d = os.open("/proc/self" if peer is None else f"/proc/{peer.pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            world = [(f"{ns} namespace", os.readlink(f"ns/{ns}", dir_fd=d)) for ns in NAMESPACES]
            root = os.stat("root", dir_fd=d)
            fields = status_fields(d)
        finally:
            os.close(d)
        if peer is not None:
            peer.confirm()
    except OSError as exc:
        raise Refused(f"pid {peer.pid if peer else os.getpid()}: its /proc entry cannot be read "
                      f"({exc.strerror})") from None
    world.append(("root", f"{root.st_dev}:{root.st_ino}"))
    world += [(name, fields.get(name, "").strip()) for name in CONFINEMENT]
    return world


def send(sock: socket.socket, message: dict[str, Any], fds: tuple[int, ...] = ()) -> None:
    """One message, with `fds` by SCM_RIGHTS on its first byte."""
    body = json.dumps(message, separators=(",", ":")).encode()
    if len(body) > MAX_MESSAGE:
        raise Refused(f"the message is {len(body)} bytes, more than {MAX_MESSAGE}")
    data = HEAD.pack(len(body)) + body
    sent = send_fds(sock, data, fds)
    if sent < len(data):
        sock.sendall(memoryview(data)[sent:])


def ask(sock: socket.socket, message: dict[str, Any], fds: tuple[int, ...] = ()) -> None:
    """Send the first message of a connection: a peer that refuses this side answers why and
    closes at once, so a send that finds it closed is not an error (its answer is read next)."""
    try:
        send(sock, message, fds)
    except (BrokenPipeError, ConnectionResetError):
        pass


def receive(sock: socket.socket, max_fds: int = 0) -> tuple[dict[str, Any] | None, list[int]]:
    """One message (None at EOF before one starts) and the fds that came with it (the caller
    closes them); Refused for a malformed or oversized one, or more than `max_fds` fds, which
    are closed then."""
    fds: list[int] = []
    head = b""
    while len(head) < HEAD.size:
        try:  # room for one fd more than may come, so that one too many shows
            data, more, flags = recv_fds(sock, HEAD.size - len(head), MAX_FDS + 1, socket.MSG_CMSG_CLOEXEC)
        except ConnectionResetError:
            data, more, flags = b"", [], 0
        fds += more
        if len(fds) > max_fds or flags & socket.MSG_CTRUNC:
            _close(fds)
            raise Refused(f"a message came with {len(fds)} fds or more, not at most {max_fds}")
        if not data:
            _close(fds)
            if head:
                raise Refused("the connection ended inside a message")
            return None, []
        head += data
    try:
        return _body(sock, HEAD.unpack(head)[0]), fds
    except BaseException:
        _close(fds)
        raise


def _body(sock: socket.socket, size: int) -> dict[str, Any]:
    if size > MAX_MESSAGE:
        raise Refused(f"a message of {size} bytes, more than {MAX_MESSAGE}")
    body = bytearray(size)
    view = memoryview(body)
    while view:
        n = sock.recv_into(view)
        if n == 0:
            raise Refused("the connection ended inside a message")
        view = view[n:]
    try:
        message = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise Refused(f"a message that is not JSON ({exc})") from None
    if not isinstance(message, dict):
        raise Refused("a message that is not a JSON object")
    return message


def _close(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
