"""Attack: reaching a session kept by `sandbox session start` through its holder's socket.

The holder (sandbox/session/holder.py) serves one uid's session at a socket in that uid's 0700
directory; its checks are what stand between another user, or a process inside a sandbox (even
the session itself) running as the same uid, and a command run with the owner's rights. Each
test attacks one of them:

- another uid connecting (root test: a peer whose effective uid is sbxtest's, its file system
  uid root's so that it reaches the socket at all; and root connecting to sbxtest's holder);
- a process inside the session, of the owner's uid, given the directory by a bind;
- a link or file planted at the socket's name, and a planted directory;
- garbage, oversized, truncated and stalled messages: only that connection ends;
- an exec request that names fds without passing them, or passes too few or too many: the
  command never runs, so it can never be handed one of the holder's own fds.

Each test uses a sessions directory of its own ($SANDBOX_SESSION_DIR), never the user's.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import make_base_spec, wait_until  # tests/, on sys.path (rootdir)
from session_cli import (
    Started,
    cli,
    gone,
    left_in,
    listed,
    raw_answer,
    raw_connect,
    raw_send,
    spec_file,
    started,
    stop_all,
)

import sandbox

pytestmark = pytest.mark.integration

ATTACKER = "sbxtest"


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """An environment whose sessions live in a directory of this test's own; a session an attack
    started there after all (the test failed) is stopped at the end."""
    directory = tmp_path / "sessions"
    directory.mkdir(mode=0o700)
    environ = {**os.environ, "SANDBOX_SESSION_DIR": str(directory)}
    yield environ
    stop_all(str(directory), left_in(str(directory)), environ)


@pytest.fixture
def session(require_native: None, tmp_path: Path, env: dict[str, str]) -> Iterator[Started]:
    with started(spec_file(tmp_path), "--name", "target", env=env) as s:
        yield s


def log_of(s: Started) -> str:
    assert s.env is not None
    return Path(s.env["SANDBOX_SESSION_DIR"], f"session-{s.ident}.log").read_text()


def alive(s: Started) -> bool:
    done = s.exec("echo", "alive")
    return done.returncode == 0 and done.stdout == "alive\n"


def need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("another uid's connection needs root to arrange")
    try:
        pwd.getpwnam(ATTACKER)
    except KeyError:
        pytest.skip(f"no user {ATTACKER}")


# Connect as effective uid ATTACKER with file system uid 0 (setresuid(0, uid, 0), then setfsuid(0):
# allowed, since 0 is the real uid): the path and the socket's mode let it through, so that the
# holder's own check of SO_PEERCRED (the effective uid) is what is tested.
OTHER_UID_PEER = """
import ctypes, json, os, socket, struct, sys
uid = int(sys.argv[2])
os.setresuid(0, uid, 0)
ctypes.CDLL(None, use_errno=True).setfsuid(0)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(20)
s.connect(sys.argv[1])
body = json.dumps({"op": "stop"}).encode()
try:
    s.sendall(struct.pack("!I", len(body)) + body)
except BrokenPipeError:  # refused at once: the answer is read below
    pass
