"""Sandboxes in leased network namespaces (network="pool"), native backend, root and unprivileged."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import pytest

import sandbox
from sandbox import netpool

pytestmark = pytest.mark.integration

PY = "/usr/bin/python3"

LISTEN = textwrap.dedent("""
    import os, socket, sys, time
    t = socket.socket(); t.bind(("127.0.0.1", 47001)); t.listen()
    u = socket.socket(socket.AF_UNIX); u.bind("\\0sandbox-test-abstract"); u.listen()
    print(os.readlink("/proc/self/ns/net"), flush=True)
    time.sleep(60)
""")

CONNECT = textwrap.dedent("""
    import os, socket
    out = [os.readlink("/proc/self/ns/net")]
    for family, addr in ((socket.AF_INET, ("127.0.0.1", 47001)), (socket.AF_UNIX, "\\0sandbox-test-abstract")):
        s = socket.socket(family)
        try:
            s.connect(addr); out.append("connected")
        except OSError as e:
            out.append(e.__class__.__name__)
    print(" ".join(out))
""")


@contextlib.contextmanager
def shared_pool(size: int, for_network_none: bool) -> Iterator[netpool.NetnsPool]:
    """A new process-wide pool of `size` for the test (any running one is
    closed first), closed after it; then the default again."""
    netpool.disable()
    p = netpool.enable(size=size, for_network_none=for_network_none)
    try:
        p.wait_filled(10)
        yield p
    finally:
        netpool.disable()
        assert p.closed
        netpool.restore_default()


@pytest.fixture
def pool() -> Iterator[netpool.NetnsPool]:
    """A process-wide pool for the test, closed (factory and namespaces gone) after it."""
    with shared_pool(2, for_network_none=False) as p:
        yield p


def test_a_pooled_sandbox_sees_only_loopback_and_cannot_change_it(pool, base_spec, run_sh) -> None:
    script = ("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; echo ==; tail -n +2 /proc/net/route; echo ==; "
              "tr -s ' ' < /proc/net/if_inet6 | cut -d' ' -f1,6; echo ==; ip link set lo down; echo rc=$?")
    done = run_sh(script, base_spec(network="pool"))
    devices, routes, inet6, rest = done.stdout.split("==\n")
    assert devices == "lo\n"
    assert routes == ""  # no route in the main table: nothing leads out
    assert inet6 == "00000000000000000000000000000001 lo\n"  # ::1 only
    assert rest == "rc=2\n" and "Operation not permitted" in done.stderr
    assert pool.stats()["leased"] >= 1


def test_two_pooled_sandboxes_cannot_reach_each_other(pool, base_spec) -> None:
    spec = base_spec(network="pool")
    a = sandbox.spawn([PY, "-I", "-S", "-c", LISTEN], spec, stdout=subprocess.PIPE, backend="native")
    try:
        ns_a = a.stdout.readline().decode().strip()
        assert ns_a.startswith("net:[")
        b = sandbox.run([PY, "-I", "-S", "-c", CONNECT], spec, capture_output=True, text=True, backend="native",
                        timeout=60)
        ns_b, tcp, unix = b.stdout.split()
        assert ns_b != ns_a
        assert (tcp, unix) == ("ConnectionRefusedError", "ConnectionRefusedError"), b.stderr
    finally:
        a.kill()
        a.wait()
        a.stdout.close()


def test_a_recycled_namespace_carries_nothing_from_its_previous_tenant(base_spec) -> None:
    with shared_pool(1, for_network_none=False) as p:
        spec = base_spec(network="pool")
        listen = ("import os, socket; s = socket.socket(); s.bind(('127.0.0.1', 47002)); s.listen();"
                  " print(os.readlink('/proc/self/ns/net'))")
        first = sandbox.run([PY, "-I", "-S", "-c", listen], spec, capture_output=True, text=True, backend="native",
                            timeout=60)
        assert p.wait_filled(10)
        second = sandbox.run(["sh", "-c", "readlink /proc/self/ns/net; cat /proc/net/tcp /proc/net/tcp6 | wc -l"],
                             spec, capture_output=True, text=True, backend="native", timeout=60)
        ns_second, lines = second.stdout.split()
        assert ns_second == first.stdout.strip()  # the same namespace, recycled
        assert lines == "2"  # two header lines, no socket left from the first tenant
        assert p.stats()["recycled"] >= 1


SMUGGLE = textwrap.dedent("""
    import os, socket, sys
    chan = socket.socket(fileno=int(sys.argv[1]))
    t = socket.socket(); t.bind(("127.0.0.1", 47004)); t.listen()
    u = socket.socket(socket.AF_UNIX); u.bind("\\0sandbox-test-smuggled"); u.listen()
    socket.send_fds(chan, [os.readlink("/proc/self/ns/net").encode()], [t.fileno(), u.fileno()])
""")

BIND_AGAIN = textwrap.dedent("""
    import os, socket
    t = socket.socket(); t.bind(("127.0.0.1", 47004)); t.listen()
    u = socket.socket(socket.AF_UNIX); u.bind("\\0sandbox-test-smuggled"); u.listen()
    print(os.readlink("/proc/self/ns/net"))
