"""A Template's sandboxes against each other and against the template:
attacks from inside (see, signal, ptrace, join, reach), and what 16 threads x
100 spawns leave behind."""

from __future__ import annotations

import json
import os
import textwrap
import threading
from collections.abc import Iterator

import pytest
from conftest import count_fds, make_base_spec, sleepers, wait_until  # tests/, on sys.path (rootdir)
from leakcheck import mount_lines

import sandbox
from sandbox import File

pytestmark = pytest.mark.integration

VICTIM = textwrap.dedent("""
    import os, socket, sys, time
    s = socket.socket(socket.AF_UNIX); s.bind("\\0sbx-victim"); s.listen()
    open("/tmp/secret", "w").write("x"); open("/dev/shm/secret", "w").write("x")
    print(os.getpid(), flush=True)
    os.execv("/usr/bin/sleep", ["sleep", "1000", sys.argv[1]])
""")

ATTACK = textwrap.dedent("""
    import ctypes, errno, json, os, socket, sys
    libc = ctypes.CDLL(None, use_errno=True)
    victim, template = int(sys.argv[1]), int(sys.argv[2])
    mine = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    def err(call, *args):
        return 0 if call(*args) == 0 else errno.errorcode[ctypes.get_errno()]
    def kill(pid):
        try:
            os.kill(pid, 0)
            return 0
        except OSError as exc:
            return errno.errorcode[exc.errno]
    others = [p for p in range(1, 4096) if p not in mine]
    out = {
        "visible": mine,
        "marker_seen": any(sys.argv[3][::-1].encode() in open(f"/proc/{p}/cmdline", "rb").read() for p in mine),
        "signal": sorted({kill(p) for p in others + [victim, template]}),
        "ptrace": sorted({err(libc.ptrace, 16, p, 0, 0) for p in others + [victim, template]}),
        "join": sorted({os.path.exists(f"/proc/{p}/ns/net") for p in (victim, template) if p not in mine}),
        "umount_proc": err(libc.umount2, b"/proc", 2),
        "files": [os.path.exists(p) for p in ("/tmp/secret", "/dev/shm/secret")],
    }
    def opens(path):
        try:
            os.listdir(path) if path.endswith("/fd") else open(path, "rb").read(1)
            return 0
        except OSError as exc:
            return errno.errorcode[exc.errno]
    # pid 1 is a copy of the template process (its memory held the request): nothing of it is open to us
    out["pid1"] = {what: opens(f"/proc/1/{what}") for what in ("mem", "environ", "root/proc/1/environ")}
    listed = opens("/proc/1/fd") == 0  # the numbers may show (uid 0 inside owns the entry), not the files
    out["pid1"]["fds"] = sorted({opens(f"/proc/1/fd/{n}") for n in os.listdir("/proc/1/fd")}) if listed else ["denied"]
    out["pid1"]["ptrace"] = err(libc.ptrace, 16, 1, 0, 0)
    s = socket.socket(socket.AF_UNIX)
    out["abstract"] = errno.errorcode[s.connect_ex("\\0sbx-victim")]
    print(json.dumps(out))
""")


@pytest.fixture
def template(require_native: None) -> Iterator[sandbox.Template]:
    with sandbox.Template(make_base_spec(File("/victim.py", VICTIM.encode(), perms=0o644, readonly=True),
                                         File("/attack.py", ATTACK.encode(), perms=0o644, readonly=True))) as t:
        yield t


def test_a_sandbox_cannot_reach_another_or_the_template(template: sandbox.Template, no_leftovers: str) -> None:
    victim = template.spawn(["python3", "/victim.py", no_leftovers], stdout=sandbox.PIPE)
    try:
        victim.stdout.readline()  # type: ignore[union-attr]
        assert wait_until(lambda: len(sleepers(no_leftovers)) == 1)
        done = template.run(["python3", "/attack.py", str(victim.pid), str(template.pid), no_leftovers[::-1]],
                            capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        seen = json.loads(done.stdout)
        assert seen["visible"] == [1, 2]  # sandbox-init and the attacker: nothing else exists for it
        assert not seen["marker_seen"]
        assert seen["signal"] == ["ESRCH"] and seen["ptrace"] == ["ESRCH"]
        assert seen["join"] in ([], [False])  # no /proc entry to open another's namespaces through
        assert seen["umount_proc"] == "EPERM"  # the template's proc beneath stays covered
        assert seen["files"] == [False, False] and seen["abstract"] == "ECONNREFUSED"
        assert 0 not in seen["pid1"].values() and 0 not in seen["pid1"]["fds"], seen["pid1"]
        # kill everything it can: only its own sandbox goes
        assert template.run(["sh", "-c", "kill -9 -1; sleep 0.2"], timeout=60).returncode in (0, -9)
        assert victim.poll() is None and template._server.alive()
    finally:
        victim.kill()
        victim.wait()
        victim.stdout.close()  # type: ignore[union-attr]


def test_the_template_holds_no_filter_and_at_most_the_capabilities_it_needs(template: sandbox.Template) -> None:
    with open(f"/proc/{template.pid}/status") as f:
        status = dict(line.split(":", 1) for line in f)
    assert status["Seccomp"].strip() == "0" and status["NoNewPrivs"].strip() == "1"
    # CAP_SYS_ADMIN over its own user namespace (or the pool's, to setns into its network namespaces): it
    # clones per-call binds in its own mount namespace; CAP_SETFCAP as uid 0 (to map uid 0 into its sandboxes);
    # CAP_NET_ADMIN when its sandboxes get fresh network namespaces (its standbys bring up their loopback)
    fresh_net = template._plans.sandbox.network == "none"
    expected = (os.geteuid() == 0) << 31 | 1 << 21 | fresh_net << 12
    assert int(status["CapEff"], 16) == int(status["CapPrm"], 16) == expected
    assert int(status["CapBnd"], 16) == expected


def test_many_threads_leave_nothing_behind(require_native: None) -> None:
    with sandbox.Template(make_base_spec()) as t:
        t.run(["true"])
        fds, mounts = count_fds(), mount_lines()
        errors: list[BaseException] = []
        pids: list[int] = []

        def work() -> None:
            try:
                for _ in range(100):
                    done = t.spawn(["true"])
                    pids.append(done.pid)
                    assert done.wait(60) == 0
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work) for _ in range(16)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errors, errors[:3]
        assert len(pids) == 1600
        assert count_fds() == fds and mount_lines() == mounts
        # every sandbox reaped by the template: only its standbys (ready for the next requests) are left
        standbys = 2 if t._server.standby else 0
        assert wait_until(lambda: len(_children(t.pid)) == standbys), _children(t.pid)
        template_pid = t.pid
    assert not os.path.exists(f"/proc/{template_pid}")  # and with it its pid namespace, and every namespace


def _children(pid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(name))
            except OSError:
                pass
    return out