head = s.recv(4)
print(s.recv(struct.unpack("!I", head)[0]).decode() if len(head) == 4 else "EOF")
"""


def test_another_uid_is_refused(session: Started) -> None:
    need_root()
    assert session.env is not None
    path = f"{session.env['SANDBOX_SESSION_DIR']}/session-{session.ident}.sock"
    uid = pwd.getpwnam(ATTACKER).pw_uid
    done = subprocess.run([sys.executable, "-c", OTHER_UID_PEER, path, str(uid)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"uid {uid}" in done.stdout and "not the owner" in done.stdout
    assert alive(session)
    assert f"refused uid {uid}" in log_of(session) or f"uid {uid} (pid" in log_of(session)


def test_root_is_refused_by_another_users_session(require_native: None) -> None:
    """root reaching a user's session would act with that user's session as root's deputy: the
    holder serves its owner only."""
    need_root()
    user = pwd.getpwnam(ATTACKER)
    base = tempfile.mkdtemp(prefix="sbx-session-cli-")
    try:
        os.chmod(base, 0o755)
        directory = Path(base, "sessions")
        directory.mkdir(mode=0o700)
        os.chown(directory, user.pw_uid, user.pw_gid)
        spec = spec_file(Path(base))
        env = {**os.environ, "SANDBOX_SESSION_DIR": str(directory), "HOME": base}
        as_user: dict[str, Any] = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
        done = cli("session", "start", "--spec", str(spec), "--name", "theirs", env=env, **as_user)
        assert done.returncode == 0, done.stderr
        pids = listed("theirs", env, **as_user)
        assert pids is not None
        try:
            with raw_connect(str(directory), "theirs") as sock:
                raw_send(sock, b'{"op": "stop"}')
                answer = raw_answer(sock)
            assert answer is not None and "uid 0" in str(answer["error"]) and "not the owner" in str(answer["error"])
            mine = cli("exec", "theirs", "--", "id", "-u", env=env)  # root's client: not its directory
            assert mine.returncode == 125 and "not a directory of ours" in mine.stderr
            theirs = cli("exec", "theirs", "--", "echo", "ok", env=env, **as_user)
            assert (theirs.returncode, theirs.stdout) == (0, "ok\n"), theirs.stderr
        finally:
            stopped = cli("session", "stop", "theirs", env=env, **as_user)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            assert stopped.returncode == 0, stopped.stderr
    finally:
        shutil.rmtree(base)


def test_a_process_in_the_session_cannot_reach_its_holder(require_native: None, tmp_path: Path,
                                                         env: dict[str, str]) -> None:
    """The session's own command, the owner's uid, given the directory by a bind: refused (it is in
    another pid and mount namespace), so it cannot stop its session or run a command outside its
    confinement through the holder."""
    directory = env["SANDBOX_SESSION_DIR"]
    spec = make_base_spec(sandbox.Bind(directory))
    script = ("import json, socket, struct, sys\n"
              "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
              f"s.connect({directory!r} + '/session-inner.sock')\n"
              "for req in ({'op': 'stop'}, {'op': 'exec', 'argv': ['true']}):\n"
              "    body = json.dumps(req).encode()\n"
              "    try:\n"
              "        s.sendall(struct.pack('!I', len(body)) + body)\n"
              "    except BrokenPipeError:\n"
              "        pass  # refused at once: the answer is read below\n"
              "    head = s.recv(4)\n"
              "    print(s.recv(struct.unpack('!I', head)[0]).decode() if len(head) == 4 else 'EOF')\n"
              "    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
              f"    s.connect({directory!r} + '/session-inner.sock')\n")
    with started(spec_file(tmp_path, spec), "--name", "inner", env=env) as s:
        done = s.exec("python3", "-c", script)
        assert done.returncode == 0, done.stderr
        answers = done.stdout.splitlines()
        assert len(answers) == 2 and all("namespace" in a and "error" in a for a in answers), answers
        assert alive(s)
        assert "refused" in log_of(s)


# A peer of the owner's uid, in the holder's namespaces, confined by no_new_privs (what Landlock
# needs) or a seccomp filter (an allow-all one: its presence is what counts): it asks the holder to
# stop the session and to run a command, which would run outside its confinement.
CONFINED_PEER = """
import ctypes, json, os, socket, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
if sys.argv[2] in ("nnp", "both"):
    assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
if sys.argv[2] in ("seccomp", "both"):
    allow = struct.pack("=HBBI", 0x06, 0, 0, 0x7FFF0000)  # BPF_RET|BPF_K, SECCOMP_RET_ALLOW
    buf = ctypes.create_string_buffer(allow)
    prog = struct.pack("=HxxxxxxQ", 1, ctypes.addressof(buf))
    assert libc.prctl(22, 2, ctypes.c_char_p(prog), 0, 0) == 0, ctypes.get_errno()  # PR_SET_SECCOMP, FILTER