""")


def _destroyed_for(p: netpool.NetnsPool, reason: str) -> int:
    """How many namespaces the pool destroyed for `reason`, once the refill thread
    has checked what was released (a Template keeps some leased for its standbys)."""
    deadline = time.monotonic() + 10
    while not p.stats()["destroyed_by_reason"].get(reason) and time.monotonic() < deadline:
        time.sleep(0.01)
    return p.stats()["destroyed_by_reason"].get(reason, 0)


@pytest.mark.parametrize("backend", ["native", "template"])
def test_sockets_a_tenant_smuggles_out_keep_its_namespace_from_reuse(base_spec, backend) -> None:
    """The release check of a tenant without capabilities reads socket counts
    instead of dumping sockets: a listener and an abstract Unix name that
    outlive the sandbox (their fds sent to the caller), with no packet sent,
    must still keep the namespace from the next tenant."""
    with shared_pool(1, for_network_none=False) as p:
        spec = base_spec(network="pool")
        ours, theirs = socket.socketpair()
        with ours, theirs:
            done = sandbox.run([PY, "-I", "-S", "-c", SMUGGLE, str(theirs.fileno())], spec, capture_output=True,
                               pass_fds=[theirs.fileno()], backend=backend, timeout=60)
            assert done.returncode == 0, done.stderr
            msg, fds, _, _ = socket.recv_fds(ours, 64, 2)
            try:
                assert _destroyed_for(p, "sockets") == 1
                again = sandbox.run([PY, "-I", "-S", "-c", BIND_AGAIN], spec, capture_output=True, backend=backend,
                                    timeout=60)
                assert again.returncode == 0, again.stderr  # the port and the name are free in its namespace
                assert msg.decode() not in again.stdout.decode()
            finally:
                for fd in fds:
                    os.close(fd)


def test_network_none_uses_the_pool_when_enabled(base_spec, run_sh) -> None:
    with shared_pool(1, for_network_none=True) as p:
        before = p.stats()["leased"]
        done = run_sh("true", base_spec(network="none"))
        assert done.returncode == 0 and done.network == "pool"
        assert p.stats()["leased"] == before + 1
    netpool.disable()
    try:
        assert netpool.pool_for("none") is None
        done = run_sh("true", base_spec(network="none"))
        assert done.network == "none"  # a fresh namespace of its own
    finally:
        netpool.restore_default()


def test_the_pool_is_on_by_default_and_the_first_spawn_does_not_wait_for_it(base_spec, run_sh) -> None:
    netpool.disable()
    netpool.restore_default()
    assert netpool.shared_pool() is None
    first = run_sh("true", base_spec(network="none"))
    assert first.network == "none"  # the pool was only just started: a fresh namespace, no waiting
    pool = netpool.shared_pool()
    assert pool is not None and pool.wait_filled(10)
    later = run_sh("readlink /proc/self/ns/net", base_spec(network="none"))
    assert later.network == "pool" and later.stdout.startswith("net:[")


def test_the_pool_can_be_turned_off_by_the_environment(base_spec) -> None:
    spec = base_spec(network="none")
    code = ("import sandbox, sys; s = sandbox.Spec.from_json(sys.argv[1]);"
            " [sandbox.run(['true'], s, backend='native') for _ in range(3)];"
            " from sandbox import netpool; print(netpool.serves_network_none(), netpool.shared_pool())")
    out = subprocess.run([sys.executable, "-c", code, spec.to_json()], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "SANDBOX_NETNS_POOL": "0"}, check=True)
    assert out.stdout.split() == ["False", "None"]


def test_disable_leaves_no_factory_behind(base_spec) -> None:
    netpool.disable()
    p = netpool.enable(size=1, for_network_none=False)
    p.wait_filled(10)
    factory = p.factory_pid
    assert factory is not None and os.path.exists(f"/proc/{factory}")
    netpool.disable()
    assert p.closed
    try:
        os.waitpid(factory, os.WNOHANG)
    except ChildProcessError:
        pass
    state = open(f"/proc/{factory}/stat").read().split()[2] if os.path.exists(f"/proc/{factory}") else "gone"
    assert state in ("gone", "Z")
    netpool.restore_default()


@pytest.mark.parametrize("backend", ["native", "template"])
def test_closing_the_pool_under_running_spawns(base_spec, backend) -> None:
    """netpool.disable() while threads spawn in leased namespaces: each spawn
    runs in a namespace of the pool or fails with a typed error; none ends up
    in a namespace of the caller's (the pool's fd numbers, closed and reused,
    must not reach a spawn: it holds copies of them)."""
    own = os.readlink("/proc/self/ns/net")
    results: list[str] = []
    errors: list[BaseException] = []
    with shared_pool(4, for_network_none=False):
        spec = base_spec(network="pool")
        template = sandbox.Template(spec) if backend == "template" else None

        def work() -> None:
            for _ in range(15):
                try:
                    run = template.run if template is not None else (
                        lambda argv, **kw: sandbox.run(argv, spec, backend="native", **kw))
                    done = run(["readlink", "/proc/self/ns/net"], capture_output=True, text=True, timeout=60)
                    if done.returncode == 0:
                        results.append(done.stdout.strip())
                except sandbox.SandboxError as exc:  # the pool (or the Template's) was closed under it
                    errors.append(exc)
                except BaseException as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for th in threads:
            th.start()
        deadline = time.monotonic() + 30
        while not results and not errors and time.monotonic() < deadline:  # some spawns ran: close under the rest
            time.sleep(0.005)
        netpool.disable()
        for th in threads:
            th.join()
        if template is not None:
            template.close()
    assert results, errors[:3]
    assert own not in results
    assert all(isinstance(e, sandbox.SandboxError) for e in errors), [repr(e) for e in errors[:3]]
