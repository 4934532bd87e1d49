"""Session users on the real kernel: several ids mapped, `exec(user=)` resolved
in the session's own /etc/passwd and /etc/group, commands as another user
holding exactly a fresh sandbox's capabilities, and the one-id fallback.

As root the session maps 0..65535 (root's own id and a high host range); as
an unprivileged user with an /etc/subuid and /etc/subgid range (sbxtest in
run-tests.sh) that range through newuidmap. A user without a range
(sbxnoids, if the host has it) is run from the root pass."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from conftest import wait_until  # tests/, on sys.path (rootdir)
from users_world import several_ids, sh, users_world

import sandbox

pytestmark = pytest.mark.integration

PASSWD = ("root:x:0:0:root:/root:/bin/sh\nalice:x:1000:1000::/work:/bin/sh\n"
          "bob:x:1001:1001::/work:/bin/sh\n")
GROUP = "root:x:0:\nalice:x:1000:\nbob:x:1001:\nstaff:x:2000:alice,bob\n"
CAPS = "grep -E '^(Uid|Gid|Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Seccomp):' /proc/self/status"
RANGELESS_USER = "sbxnoids"  # a system user without an /etc/subuid range, made for these tests


def users_spec(**fields: object) -> sandbox.Spec:
    """The base world with a passwd and group of its own and a shared sticky /work."""
    return users_world(PASSWD, GROUP, 0o644, **fields)


@pytest.fixture
def session(require_native: None) -> Iterator[sandbox.Session]:
    with several_ids(users_spec(), "test_one_id_* cover it") as s:
        yield s


def test_probe_says_which(require_native: None) -> None:
    words = sandbox.probe().ids
    assert words.startswith("range " if os.getuid() == 0 else ("range ", "one id"))
    assert f"ids: {words}" in str(sandbox.probe())
    with sandbox.Session(users_spec()) as s:
        assert s.ids.words() == words if s.ids.several else words.startswith("one id (")


def test_id_and_groups_as_seen_by_id(session: sandbox.Session) -> None:
    assert sh(session, "id", user="alice").stdout == \
        "uid=1000(alice) gid=1000(alice) groups=1000(alice),2000(staff)\n"
    assert sh(session, "id", user=1001).stdout == "uid=1001(bob) gid=1001(bob) groups=1001(bob),2000(staff)\n"
    assert sh(session, "id -u; id -g", user="1000").stdout == "1000\n1000\n"
    assert sh(session, "id -u; id -G", user=4242).stdout == f"4242\n{session.ids.gids.own}\n"  # no entry
    assert sh(session, "id -u").stdout == f"{session.ids.uids.own}\n"  # no user=: pid 1's own


def test_each_users_files_are_its_own(session: sandbox.Session) -> None:
    assert sh(session, "echo a > /work/a && chmod 644 /work/a", user="alice").returncode == 0
    assert sh(session, "echo b > /work/b && chmod 644 /work/b", user="bob").returncode == 0
    denied = sh(session, "echo x >> /work/a", user="bob")
    assert denied.returncode != 0 and "Permission denied" in denied.stderr
    denied = sh(session, "echo x >> /work/b", user="alice")
    assert denied.returncode != 0 and "Permission denied" in denied.stderr
    assert sh(session, "rm -f /work/a", user="bob").returncode != 0  # sticky /work
    assert sh(session, "cat /work/a /work/b", user="bob").stdout == "a\nb\n"
    assert sh(session, "stat -c '%u %U' /work/a /work/b").stdout == "1000 alice\n1001 bob\n"
    assert session.read_file("/work/a") == b"a\n"


def test_host_sees_the_mapped_ids(session: sandbox.Session) -> None:
    proc = session.start(["sleep", "60"], user="alice")
    try:
        with open(f"/proc/{proc.pid}/status") as f:
            status = dict(line.split(":", 1) for line in f)
        assert status["Uid"].split() == [str(session.ids.uids.host_id(1000))] * 4
        assert status["Gid"].split() == [str(session.ids.gids.host_id(1000))] * 4
        assert session.ids.uids.host_id(1000) != 1000  # a session's user is no host user of that number
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("cap_add", [(), ("CAP_NET_BIND_SERVICE",)], ids=["no-caps", "cap_add"])
@pytest.mark.parametrize("who", ["alice", "root"])
def test_capabilities_equal_a_fresh_sandboxs(require_native: None, who: str, cap_add: tuple[str, ...]) -> None:
    uid = 1000 if who == "alice" else 0
    fresh = sandbox.run(["sh", "-c", CAPS], users_spec(uid=uid, gid=uid, cap_add=cap_add), capture_output=True,
                        text=True, timeout=60)
    assert fresh.returncode == 0, fresh.stderr
    with sandbox.Session(users_spec(cap_add=cap_add)) as s:
        if not s.ids.several and uid != s.ids.uids.own:
            pytest.skip("one id mapped: no other user to run as")
        inside = sh(s, CAPS, user=who)
        default = sh(s, CAPS)
    caps = [line for line in fresh.stdout.splitlines() if line.startswith("Cap")]
    if uid == 0 or not cap_add:
        assert inside.stdout == fresh.stdout
    else:  # docker's rule for a user other than root: none of the Spec's capabilities, its bounding set only
        assert [line for line in inside.stdout.splitlines() if line.startswith("Cap")] == \
            [line if line.startswith("CapBnd") else line.split(":")[0] + ":\t" + "0" * 16 for line in caps]
    assert [line for line in default.stdout.splitlines() if line.startswith("Cap")] == caps  # no user=: the Spec's


def test_start_and_async_take_user(session: sandbox.Session) -> None:
    import asyncio

    proc = session.start(["id", "-un"], user="bob", stdout=subprocess.PIPE)
    assert proc.communicate(timeout=30)[0] == b"bob\n"

    async def both() -> tuple[bytes, bytes]:
        done = await session.aexec(["id", "-un"], user="alice", capture_output=True, timeout=30)
        started = await session.astart(["id", "-un"], user=1001, stdout=sandbox.PIPE)
        out, _ = await started.communicate()
        return done.stdout, out

    assert asyncio.run(both()) == (b"alice\n", b"bob\n")


def test_unknown_user_and_unmapped_id(session: sandbox.Session) -> None:
    with pytest.raises(sandbox.SessionUserError, match="'carol': no such user in the session's /etc/passwd"):
        session.exec(["true"], user="carol")
    top = session.ids.uids.count + 1
    words = session.ids.uids.words()
    with pytest.raises(sandbox.SessionUserError, match=f"uid {top} is not mapped .*its uids: {words}"):
        session.exec(["true"], user=top)
    for bad in (-1, True, 1.5, "", "a:b", 2**32 - 1):
        with pytest.raises(sandbox.SessionUserError):
            session.exec(["true"], user=bad)  # type: ignore[arg-type]
    assert sh(session, "echo still serving").stdout == "still serving\n"


def test_one_id_when_the_session_cannot_map_more(require_native: None) -> None:
    """disable_userns keeps the nested one-id namespace: one id, for every caller."""
    with sandbox.Session(users_spec(disable_userns=True)) as s:
        assert not s.ids.several and s.ids.words() == "one id"
        own = s.ids.uids.own
        assert sh(s, "id -u", user=own).stdout == f"{own}\n"
        with pytest.raises(sandbox.SessionUserError, match=f"uid 1000 is not mapped .*its uids: {own}\\)"):
            s.exec(["true"], user="alice")


def test_one_id_when_the_seccomp_filter_denies_the_switch(require_native: None) -> None:
    """A filter that denies setresuid (inherited by every call process): one id, and calls still run."""
    from sandbox.seccomp import DEFAULT_POLICY, Seccomp

    strict = Seccomp(deny=(*DEFAULT_POLICY.deny, "setresuid"), errnos=DEFAULT_POLICY.errnos,
                     rules=DEFAULT_POLICY.rules)
    with sandbox.Session(users_spec(seccomp=strict)) as s:
        assert not s.ids.several
        assert sh(s, "id -u").stdout == f"{s.ids.uids.own}\n"
        with pytest.raises(sandbox.SessionUserError, match="uid 1000 is not mapped"):
            s.exec(["true"], user="alice")


RANGELESS = """
import sandbox, sys
sys.path.insert(0, sys.argv[1])
from test_session_users import users_spec
print(sandbox.probe().ids)
with sandbox.Session(users_spec()) as s:
    print(s.ids.words())
    print(s.exec(["id", "-u"], capture_output=True, text=True, user=s.ids.uids.own).stdout.strip())
    try:
        s.exec(["true"], user="alice")
    except sandbox.SessionUserError as exc:
        print(exc)
