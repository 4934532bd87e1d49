"""Attack: a Session's `user=` as a way up or out. A command plants entries in
the session's own /etc/passwd (writable here, as a copy-on-write root makes
it) so that a name the caller trusts means uid 0 or an id the session does
not map; a command run as another user tries to take root back with
setuid(); the caller's `user=` (or a forged request) names an id outside the
mapped range, to reach a host id the session was not given.

What holds: names resolve in the session only to ids it maps, the session's
uid 0 is the caller itself and holds no capability a fresh sandbox's
command lacks (pid 1's CAP_SETUID/SETGID/SETPCAP are dropped, bounding set
included, before the command exists), an id outside the range is refused by
the library and by the kernel, and no session id is a host user of the same
number.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from conftest import make_base_spec  # tests/, on sys.path (rootdir)
from users_world import several_ids, sh, users_world

import sandbox
from sandbox import Tmpfs
from sandbox.session import call, wire

pytestmark = pytest.mark.integration

PASSWD = "root:x:0:0:root:/root:/bin/sh\nalice:x:1000:1000::/work:/bin/sh\n"
GROUP = "root:x:0:\nalice:x:1000:\n"
CAPS = "grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Seccomp):' /proc/self/status"
SETUID_BACK = """
import os
for name, call in [("setuid", lambda: os.setuid(0)), ("setresuid", lambda: os.setresuid(0, 0, 0)),
                   ("seteuid", lambda: os.seteuid(0)), ("setgid", lambda: os.setgid(0)),
                   ("setgroups", lambda: os.setgroups([0])), ("setresuid-own", lambda: os.setresuid(-1, 0, -1))]:
    try:
        call()
        print(name, "done", os.getresuid())
    except OSError as exc:
        print(name, exc.strerror)
"""


def attack_spec() -> sandbox.Spec:
    """A session whose /etc/passwd and /etc/group any of its users may rewrite."""
    return users_world(PASSWD, GROUP, 0o666)


@pytest.fixture
def session(require_native: None) -> Iterator[sandbox.Session]:
    with several_ids(attack_spec(), "no other user to attack through") as s:
        yield s


def plant(s: sandbox.Session, line: str, where: str = "/etc/passwd") -> None:
    assert sh(s, f"echo '{line}' >> {where}", user="alice").returncode == 0


def host_uid(pid: int) -> list[str]:
    with open(f"/proc/{pid}/status") as f:
        return next(line.split()[1:] for line in f if line.startswith("Uid:"))


def test_a_planted_name_for_uid_0_gains_no_capability(session: sandbox.Session) -> None:
    plant(session, "evil:x:0:0::/:/bin/sh")
    fresh = sandbox.run(["sh", "-c", CAPS], attack_spec().replace(uid=0, gid=0), capture_output=True, text=True,
                        timeout=60)
    assert fresh.returncode == 0, fresh.stderr
    inside = sh(session, f"id -u; {CAPS}", user="evil")
    assert inside.stdout == "0\n" + fresh.stdout
    assert "CapBnd:\t0000000000000000" in inside.stdout  # not even pid 1's setid capabilities
    proc = session.start(["sleep", "60"], user="evil")
    try:  # the session's uid 0 is the host id the map gives it: the caller's own (root) or its range's first
        assert host_uid(proc.pid) == [str(session.ids.uids.host_id(0))] * 4
        assert session.ids.uids.host_id(0) == (os.getuid() if session.ids.uids.own == 0 else session.ids.uids.base)
    finally:
        proc.kill()
        proc.wait()


GRANTED = ("CAP_CHOWN", "CAP_NET_BIND_SERVICE")
CHOWN = "touch /work/mine && chown 1001 /work/mine && echo chowned"


def cap_lines(out: str) -> dict[str, str]:
    """The Cap* lines of CAPS's output: {"CapEff": "0000...", ...}."""
    return {k: v.strip() for k, _, v in (line.partition(":") for line in out.splitlines()) if k.startswith("Cap")}


def test_a_user_holds_none_of_the_specs_capabilities(require_native: None) -> None:
    """docker's rule: a command run as a uid other than 0 holds no capability (permitted, effective,
    inheritable, ambient), though the Spec grants some; only its bounding set stays the Spec's. Before
    the rule, alice held CAP_CHOWN as an ambient capability and could give her file to bob."""
    spec = attack_spec().replace(cap_add=GRANTED)
    fresh = sandbox.run(["sh", "-c", CAPS], spec.replace(uid=0, gid=0), capture_output=True, text=True, timeout=60)
    assert fresh.returncode == 0, fresh.stderr
    with sandbox.Session(spec) as s:
        if not s.ids.several:
            pytest.skip(f"this caller maps one id ({sandbox.probe().ids}): no other user to attack through")
        alice = cap_lines(sh(s, CAPS, user="alice").stdout)
        assert alice == {"CapInh": "0" * 16, "CapPrm": "0" * 16, "CapEff": "0" * 16,
                         "CapBnd": cap_lines(fresh.stdout)["CapBnd"], "CapAmb": "0" * 16}
        denied = sh(s, CHOWN, user="alice")
        assert denied.returncode != 0 and "Operation not permitted" in denied.stderr
        assert sh(s, "stat -c %u /work/mine").stdout == "1000\n"
        assert sh(s, CHOWN.replace("mine", "roots"), user="root").stdout == "chowned\n"  # uid 0: the Spec's set
        assert sh(s, CAPS, user="root").stdout == fresh.stdout


