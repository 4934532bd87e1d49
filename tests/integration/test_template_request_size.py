"""A Template takes a request of any size spawn takes: argv and environment
of 200 KiB, 500 KiB and 1 MiB (one SOCK_SEQPACKET message carries at most the
socket's send buffer, ~208 KiB: a larger request goes in a memfd), through
each of its paths (a standby, a recycled sandbox, the server itself for a
call with binds); just over the kernel's limit, it fails as spawn does, with
E2BIG; past what a Template reads at all, a RequestTooLargeError says the
limit before anything is sent."""

from __future__ import annotations

import errno as E
import fcntl
import os
import resource
from collections.abc import Iterator

import pytest
from conftest import make_base_spec

import sandbox
from sandbox import Bind
from sandbox._core.binding import ffi, lib
from sandbox.backends.template import wire
from sandbox.errors import RequestTooLargeError

pytestmark = pytest.mark.integration

KIB = 1024
COUNT = ["sh", "-c", 'printf "%s %s" "$#" "$(env | wc -c)"', "sh"]  # its arguments, the environment's bytes
# the paths a request can take: a standby, a recycled sandbox, the server (a call with per-call binds)
PATHS = ("standby", "recycled", "server")


def environment(size: int) -> dict[str, str]:
    """About `size` bytes of environment ("NAME=value\\0"), in strings of at
    most 64 KiB (the kernel takes at most 128 KiB in one)."""
    out: dict[str, str] = {"PATH": "/usr/bin:/bin"}
    left, i = size, 0
    while left > 0:
        name = f"BIG{i}"
        chunk = min(left, 64 * KIB)
        out[name] = "x" * max(chunk - len(name) - 2, 0)
        left, i = left - chunk, i + 1
    return out