"""


def test_one_id_for_a_user_without_a_range(require_native: None) -> None:
    """An unprivileged caller without /etc/subuid: one id, and probe says why."""
    if os.getuid() != 0:
        pytest.skip("run from the root pass, as the range-less user")
    try:
        user = pwd.getpwnam(RANGELESS_USER)
    except KeyError:
        pytest.skip(f"no user {RANGELESS_USER} without a subuid range on this host")
    runuser = shutil.which("runuser")
    if runuser is None:
        pytest.skip("runuser is not installed")
    here = os.path.dirname(os.path.abspath(__file__))
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.path.dirname(here)}
    done = subprocess.run([runuser, "-u", RANGELESS_USER, "--", sys.executable, "-c", RANGELESS, here],
                          capture_output=True, text=True, timeout=120, cwd="/", env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("one id (no range for uid")
    assert lines[1:3] == ["one id", str(user.pw_uid)]
    assert f"uid 1000 is not mapped in the session (its uids: {user.pw_uid})" in lines[3]


def test_maps_refused_end_the_start_cleanly(require_native: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A map the kernel (root) or newuidmap refuses (host ids used twice: the caller's own and the range's
    first): SessionError naming it, the setup child killed before it runs anything, no fd, thread or child
    left behind."""
    from sandbox.session import ids, launch

    def overlapping(plan: object, host: object) -> ids.SessionIds:
        how = "root" if os.getuid() == 0 else "newuidmap"
        return ids.SessionIds(ids.IdMap(0, os.getuid(), os.getuid(), 5), ids.IdMap(0, os.getgid(), os.getgid(), 5),
                              how)

    with sandbox.Session(users_spec()):
        pass  # what the first session of a process starts once and keeps (sandbox-init's fd, the pool's helper)
    fds, threads, kids = sorted(os.listdir("/proc/self/fd")), threading.active_count(), children()
    monkeypatch.setattr(launch, "session_ids", overlapping)
    with pytest.raises(sandbox.SessionError, match=r"(could not write the session's uid_map|newuidmap refused)"):
        sandbox.Session(users_spec())
    assert sorted(os.listdir("/proc/self/fd")) == fds
    assert threading.active_count() == threads
    assert wait_until(lambda: not children() - kids), [open(f"/proc/{p}/cmdline").read() for p in children() - kids]


def children() -> set[str]:
    """This process's child processes (any thread's), by pid."""
    found: set[str] = set()
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                found |= set(f.read().split())
        except FileNotFoundError:
            pass
    return found