def test_one_id_user_holds_none_of_the_specs_capabilities(require_native: None) -> None:
    """The same rule where the session maps one id, its own uid 1000 (disable_userns): `user=1000` drops
    the Spec's capabilities (CAP_DAC_OVERRIDE no longer reads a mode-000 file); a call without `user=`
    keeps what a fresh sandbox of the Spec gives uid 1000."""
    spec = attack_spec().replace(cap_add=(*GRANTED, "CAP_DAC_OVERRIDE"), uid=1000, gid=1000, disable_userns=True)
    fresh = sandbox.run(["sh", "-c", CAPS], spec, capture_output=True, text=True, timeout=60)
    assert fresh.returncode == 0, fresh.stderr
    with sandbox.Session(spec) as s:
        assert not s.ids.several and s.ids.uids.own == 1000
        assert cap_lines(sh(s, CAPS, user="alice").stdout) == {
            "CapInh": "0" * 16, "CapPrm": "0" * 16, "CapEff": "0" * 16,
            "CapBnd": cap_lines(fresh.stdout)["CapBnd"], "CapAmb": "0" * 16}
        assert sh(s, "echo secret > /work/f && chmod 000 /work/f && cat /work/f").stdout == "secret\n"
        denied = sh(s, "cat /work/f", user=1000)
        assert denied.returncode != 0 and "Permission denied" in denied.stderr
        assert sh(s, CAPS).stdout == fresh.stdout


def test_a_planted_name_for_an_unmapped_id_is_refused(session: sandbox.Session) -> None:
    plant(session, "ghost:x:4000000:1000::/:/bin/sh")
    plant(session, "ghoul:x:1000:4000000::/:/bin/sh")
    plant(session, "alice:x:4000000:", "/etc/group")  # an unmapped supplementary group: left out
    with pytest.raises(sandbox.SessionUserError, match=r"'ghost': uid 4000000 is not mapped .*its uids: 0-"):
        session.exec(["true"], user="ghost")
    with pytest.raises(sandbox.SessionUserError, match=r"'ghoul': gid 4000000 is not mapped .*its gids: 0-"):
        session.exec(["true"], user="ghoul")
    assert sh(session, "id -G", user="alice").stdout == "1000\n"


def test_no_setuid_back_to_root_after_user(session: sandbox.Session) -> None:
    done = session.exec(["python3", "-c", SETUID_BACK], user="alice", capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"{name} Operation not permitted" for name in
                                        ("setuid", "setresuid", "seteuid", "setgid", "setgroups", "setresuid-own")]
    assert sh(session, "id -u", user="alice").stdout == "1000\n"


def test_user_reaches_no_host_id_outside_the_range(session: sandbox.Session) -> None:
    ids = session.ids.uids
    for outside in (ids.count + 1, 2**31, 2**32 - 2, 2**32 - 1, str(2**32 - 1)):
        with pytest.raises(sandbox.SessionUserError, match=str(outside)):
            session.exec(["true"], user=outside)
    mapped = {ids.host} | set(range(ids.base, ids.base + ids.count))
    for inside in (0, 1, 1000, ids.count):
        proc = session.start(["sleep", "60"], user=inside)
        try:
            (uid,) = set(host_uid(proc.pid))
            assert int(uid) in mapped
            if inside != ids.own:
                assert int(uid) != inside  # not the host user of that number
        finally:
            proc.kill()
            proc.wait()


def test_a_forged_request_for_an_unmapped_id_is_refused_by_the_kernel(session: sandbox.Session) -> None:
    """Past the library's check (a caller's bug): the call process's setresgid fails, nothing runs."""
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        data = wire.request(session.plan.path, "", ["true"], session.plan.env, ids=(4000000, 4000000, ()))
        sock = session._send(data, (null, null, null))
    finally:
        os.close(null)
    with pytest.raises(sandbox.SessionError, match="gid_map failed with EINVAL"):
        call.Call(sock, ["true"], "").take_started()
    assert sh(session, "echo still serving").stdout == "still serving\n"


def test_a_planted_fifo_or_huge_passwd_is_a_typed_error(require_native: None) -> None:
    """The lookup opens nothing but a regular file, and reads at most 4 MiB of it: no hang, no flood."""
    spec = make_base_spec(Tmpfs("/etc", perms=0o777))
    with sandbox.Session(spec) as s:
        s.write_file("/etc/passwd", PASSWD)
        assert sh(s, "rm /etc/passwd && mkfifo /etc/passwd").returncode == 0
        with pytest.raises(sandbox.SessionUserError, match="/etc/passwd cannot be read: .*FIFO"):
            s.exec(["true"], user="alice")
        assert sh(s, "rm /etc/passwd && head -c 5000000 /dev/zero | tr '\\\\0' x > /etc/passwd").returncode == 0
        with pytest.raises(sandbox.SessionUserError, match="/etc/passwd cannot be read: larger than 4 MiB"):
            s.exec(["true"], user="alice")
        assert sh(s, "rm /etc/passwd && ln -s /proc/1/root/etc/shadow /etc/passwd").returncode == 0
        with pytest.raises(sandbox.SessionUserError):
            s.exec(["true"], user="alice")  # resolved in the session: its own /proc/1 is pid 1, no passwd there