def arguments(size: int) -> list[str]:
    """About `size` bytes of arguments, in strings of 64 KiB."""
    return ["y" * (64 * KIB - 1)] * -(-size // (64 * KIB))


def exec_limit() -> int:
    """The kernel's bound on argv + environment at exec (fs/exec.c): a
    quarter of the stack limit, at most three quarters of 8 MiB."""
    soft = resource.getrlimit(resource.RLIMIT_STACK)[0]
    limit = 6 * 1024 * KIB
    return limit if soft == resource.RLIM_INFINITY else min(limit, soft // 4)


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> sandbox.Spec:
    return make_base_spec()


@pytest.fixture(params=PATHS)
def template(request: pytest.FixtureRequest, spec: sandbox.Spec) -> Iterator[tuple[str, sandbox.Template]]:
    if not sandbox.probe().native:
        pytest.skip("native backend unavailable")
    with sandbox.Template(spec, recycle=request.param == "recycled") as t:
        yield request.param, t


def run(template: tuple[str, sandbox.Template], argv: list[str], env: dict[str, str], tmp: str
        ) -> sandbox.CompletedProcess:
    path, t = template
    binds = [Bind(tmp, "/tmp/mnt")] if path == "server" else []
    return t.run(argv, env=env, binds=binds, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("size", [200 * KIB, 500 * KIB, 1024 * KIB], ids=["200KiB", "500KiB", "1MiB"])
def test_large_environment_and_arguments_as_spawn(template: tuple[str, sandbox.Template], spec: sandbox.Spec,
                                                  size: int, tmp_path: object) -> None:
    for argv, env in ((COUNT, environment(size)), ([*COUNT, *arguments(size)], environment(4 * KIB))):
        want = sandbox.run(argv, spec, env=env, capture_output=True, text=True, timeout=60)
        got = run(template, argv, env, str(tmp_path))
        assert (got.returncode, got.stdout, got.stderr) == (want.returncode, want.stdout, want.stderr)
        n_args, env_bytes = map(int, want.stdout.split())
        assert want.returncode == 0 and (env_bytes >= size if argv == COUNT else n_args * 64 * KIB >= size)
    assert run(template, ["true"], {}, str(tmp_path)).returncode == 0  # and it serves on


def test_just_over_the_kernels_limit_fails_as_spawn(template: tuple[str, sandbox.Template], spec: sandbox.Spec,
                                                    tmp_path: object) -> None:
    env = environment(exec_limit() + 64 * KIB)
    with pytest.raises(sandbox.SandboxError) as spawned:
        sandbox.run(COUNT, spec, env=env, capture_output=True, timeout=60)
    with pytest.raises(sandbox.SandboxError) as templated:
        run(template, COUNT, env, str(tmp_path))
    assert getattr(spawned.value, "errno", None) == getattr(templated.value, "errno", None) == E.E2BIG
    assert "Argument list too long" in str(templated.value)
    assert run(template, ["true"], {}, str(tmp_path)).returncode == 0


def test_past_what_a_template_reads_a_typed_error_says_the_limit(template: tuple[str, sandbox.Template],
                                                                  tmp_path: object) -> None:
    env = environment(lib.SBX_REQ_MAX_SIZE + KIB)
    with pytest.raises(RequestTooLargeError) as info:
        run(template, COUNT, env, str(tmp_path))
    assert info.value.limit == lib.SBX_REQ_MAX_SIZE and info.value.size > info.value.limit
    assert str(lib.SBX_REQ_MAX_SIZE) in str(info.value)
    assert run(template, ["true"], {}, str(tmp_path)).returncode == 0


def sealed(data: bytes, size: int | None = None, seal: bool = True) -> int:
    fd = os.memfd_create("test-request", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    if size is not None:
        os.ftruncate(fd, size)  # sparse: no memory
    if seal:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE)
    return fd


def refusal(t: sandbox.Template, fast: bool, carrier: int) -> int:
    """Send a request-in-memfd header with `carrier` as its memfd, straight
    to the server (`fast`: to its standbys); the errno it is refused with."""
    server = t._server  # type: ignore[attr-defined]
    head = wire.header(blob_len=0, flags=lib.SBX_REQ_IN_MEMFD)
    report = server._send_message(server._fast if fast else server._sock, head, [carrier])
    try:
        answer = ffi.new("struct sbx_template_answer *")
        kind = lib.sbx_template_report(report, answer)
        assert kind not in (lib.SBX_ANSWER_STARTED, lib.SBX_ANSWER_EOF), kind
        return int(answer.report.err)
    finally:
        os.close(report)


@pytest.mark.parametrize("fast", [True, False], ids=["standby", "server"])
def test_a_request_memfd_not_as_the_protocol_says_is_refused_and_the_template_serves_on(fast: bool,
                                                                                       spec: sandbox.Spec) -> None:
    """What a process holding a Template's request socket could send in place
    of a request's memfd: unsealed (its content could change as the server
    reads it), not a memfd at all (a pipe, whose read would block the
    server), a request that says it is in a memfd again, one past
    SBX_REQ_MAX_SIZE. Each is refused on its report socket; the next request
    runs."""
    if not sandbox.probe().native:
        pytest.skip("native backend unavailable")
    good = wire.request(b"", ["true"], (), [], join_netns=False, stdio_mask=0)
    nested = wire.header(blob_len=0, flags=lib.SBX_REQ_IN_MEMFD) + good[wire.REQUEST_SIZE:]
    r, w = os.pipe()
    os.write(w, good)
    os.close(w)
    carriers = {"unsealed": (sealed(good, seal=False), E.EINVAL), "pipe": (r, E.EINVAL),
                "nested": (sealed(nested), E.EINVAL), "huge": (sealed(good, lib.SBX_REQ_MAX_SIZE + 8), E.EMSGSIZE)}
    try:
        with sandbox.Template(spec) as t:
            for name, (fd, errno) in carriers.items():
                assert refusal(t, fast, fd) == errno, name
                assert t.run(["true"], timeout=60).returncode == 0, name
            done = t.run(["sh", "-c", "echo ok"], env=environment(300 * KIB), capture_output=True, timeout=60)
            assert done.stdout == b"ok\n"
    finally:
        for fd, _ in carriers.values():
            os.close(fd)