for req in ({"op": "stop"}, {"op": "info"}):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(20)
    s.connect(sys.argv[1])
    body = json.dumps(req).encode()
    try:
        s.sendall(struct.pack("!I", len(body)) + body)
    except BrokenPipeError:
        pass
    head = s.recv(4)
    print(s.recv(struct.unpack("!I", head)[0]).decode() if len(head) == 4 else "EOF")
"""


def test_a_confined_peer_of_the_owner_is_refused(session: Started) -> None:
    """Same uid, same namespaces, but under no_new_privs or a seccomp filter: the holder would run
    its command outside that confinement, so it refuses it."""
    assert session.env is not None
    path = f"{session.env['SANDBOX_SESSION_DIR']}/session-{session.ident}.sock"
    modes = ["nnp", "both"] + (["seccomp"] if os.geteuid() == 0 else [])  # a filter without NNP: root only
    for mode in modes:
        done = subprocess.run([sys.executable, "-c", CONFINED_PEER, path, mode], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        answers = done.stdout.splitlines()
        assert len(answers) == 2 and all("error" in a and ("NoNewPrivs" in a or "Seccomp" in a) for a in answers), \
            (mode, answers)
    assert alive(session)


def test_a_planted_link_at_the_socket_is_never_followed(require_native: None, tmp_path: Path,
                                                        env: dict[str, str]) -> None:
    directory = Path(env["SANDBOX_SESSION_DIR"])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = directory / "session-planted.sock"
    link.symlink_to(elsewhere / "made.sock")
    done = cli("session", "start", "--spec", str(spec_file(tmp_path)), "--name", "planted", env=env)
    assert done.returncode == 125 and "not a socket of ours" in done.stderr, done.stderr
    assert link.is_symlink() and not (elsewhere / "made.sock").exists()
    # a listener of someone else's at the link's end: the client never connects to it
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(elsewhere / "made.sock"))
        listener.listen(8)
        listener.setblocking(False)
        for args in (("exec", "planted", "--", "true"), ("session", "stop", "planted")):
            done = cli(*args, env=env)
            assert done.returncode == 125 and "not a socket of ours" in done.stderr, done.stderr
        with pytest.raises(BlockingIOError):
            listener.accept()
    assert link.is_symlink()
    link.unlink()
    (directory / "session-planted.sock").write_text("a file")
    done = cli("session", "start", "--spec", str(spec_file(tmp_path)), "--name", "planted", env=env)
    assert done.returncode == 125 and "not a socket of ours" in done.stderr, done.stderr
    assert (directory / "session-planted.sock").read_text() == "a file"


def test_a_planted_directory_is_refused(require_native: None, tmp_path: Path, env: dict[str, str]) -> None:
    real = Path(env["SANDBOX_SESSION_DIR"])
    spec = str(spec_file(tmp_path))
    link = tmp_path / "link"
    link.symlink_to(real)
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    os.chmod(loose, 0o755)
    for where, words in ((link, "link"), (loose, "0700")):
        there = {**env, "SANDBOX_SESSION_DIR": str(where)}
        done = cli("session", "start", "--spec", spec, env=there)
        if done.returncode == 0:  # the attack worked: stop what it started before failing
            stop_all(str(where), [done.stdout.strip()], there)
        assert done.returncode == 125 and words in done.stderr, done.stderr
        done = cli("exec", "x", "--", "true", env={**env, "SANDBOX_SESSION_DIR": str(where)})
        assert done.returncode == 125 and words in done.stderr, done.stderr
    assert os.listdir(real) == [] and os.listdir(loose) == []


def holder_fds(s: Started) -> int:
    return len(os.listdir(f"/proc/{s.holder}/fd"))


def test_garbage_and_oversized_messages_do_not_kill_the_holder(session: Started) -> None:
    assert session.env is not None
    directory = session.env["SANDBOX_SESSION_DIR"]
    fds_before = holder_fds(session)
    stalled = raw_connect(directory, session.ident)  # says nothing: only its own thread waits
    r, w = os.pipe()
    try:
        garbage: list[tuple[bytes, tuple[int, ...], str]] = [
            (b"", (), ""),  # a header of 0xffffffff bytes: below
            (b"not json", (), "not JSON"),
            (b"[1, 2]", (), "not a JSON object"),
            (b"[" * 100000 + b"]" * 100000, (), "not JSON"),
            (b'{"op": "format-disk"}', (), "unknown request"),
            (b'{"op": "exec", "argv": "sh -c reboot"}', (r, w, w), "argv"),
            (b'{"op": "exec", "argv": ["a\\u0000b"]}', (r, w, w), "argv"),
            (b'{"op": "exec", "argv": ["true"], "env": ["A=B"]}', (r, w, w), "env"),
            (b'{"op": "info"}', (r,), "carries no fds"),
        ]
        with raw_connect(directory, session.ident) as sock:
            sock.sendall(b"\xff\xff\xff\xff" + b"x" * 1000)
            answer = raw_answer(sock)
            assert answer is not None and "more than" in str(answer["error"])
        for payload, fds, words in garbage[1:]:
            with raw_connect(directory, session.ident) as sock:
                raw_send(sock, payload, fds)
                answer = raw_answer(sock)
                assert answer is not None and words in str(answer.get("error")), (payload[:40], answer)
        with raw_connect(directory, session.ident) as sock:
            sock.sendall(b"\x00\x00")  # half a header, then gone
        with raw_connect(directory, session.ident) as sock:
            sock.sendall(b"\x00\x00\x00\x10{")  # a body cut short, then gone
        assert alive(session)
        assert session.exec("echo", "x" * 100000).stdout == "x" * 100000 + "\n"
    finally:
        stalled.close()
        os.close(r)
        os.close(w)
    assert alive(session)
    # none of the fds the garbage carried stays with the holder (a connection's thread may still be closing its own)
    assert wait_until(lambda: holder_fds(session) <= fds_before, 10), (holder_fds(session), fds_before)
    assert "refused" in log_of(session)


def test_an_exec_without_its_fds_runs_nothing(session: Started) -> None:
    """The command's stdin, stdout and stderr are exactly the three fds its request passed:
    a request that names fds, or passes fewer or more, is refused before anything runs, so the
    holder never lends the command its own (its log, its socket, its /dev/null)."""
    assert session.env is not None
    directory = session.env["SANDBOX_SESSION_DIR"]

    def request(n: int, **extra: object) -> bytes:
        import json

        return json.dumps({"op": "exec", "argv": ["sh", "-c", f"echo pwned > /tmp/pwned-{n}"], **extra}).encode()

    r, w = os.pipe()
    try:
        cases: list[tuple[bytes, tuple[int, ...], str]] = [
            (request(0, stdin=0, stdout=1, stderr=2), (), "unknown fields"),
            (request(1, fds=[3, 4, 5]), (r, w, w), "unknown fields"),
            (request(2), (), "not 0"),
            (request(3), (w,), "not 1"),
            (request(4), (r, w), "not 2"),
            (request(5), (r, w, w, w), "fds"),
        ]
        for payload, fds, words in cases:
            with raw_connect(directory, session.ident) as sock:
                raw_send(sock, payload, fds)
                answer = raw_answer(sock)
                assert answer is not None and words in str(answer.get("error")), (payload, answer)
        # the same request with its three fds: the command writes to the one passed as stdout
        with raw_connect(directory, session.ident) as sock:
            raw_send(sock, b'{"op": "exec", "argv": ["sh", "-c", "echo to-the-pipe; exit 3"]}', (r, w, w))
            assert "started" in (raw_answer(sock) or {})
            assert raw_answer(sock) == {"exit": 3, "killed_by": None}
        assert os.read(r, 100) == b"to-the-pipe\n"
    finally:
        os.close(r)
        os.close(w)
    assert session.exec("sh", "-c", "ls /tmp/pwned-* 2>/dev/null; true").stdout == ""


def test_a_stopped_session_leaves_nothing(session: Started) -> None:
    assert session.env is not None
    assert cli("session", "stop", session.ident, env=session.env).returncode == 0
    assert gone(session.holder) and gone(session.pid1)
    directory = session.env["SANDBOX_SESSION_DIR"]
    assert not any(name.endswith(".sock") for name in os.listdir(directory))
