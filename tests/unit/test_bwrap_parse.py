"""Parsing of bubblewrap 0.8.0 command lines into a Spec (no sandbox is started)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess

import pytest

from sandbox import spec as S
from sandbox.bwrap.grammar import MAX_ARGS, BwrapArgsError
from sandbox.bwrap.parse import CliExtras, from_bwrap_args, parse_bwrap_args
from sandbox.bwrap.unparse import to_bwrap_args
from sandbox.errors import SpecError
from sandbox.host import effective_caps, userns_available
from sandbox.seccomp import Seccomp, compile_policy

ENV = {"HOME": "/home/u", "PATH": "/usr/bin:/bin", "FOO": "foo", "LANG": "C.UTF-8"}
CWD = "/work/dir"


def parse(*args: str, uid: int = 1000, gid: int = 1000, environ: dict[str, str] | None = None,
          cwd: str = CWD) -> tuple[S.Spec, list[str], CliExtras]:
    return parse_bwrap_args(list(args), environ=ENV if environ is None else environ, cwd=cwd, uid=uid, gid=gid)


def spec_of(*args: str, **kw) -> S.Spec:
    return parse(*args, "true", **kw)[0]


def error_of(*args: str, **kw) -> BwrapArgsError:
    with pytest.raises(BwrapArgsError) as info:
        parse(*args, "true", **kw)
    return info.value


# What each fd a test made refers to: a background thread of this process
# (the namespace pool's) may reuse a closed fd's number at any time, so
# "closed" means the number no longer refers to that same file.
_MADE: dict[int, tuple[int, int]] = {}


def track(fd: int) -> int:
    """Remember what `fd` refers to, for is_closed()."""
    st = os.fstat(fd)
    _MADE[fd] = (st.st_dev, st.st_ino)
    return fd


def pipe_with(data: bytes) -> int:
    """A pipe's read end holding `data` (writer closed); `data` must fit in the pipe."""
    r, w = os.pipe()
    assert os.write(w, data) == len(data)
    os.close(w)
    return track(r)


def memfd_with(data: bytes) -> int:
    """An fd open on an anonymous file holding `data`, positioned at its start."""
    fd = os.memfd_create("args")
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def is_closed(fd: int) -> bool:
    """The test's `fd` was closed (its number is free, or now refers to another file)."""
    try:
        st = os.fstat(fd)
    except OSError as exc:
        return exc.errno == errno.EBADF
    return _MADE.get(fd) != (st.st_dev, st.st_ino)


# ---------------------------------------------------------------- grammar

class TestGrammar:
    def test_options_end_at_double_dash(self):
        spec, argv, _ = parse("--dir", "/a", "--", "--dir", "/b")
        assert argv == ["--dir", "/b"]
        assert [m.dest_path() for m in spec.mounts] == ["/a"]

    def test_options_end_at_first_non_option(self):
        spec, argv, _ = parse("--dir", "/a", "sh", "-c", "--dir /b")
        assert argv == ["sh", "-c", "--dir /b"]
        assert len(spec.mounts) == 1

    def test_command_may_look_like_an_option_after_double_dash(self):
        assert parse("--", "--inadvisable-executable-name--")[1] == ["--inadvisable-executable-name--"]

    def test_only_one_double_dash_is_consumed(self):
        assert parse("--", "--", "x")[1] == ["--", "x"]

    @pytest.mark.parametrize("opt", ["--foo", "-x", "-", "--bind=/a", "--tmpfs=/tmp", "---", "--unshare"])
    def test_unknown_option_is_named(self, opt):
        err = error_of(opt)
        assert str(err) == f"Unknown option {opt}"
        assert err.field == opt
        assert isinstance(err, SpecError) and isinstance(err, ValueError)

    @pytest.mark.parametrize("opt", ["--argv0", "--level-prefix", "--overlay-src", "--tmp-overlay", "--socket"])
    def test_options_newer_than_080_are_unknown(self, opt):
        assert str(error_of(opt, "x")) == f"Unknown option {opt}"

    @pytest.mark.parametrize("args, message", [
        (["--bind", "/a"], "--bind takes two arguments"),
        (["--ro-bind-try", "/a"], "--ro-bind-try takes two arguments"),
        (["--symlink", "a"], "--symlink takes two arguments"),
        (["--setenv", "A"], "--setenv takes two arguments"),
        (["--chmod", "0755"], "--chmod takes two arguments"),
        (["--chdir"], "--chdir takes one argument"),
        (["--remount-ro"], "--remount-ro takes one argument"),
        (["--tmpfs"], "--tmpfs takes an argument"),
        (["--uid"], "--uid takes an argument"),
        (["--perms"], "--perms takes an argument"),
        (["--limit-cpu"], "--limit-cpu takes an argument"),
    ])
    def test_missing_values(self, args, message):
        with pytest.raises(BwrapArgsError) as info:
            parse_bwrap_args(args, environ=ENV, cwd=CWD, uid=1000)
        assert str(info.value) == message

    def test_option_values_are_taken_verbatim_even_if_they_look_like_options(self):
        spec = spec_of("--setenv", "X", "--unshare-net", "--hostname", "--", "--unshare-uts")
        assert spec.env_dict["X"] == "--unshare-net"
        assert spec.hostname == "--"
        assert spec.network == "host"

    def test_no_command_is_an_error(self):
        with pytest.raises(BwrapArgsError, match="No command given"):
            parse("--dir", "/a")
        with pytest.raises(BwrapArgsError, match="No command given"):
            parse("--dir", "/a", "--")
        with pytest.raises(BwrapArgsError, match="No command given"):
            parse()

    def test_too_many_arguments(self):
        args = ["--unshare-ipc"] * MAX_ARGS + ["true"]
        with pytest.raises(BwrapArgsError, match=f"Exceeded maximum number of arguments {MAX_ARGS}"):
            parse(*args)
        assert parse(*args[1:])[1] == ["true"]

    def test_from_bwrap_args_returns_spec_and_argv(self):
        spec, argv = from_bwrap_args(["--unshare-pid", "echo", "hi"], environ=ENV, cwd=CWD, uid=1000)
        assert spec.namespaces.pid and argv == ["echo", "hi"]

    def test_result_round_trips_through_json(self):
        spec = spec_of("--ro-bind", "/usr", "/usr", "--unshare-all", "--perms", "0700", "--tmpfs", "/tmp",
                       "--setenv", "A", "b", "--hostname", "h", "--cap-add", "CAP_KILL")
        assert S.Spec.from_json(spec.to_json()) == spec

    def test_spec_validation_errors_propagate(self):
        with pytest.raises(SpecError, match="conflicts"):
            spec_of("--symlink", "a", "/x", "--symlink", "b", "/x")
        with pytest.raises(SpecError, match=r"\.\."):
            spec_of("--dir", "/a/../b")


# ---------------------------------------------------------------- filesystem operations

class TestMounts:
    def test_binds(self):
        spec = spec_of("--bind", "/a", "/b", "--ro-bind", "/c", "/d", "--dev-bind", "/e", "/f",
                       "--bind-try", "/g", "/h", "--ro-bind-try", "/i", "/j", "--dev-bind-try", "/k", "/l")
        assert spec.mounts == (
            S.Bind("/a", "/b"), S.RoBind("/c", "/d"), S.DevBind("/e", "/f"),
            S.Bind("/g", "/h", optional=True), S.RoBind("/i", "/j", optional=True),
            S.DevBind("/k", "/l", optional=True),
        )

    def test_relative_source_is_resolved_against_cwd(self):
        assert spec_of("--bind", "data", "/data", cwd="/srv/x").mounts == (S.Bind("/srv/x/data", "/data"),)
        assert spec_of("--ro-bind", ".", "/here", cwd="/srv/x").mounts == (S.RoBind("/srv/x", "/here"),)

    def test_dotdot_in_source_resolves_like_realpath(self, tmp_path):
        real = tmp_path / "real"
        (real / "sub").mkdir(parents=True)
        (tmp_path / "link").symlink_to(real / "sub")
        # realpath: link -> real/sub, then '..' -> real (lexically it would be tmp_path)
        spec = spec_of("--bind", "link/../sub", "/x", cwd=str(tmp_path))
        assert spec.mounts[0].src == str(real / "sub")
        spec = spec_of("--bind", "link/..", "/x", cwd=str(tmp_path))
        assert spec.mounts[0].src == os.path.realpath(tmp_path / "real")

    def test_relative_destination_counts_from_root(self):
        spec = spec_of("--bind", "/a", "b/c", "--tmpfs", "t", "--dir", "d", "--symlink", "x", "s",
                       "--proc", "p", "--dev", "dv", "--remount-ro", "b/c", "--chmod", "700", "d")
        assert [m.dest_path() for m in spec.mounts] == ["/b/c", "/t", "/d", "/s", "/p", "/dv", "/b/c", "/d"]

    def test_empty_source(self):
        assert spec_of("--bind-try", "", "/x").mounts == ()
        with pytest.raises(BwrapArgsError, match="Can't find source path"):
            spec_of("--bind", "", "/x")

    def test_other_operations(self):
        spec = spec_of("--tmpfs", "/tmp", "--proc", "/proc", "--dev", "/dev", "--dir", "/d",
                       "--symlink", "usr/bin", "/bin", "--remount-ro", "/", "--chmod", "1755", "/d")
        assert spec.mounts == (
            S.Tmpfs("/tmp", size=None, perms=0o755), S.Proc("/proc", covers="bwrap"), S.Dev("/dev"),
            S.Dir("/d", perms=0o755), S.Symlink("usr/bin", "/bin"), S.RemountRo("/"), S.Chmod("/d", 0o1755),
        )

    def test_order_is_kept(self):
        spec = spec_of("--ro-bind", "/", "/", "--tmpfs", "/tmp", "--dir", "/tmp/a", "--bind", "/x", "/tmp/a")
        assert [m.kind for m in spec.mounts] == ["ro-bind", "tmpfs", "dir", "bind"]

    @pytest.mark.parametrize("text", ["", "8", "0o7", "10000", "-1", "7x", "0x7"])
    def test_chmod_needs_octal(self, text):
        assert str(error_of("--chmod", text, "/x")) == "--chmod takes an octal argument <= 07777"


# ---------------------------------------------------------------- --perms and --size

class TestModifiers:
    @pytest.mark.parametrize("opt, args, default", [
        ("--dir", ["/d"], 0o755), ("--tmpfs", ["/t"], 0o755),
    ])
    def test_perms_default_and_given(self, opt, args, default):
        assert spec_of(opt, *args).mounts[0].perms == default
        assert spec_of("--perms", "1741", opt, *args).mounts[0].perms == 0o1741

    def test_perms_modifies_only_the_next_operation(self):
        spec = spec_of("--perms", "0700", "--dir", "/a", "--dir", "/b", "--tmpfs", "/c")
        assert [m.perms for m in spec.mounts] == [0o700, 0o755, 0o755]

    @pytest.mark.parametrize("text, value", [
        ("0", 0), ("07777", 0o7777), ("755", 0o755), (" 7", 0o7), ("+7", 0o7), ("-0", 0),
    ])
    def test_perms_values_read_like_strtoul(self, text, value):
        assert spec_of("--perms", text, "--dir", "/d").mounts[0].perms == value

    @pytest.mark.parametrize("text", ["", "8", "10000", "-1", "0o7", "7 ", "0x7", " "])
    def test_perms_invalid(self, text):
        assert str(error_of("--perms", text, "--dir", "/d")) == "--perms takes an octal argument <= 07777"

    @pytest.mark.parametrize("after", [
        ["--bind", "/a", "/b"], ["--ro-bind", "/a", "/b"], ["--symlink", "a", "/b"], ["--proc", "/p"],
        ["--dev", "/dev"], ["--remount-ro", "/"], ["--chmod", "755", "/"], ["--unshare-pid"],
        ["--setenv", "A", "B"], ["--chdir", "/"],
    ])
    def test_perms_must_be_followed_by_a_creating_option(self, after):
        err = error_of("--perms", "0700", *after)
        assert str(err) == "--perms must be followed by an option that creates a file"

    def test_perms_at_the_end_of_options_is_ignored_like_bwrap(self):
        # bwrap 0.8.0 only checks after an option, not at '--' or the command
        assert parse("--perms", "0700", "--", "true")[1] == ["true"]
        assert parse("--perms", "0700", "true")[1] == ["true"]

    def test_perms_twice(self):
        assert str(error_of("--perms", "0700", "--perms", "0700", "--dir", "/d")) == \
            "--perms given twice for the same action"
        assert str(error_of("--perms", "0700", "--size", "1", "--perms", "0700", "--tmpfs", "/t")) == \
            "--perms given twice for the same action"

    def test_size_with_tmpfs_in_either_order(self):
        for args in (["--size", "1048576", "--perms", "01777"], ["--perms", "01777", "--size", "1048576"]):
            assert spec_of(*args, "--tmpfs", "/t").mounts == (S.Tmpfs("/t", size=1048576, perms=0o1777),)
        assert spec_of("--size", "4096", "--tmpfs", "/t").mounts == (S.Tmpfs("/t", size=4096, perms=0o755),)

    def test_size_modifies_only_the_next_tmpfs(self):
        spec = spec_of("--size", "4096", "--tmpfs", "/a", "--tmpfs", "/b")
        assert [m.size for m in spec.mounts] == [4096, None]

    @pytest.mark.parametrize("text, value", [
        ("1", 1), ("1048576", 1048576), ("0x1000", 4096), ("010", 8), (str(2**63 - 1), 2**63 - 1),
    ])
    def test_size_values_read_like_strtoull(self, text, value):
        assert spec_of("--size", text, "--tmpfs", "/t").mounts[0].size == value

    @pytest.mark.parametrize("text", [
        "0", "00", "0x0", "123bogus", "", "-12345678", " -12345678", " 1", "+1", "1_0", "0x", "08", str(2**64),
    ])
    def test_size_invalid(self, text):
        assert str(error_of("--size", text, "--tmpfs", "/t")) == "--size takes a non-zero number of bytes"

    @pytest.mark.parametrize("text", [str(2**63), str(2**63 + 1), str(2**64 - 1)])
    def test_size_too_large(self, text):
        assert str(error_of("--size", text, "--tmpfs", "/t")) == \
            "--size (for tmpfs) is limited to 9223372036854775807"

    @pytest.mark.parametrize("after", [["--dir", "/d"], ["--bind", "/a", "/b"], ["--unshare-net"]])
    def test_size_must_be_followed_by_tmpfs(self, after):
        assert str(error_of("--size", "100", *after)) == "--size must be followed by --tmpfs"

    def test_perms_consumed_by_dir_leaves_size_pending(self):
        assert str(error_of("--perms", "0700", "--size", "100", "--dir", "/d")) == \
            "--size must be followed by --tmpfs"

    def test_size_twice(self):
        assert str(error_of("--size", "1", "--size", "2", "--tmpfs", "/t")) == \
            "--size given twice for the same action"

    def test_pending_perms_is_consumed_inside_an_args_file(self):
        fd = pipe_with(b"--dir\x00/d\x00")
        assert spec_of("--perms", "0700", "--args", str(fd)).mounts[0].perms == 0o700

    def test_pending_perms_does_not_leave_an_args_file(self):
        # bwrap 0.8.0 checks after the --args option as after any other
        fd = pipe_with(b"--perms\x000700\x00")
        assert str(error_of("--args", str(fd), "--dir", "/d")) == \
            "--perms must be followed by an option that creates a file"

    def test_pending_modifier_not_consumed_inside_args_file(self):
        fd = pipe_with(b"--perms\x000700\x00")
        assert str(error_of("--args", str(fd), "--bind", "/a", "/b")) == \
            "--perms must be followed by an option that creates a file"


# ---------------------------------------------------------------- file descriptors

class TestFdOptions:
    def test_file_reads_the_fd_and_closes_it(self):
        fd = pipe_with(b"hello\x00world")
        spec, _, extras = parse("--file", str(fd), "/etc/greeting", "true")
        assert spec.mounts == (S.File("/etc/greeting", b"hello\x00world", perms=0o666),)
        assert is_closed(fd)
        assert extras.consumed_fds == (fd,)

    def test_file_with_perms(self):
        fd = pipe_with(b"x")
        assert spec_of("--perms", "0640", "--file", str(fd), "/f").mounts[0].perms == 0o640

    def test_bind_data_and_ro_bind_data(self):
        a, b, c = pipe_with(b"a"), pipe_with(b"b"), pipe_with(b"c")
        spec = spec_of("--bind-data", str(a), "/a", "--ro-bind-data", str(b), "/b",
                       "--perms", "0640", "--ro-bind-data", str(c), "c")
        assert spec.mounts == (
            S.File("/a", b"a", perms=0o600, readonly=False),
            S.File("/b", b"b", perms=0o600, readonly=True),
            S.File("/c", b"c", perms=0o640, readonly=True),
        )
        assert all(is_closed(fd) for fd in (a, b, c))

    def test_file_from_a_regular_file(self, tmp_path):
        path = tmp_path / "data"
        path.write_bytes(b"x" * 200_000)
        fd = track(os.open(path, os.O_RDONLY))
        assert spec_of("--file", str(fd), "/big").mounts[0].data == b"x" * 200_000
        assert is_closed(fd)

    @pytest.mark.parametrize("opt", ["--file", "--bind-data", "--ro-bind-data"])
    def test_reusing_a_consumed_fd_fails_with_ebadf(self, opt):
        fd = pipe_with(b"x")
        err = error_of("--file", str(fd), "/a", opt, str(fd), "/b")
        assert "Bad file descriptor" in str(err)
        assert err.field == opt

    def test_reusing_an_args_fd_fails(self):
        fd = pipe_with(b"--unshare-pid\x00")
        assert "Bad file descriptor" in str(error_of("--args", str(fd), "--file", str(fd), "/a"))

    def test_fd_that_is_not_open(self):
        # A number far above what this process uses: a just-closed one could be
        # reused meanwhile by a background thread (the namespace pool's).
        r = 903
        with pytest.raises(OSError):
            os.fstat(r)
        err = error_of("--file", str(r), "/a")
        assert "Bad file descriptor" in str(err)

    @pytest.mark.parametrize("opt, extra", [("--file", ["/a"]), ("--bind-data", ["/a"]),
                                            ("--ro-bind-data", ["/a"]), ("--args", [])])
    @pytest.mark.parametrize("text", ["3x", "-1", "", "x", "1.0", "99999999999"])
    def test_invalid_fd(self, opt, extra, text):
        assert str(error_of(opt, text, *extra)) == f"Invalid fd: {text}"

    def test_stdio_fd_is_replaced_by_dev_null(self):
        saved = os.dup(0)
        try:
            os.dup2(pipe_with(b"from stdin"), 0)
            assert spec_of("--file", "0", "/f").mounts[0].data == b"from stdin"
            assert os.path.realpath(f"/proc/self/fd/{0}") == os.devnull
        finally:
            os.dup2(saved, 0)
            os.close(saved)


class TestArgsFd:
    def test_args_are_spliced_in(self):
        fd = pipe_with(b"--dir\x00/tmp/hello\x00--setenv\x00X\x00a b\x00")
        spec, argv, extras = parse("--unshare-pid", "--args", str(fd), "--dir", "/after", "true")
        assert [m.dest_path() for m in spec.mounts] == ["/tmp/hello", "/after"]
        assert spec.env_dict["X"] == "a b"
        assert argv == ["true"]
        assert is_closed(fd)
        assert extras.consumed_fds == (fd,)

    def test_several_args_fds(self):
        fds = [pipe_with(f"--dir\x00/tmp/hello/world{i}\x00".encode()) for i in range(3)]
        args = [a for fd in fds for a in ("--args", str(fd))]
        assert [m.dest_path() for m in spec_of(*args).mounts] == [f"/tmp/hello/world{i}" for i in range(3)]

    def test_final_nul_is_optional_and_empty_args_are_kept(self):
        fd = pipe_with(b"--setenv\x00A\x00\x00--setenv\x00B\x00b")
        env = spec_of("--args", str(fd)).env_dict
        assert env["A"] == "" and env["B"] == "b"

    def test_empty_args_file(self):
        assert spec_of("--args", str(pipe_with(b""))).mounts == ()

    def test_args_not_allowed_inside_an_args_file(self):
        inner = pipe_with(b"--dir\x00/x\x00")
        outer = pipe_with(f"--args\x00{inner}\x00".encode())
        assert str(error_of("--args", str(outer))) == "--args not supported in arguments file"
        os.close(inner)

    def test_command_inside_args_file_ends_only_the_file(self):
        # bwrap 0.8.0: parsing of the file stops there; the outer command runs
        fd = pipe_with(b"--dir\x00/a\x00echo\x00hi\x00")
        spec, argv, _ = parse("--args", str(fd), "--dir", "/b", "true")
        assert [m.dest_path() for m in spec.mounts] == ["/a", "/b"]
        assert argv == ["true"]

    def test_double_dash_inside_args_file_ends_only_the_file(self):
        fd = pipe_with(b"--chdir\x00/tmp\x00--\x00--dir\x00/b\x00")
        spec, argv, _ = parse("--args", str(fd), "true")
        assert spec.cwd == "/tmp" and spec.mounts == () and argv == ["true"]

    def test_missing_value_inside_args_file(self):
        fd = pipe_with(b"--perms\x00")
        assert str(error_of("--args", str(fd), "0700", "--dir", "/d")) == "--perms takes an argument"

    def test_non_utf8_arguments_survive(self):
        fd = pipe_with(b"--setenv\x00X\x00\xff\xfe\x00")
        assert spec_of("--args", str(fd)).env_dict["X"] == os.fsdecode(b"\xff\xfe")

    def test_args_count_toward_the_limit(self):
        fd = memfd_with(b"--unshare-pid\x00" * MAX_ARGS)
        with pytest.raises(BwrapArgsError, match="Exceeded maximum number of arguments"):
            parse("--args", str(fd), "true")


# ---------------------------------------------------------------- namespaces and identity

class TestNamespaces:
    def test_bwrap_defaults_for_non_root(self):
        spec = spec_of(uid=1000)
        assert spec.namespaces == S.Namespaces(user=True, mount=True, pid=False, ipc=False, uts=False, cgroup=False)
        assert spec.network == "host"

    def test_bwrap_defaults_for_root(self):
        spec = spec_of(uid=0, gid=0)
        assert spec.namespaces == S.Namespaces(user=False, mount=True, pid=False, ipc=False, uts=False, cgroup=False)

    @pytest.mark.parametrize("opt, name", [
        ("--unshare-user", "user"), ("--unshare-ipc", "ipc"), ("--unshare-pid", "pid"),
        ("--unshare-uts", "uts"), ("--unshare-cgroup", "cgroup"),
    ])
    def test_each_unshare(self, opt, name):
        ns = spec_of(opt, uid=0, gid=0).namespaces
        assert getattr(ns, name) is True
        others = {"user", "ipc", "pid", "uts", "cgroup"} - {name}
        assert not any(getattr(ns, other) for other in others)

    def test_unshare_net(self):
        assert spec_of("--unshare-net").network == "none"

    def test_unshare_all(self):
        spec = spec_of("--unshare-all", uid=0, gid=0)
        assert spec.network == "none"
        ns = spec.namespaces
        assert ns.ipc and ns.pid and ns.uts and ns.mount
        assert ns.user == userns_available()
        assert ns.cgroup == os.path.exists("/proc/self/ns/cgroup")

    def test_share_net_undoes_unshare_all_and_order_matters(self):
        assert spec_of("--unshare-all", "--share-net").network == "host"
        assert spec_of("--share-net", "--unshare-all").network == "none"
        assert spec_of("--share-net", "--unshare-net").network == "none"
        assert spec_of("--unshare-all", "--share-net").namespaces.pid

    def test_try_variants(self):
        assert spec_of("--unshare-user-try", uid=0, gid=0).namespaces.user == userns_available()
        assert spec_of("--unshare-cgroup-try").namespaces.cgroup == os.path.exists("/proc/self/ns/cgroup")


class TestIdentity:
    def test_uid_gid_need_a_user_namespace_when_root(self):
        assert str(error_of("--uid", "5", uid=0, gid=0)) == "Specifying --uid requires --unshare-user or --userns"
        assert str(error_of("--gid", "5", uid=0, gid=0)) == "Specifying --gid requires --unshare-user or --userns"

    def test_uid_equal_to_the_real_one_is_fine_without_userns(self):
        spec = spec_of("--uid", "0", "--gid", "0", uid=0, gid=0)
        assert spec.uid is None and spec.gid is None and not spec.namespaces.user

    def test_uid_gid_with_userns(self):
        spec = spec_of("--unshare-user", "--uid", "1000", "--gid", "1001", uid=0, gid=0)
        assert (spec.uid, spec.gid) == (1000, 1001)

    def test_non_root_implies_userns(self):
        spec = spec_of("--uid", "0", "--gid", "0", uid=1000)
        assert spec.namespaces.user and (spec.uid, spec.gid) == (0, 0)

    def test_last_uid_wins_with_a_warning(self):
        spec, _, extras = parse("--uid", "1", "--uid", "2", "true")
        assert spec.uid == 2
        assert extras.warnings == ("Only the last --uid option will take effect",)

    @pytest.mark.parametrize("text", ["", "abc", "-1", "1x", str(2**31)])
    def test_invalid_uid_and_gid(self, text):
        assert str(error_of("--uid", text)) == f"Invalid uid: {text}"
        assert str(error_of("--gid", text)) == f"Invalid gid: {text}"

    def test_hostname_needs_uts(self):
        assert str(error_of("--hostname", "box")) == "Specifying --hostname requires --unshare-uts"
        assert spec_of("--unshare-uts", "--hostname", "box").hostname == "box"
        assert spec_of("--hostname", "box", "--unshare-all").hostname == "box"

    def test_last_hostname_wins(self):
        spec, _, extras = parse("--unshare-uts", "--hostname", "a", "--hostname", "b", "true")
        assert spec.hostname == "b"
        assert "Only the last --hostname option will take effect" in extras.warnings


# ---------------------------------------------------------------- process options

class TestProcess:
    def test_flags_default_to_bwrap_values(self):
        spec = spec_of()
        assert (spec.die_with_parent, spec.new_session, spec.as_pid_1) == (False, False, False)
        assert spec.cap_add == () and spec.limits == S.Limits() and spec.cwd is None and spec.hostname is None

    def test_flags(self):
        spec = spec_of("--die-with-parent", "--new-session", "--unshare-pid", "--as-pid-1")
        assert (spec.die_with_parent, spec.new_session, spec.as_pid_1) == (True, True, True)

    def test_as_pid_1_needs_a_pid_namespace(self):
        assert str(error_of("--as-pid-1")) == "Specifying --as-pid-1 requires --unshare-pid"

    def test_chdir(self):
        spec = spec_of("--chdir", "/tmp/x")
        assert spec.cwd == "/tmp/x" and spec.env_dict["PWD"] == "/tmp/x"

    def test_relative_chdir_counts_from_root(self):
        assert spec_of("--chdir", "tmp").cwd == "/tmp"
        assert spec_of("--chdir", "/usr/../tmp/").cwd == "/tmp"

    def test_last_chdir_wins_with_a_warning(self):
        spec, _, extras = parse("--chdir", "/", "--chdir", "/tmp", "true")
        assert spec.cwd == "/tmp"
        assert extras.warnings == ("Only the last --chdir option will take effect",)

    def test_no_warning_for_single_options(self):
        assert parse("--chdir", "/", "--uid", "3", "--dir", "/a", "--dir", "/b", "true")[2].warnings == ()

    @pytest.mark.parametrize("opt, field, value", [
        ("--limit-cpu", "cpu_s", 5), ("--limit-memory", "memory_mb", 512), ("--limit-file", "file_mb", 10),
        ("--limit-nofile", "nofile", 64), ("--limit-nproc", "nproc", 100),
    ])
    def test_limits(self, opt, field, value):
        assert getattr(spec_of(opt, str(value)).limits, field) == value

    def test_limits_combine_and_last_wins(self):
        limits = spec_of("--limit-cpu", "1", "--limit-nofile", "10", "--limit-cpu", "2").limits
        assert limits == S.Limits(cpu_s=2, nofile=10)

    @pytest.mark.parametrize("text", ["0", "-1", "", "1.5", "x", " 1"])
    def test_invalid_limits(self, text):
        assert str(error_of("--limit-memory", text)) == "--limit-memory takes a positive integer"


class TestCapabilities:
    def test_add_and_drop_in_order(self):
        caps = spec_of("--cap-add", "CAP_NET_ADMIN", "--cap-add", "cap_kill", "--cap-add", "CAP_CHOWN",
                       "--cap-drop", "CAP_KILL").cap_add
        assert caps == ("CAP_CHOWN", "CAP_NET_ADMIN")

    def test_all(self):
        assert spec_of("--cap-add", "ALL").cap_add == S.CAPABILITIES
        assert spec_of("--cap-add", "all", "--cap-drop", "CAP_SYS_ADMIN").cap_add == \
            tuple(c for c in S.CAPABILITIES if c != "CAP_SYS_ADMIN")
        assert spec_of("--cap-add", "ALL", "--cap-drop", "ALL", "--cap-add", "CAP_KILL").cap_add == ("CAP_KILL",)

    def test_number(self):
        assert spec_of("--cap-add", "5").cap_add == ("CAP_KILL",)

    @pytest.mark.parametrize("name", ["KILL", "CAP_NOPE", "", "99"])
    def test_unknown(self, name):
        assert str(error_of("--cap-add", name)) == f"unknown cap: {name}"
        assert str(error_of("--cap-drop", name)) == f"unknown cap: {name}"

    def test_root_starts_from_its_effective_set(self):
        with open("/proc/self/status") as f:
            mask = int(next(ln for ln in f if ln.startswith("CapEff:")).split()[1], 16)
        expected = tuple(name for bit, name in enumerate(S.CAPABILITIES) if mask >> bit & 1)
        assert set(expected) == effective_caps()
        assert spec_of(uid=0, gid=0).cap_add == expected
        assert spec_of("--cap-drop", "ALL", uid=0, gid=0).cap_add == ()
        dropped = spec_of("--cap-drop", "CAP_KILL", "--cap-drop", "CAP_FOWNER", uid=0, gid=0).cap_add
        assert dropped == tuple(c for c in expected if c not in ("CAP_KILL", "CAP_FOWNER"))

    def test_non_root_starts_from_nothing(self):
        assert spec_of(uid=1000).cap_add == ()


# ---------------------------------------------------------------- seccomp and --disable-userns

DENY_CHMOD = compile_policy(Seccomp(deny=("chmod",)))
DENY_CHROOT = compile_policy(Seccomp(deny=("chroot",)))


class TestSeccomp:
    def test_default_is_no_filter_as_in_bwrap(self):
        assert spec_of().seccomp is None

    def test_seccomp_default_asks_for_the_spec_default_policy(self):
        assert spec_of("--seccomp-default").seccomp == S.Spec().seccomp is not None

    def test_seccomp_fd_gives_a_raw_program(self):
        fd = pipe_with(DENY_CHMOD)
        spec, _, extras = parse("--seccomp", str(fd), "true")
        assert spec.seccomp == Seccomp(raw=DENY_CHMOD)
        assert is_closed(fd) and extras.consumed_fds == (fd,)

    def test_last_seccomp_wins_and_the_earlier_fd_is_left_alone(self):
        first, last = pipe_with(DENY_CHMOD), pipe_with(DENY_CHROOT)
        try:
            spec, _, extras = parse("--seccomp", str(first), "--seccomp", str(last), "true")
            assert spec.seccomp == Seccomp(raw=DENY_CHROOT)
            assert extras.warnings == ("Only the last --seccomp option will take effect",)
            assert not is_closed(first) and is_closed(last)
        finally:
            os.close(first)

    def test_length_must_be_a_multiple_of_8(self):
        assert str(error_of("--seccomp", str(pipe_with(b"x" * 9)))) == "Invalid seccomp data, must be multiple of 8"

    @pytest.mark.parametrize("size", [0, 4097])
    def test_empty_or_too_long_program_is_refused_as_the_kernel_would(self, size):
        err = error_of("--seccomp", str(pipe_with(b"\0" * 8 * size)))
        assert str(err).startswith("Unable to set up system call filtering as requested: "
                                   "prctl(PR_SET_SECCOMP) reported EINVAL.")

    def test_fd_already_consumed(self):
        fd = pipe_with(b"data")
        err = error_of("--seccomp", str(fd), "--file", str(fd), "/f")
        assert str(err).startswith("Can't read seccomp data: Bad file descriptor")

    def test_invalid_fd(self):
        assert str(error_of("--seccomp", "0a")) == "Invalid fd: 0a"

    def test_spec_without_seccomp(self):
        assert spec_of("--spec", S.Spec(seccomp=None).to_json()).seccomp is None
        fd = pipe_with(DENY_CHMOD)
        assert spec_of("--spec", S.Spec(seccomp=None).to_json(), "--seccomp", str(fd)).seccomp == \
            Seccomp(raw=DENY_CHMOD)


class TestDisableUserns:
    def test_default_off(self):
        assert spec_of().disable_userns is False

    def test_with_unshare_user(self):
        assert spec_of("--unshare-user", "--disable-userns").disable_userns is True
        assert spec_of("--disable-userns", "--unshare-user", uid=0, gid=0).disable_userns is True

    @pytest.mark.parametrize("uid", [0, 1000])
    def test_needs_an_explicit_unshare_user(self, uid):
        # like bwrap, the user namespace implied for non-root does not count, nor does -try
        assert str(error_of("--disable-userns", uid=uid, gid=uid)) == "--disable-userns requires --unshare-user"
        assert str(error_of("--unshare-user-try", "--disable-userns", uid=uid, gid=uid)) == \
            "--disable-userns requires --unshare-user"

    def test_spec_with_a_user_namespace_counts(self):
        base = S.Spec(namespaces=S.Namespaces(user=True))
        assert spec_of("--spec", base.to_json(), "--disable-userns").disable_userns is True


# ---------------------------------------------------------------- environment

class TestEnvironment:
    def test_caller_environment_is_kept_and_pwd_set(self):
        spec = spec_of()
        assert spec.env_dict == {**ENV, "PWD": CWD}
        assert spec.env_inherit == ()

    def test_setenv_unsetenv_clearenv_apply_in_order(self):
        env = spec_of("--setenv", "FOO", "bar", "--setenv", "BAR", "baz", "--unsetenv", "HOME").env_dict
        assert env == {"PATH": "/usr/bin:/bin", "FOO": "bar", "BAR": "baz", "LANG": "C.UTF-8", "PWD": CWD}
        env = spec_of("--setenv", "A", "1", "--clearenv", "--setenv", "B", "2").env_dict
        assert env == {"B": "2", "PWD": CWD}
        env = spec_of("--unsetenv", "FOO", "--setenv", "FOO", "again").env_dict
        assert env["FOO"] == "again"

    def test_clearenv_leaves_only_pwd(self):
        assert spec_of("--clearenv").env_dict == {"PWD": CWD}
        assert spec_of("--clearenv", "--chdir", "/").env_dict == {"PWD": "/"}

    def test_pwd_is_set_last(self):
        assert spec_of("--setenv", "PWD", "/elsewhere").env_dict["PWD"] == CWD
        assert spec_of("--unsetenv", "PWD", "--chdir", "/x").env_dict["PWD"] == "/x"

    def test_unsetting_a_missing_variable_is_fine(self):
        assert "NOPE" not in spec_of("--unsetenv", "NOPE").env_dict

    def test_empty_and_odd_values(self):
        env = spec_of("--setenv", "E", "", "--setenv", "S", "a=b c\nd").env_dict
        assert env["E"] == "" and env["S"] == "a=b c\nd"

    @pytest.mark.parametrize("opt, args", [("--setenv", ["A=B", "x"]), ("--setenv", ["", "x"]),
                                           ("--unsetenv", ["A=B"]), ("--unsetenv", [""])])
    def test_invalid_names(self, opt, args):
        assert f"{opt[2:]} failed" in str(error_of(opt, *args))

    def test_default_environment_is_this_process(self, monkeypatch):
        monkeypatch.setenv("SANDBOX_TEST_MARKER", "yes")
        spec, _, _ = parse_bwrap_args(["true"], uid=1000)
        assert spec.env_dict["SANDBOX_TEST_MARKER"] == "yes"
        assert spec.env_dict["PWD"] == os.getcwd()


# ---------------------------------------------------------------- options of this package

class TestOurOptions:
    def test_extras_defaults(self):
        assert parse("true")[2] == CliExtras()

    @pytest.mark.parametrize("backend", ["native", "bwrap", "auto"])
    def test_backend(self, backend):
        assert parse("--backend", backend, "true")[2].backend == backend

    def test_invalid_backend(self):
        assert str(error_of("--backend", "docker")) == "--backend must be one of auto, native, bwrap"

    def test_close_fds(self):
        assert parse("--close-fds", "true")[2].close_fds is True

    @pytest.mark.parametrize("opt, attr", [("--help", "show_help"), ("--version", "show_version")])
    def test_help_and_version_stop_parsing(self, opt, attr):
        spec, argv, extras = parse("--unshare-pid", opt, "--no-such-option")
        assert getattr(extras, attr) and argv == []
        spec, argv, extras = parse_bwrap_args([opt], environ=ENV, cwd=CWD, uid=1000)
        assert getattr(extras, attr)

    def test_errors_before_help_still_count(self):
        with pytest.raises(BwrapArgsError, match="Unknown option --nope"):
            parse("--nope", "--help")


class TestSpecOption:
    BASE = S.Spec(
        mounts=(S.RoBind("/usr"), S.Tmpfs("/tmp")),
        namespaces=S.Namespaces(user=True, pid=True, ipc=False, uts=False, cgroup=False),
        env={"A": "1"}, env_inherit=("LANG", "FO*"), limits=S.Limits(cpu_s=3), cap_add=("CAP_KILL",),
    )

    def test_json_text_is_the_starting_point(self):
        spec = spec_of("--dir", "/tmp/x", "--spec", self.BASE.to_json(), "--unshare-ipc")
        assert spec.mounts == (S.RoBind("/usr"), S.Tmpfs("/tmp"), S.Dir("/tmp/x"))
        assert spec.namespaces == S.Namespaces(user=True, pid=True, ipc=True, uts=False, cgroup=False)
        assert spec.network == "none"  # the Spec's own value
        assert spec.limits == S.Limits(cpu_s=3)
        assert spec.cap_add == ("CAP_KILL",)
        assert (spec.die_with_parent, spec.new_session) == (True, True)  # the Spec's own values

    def test_environment_starts_from_the_spec(self):
        env = spec_of("--spec", self.BASE.to_json(), "--setenv", "B", "2").env_dict
        assert env == {"A": "1", "LANG": "C.UTF-8", "FOO": "foo", "B": "2", "PWD": CWD}
        assert spec_of("--spec", self.BASE.to_json(), "--clearenv").env_dict == {"PWD": CWD}

    def test_options_apply_on_top(self):
        spec = spec_of("--spec", self.BASE.to_json(), "--share-net", "--limit-nofile", "9", "--cap-drop",
                       "ALL", "--chdir", "/tmp", "--unshare-uts", "--hostname", "h")
        assert spec.network == "host" and spec.limits == S.Limits(cpu_s=3, nofile=9)
        assert spec.cap_add == () and spec.cwd == "/tmp" and spec.hostname == "h"

    def test_spec_cwd_sets_pwd(self):
        base = self.BASE.replace(cwd="/usr")
        spec = spec_of("--spec", base.to_json())
        assert spec.cwd == "/usr" and spec.env_dict["PWD"] == "/usr"

    def test_file_path(self, tmp_path):
        (tmp_path / "spec.json").write_text(self.BASE.to_json(indent=2))
        assert spec_of("--spec", str(tmp_path / "spec.json")).mounts == self.BASE.mounts
        assert spec_of("--spec", "spec.json", cwd=str(tmp_path)).mounts == self.BASE.mounts

    def test_missing_file(self, tmp_path):
        err = error_of("--spec", str(tmp_path / "nope.json"))
        assert "Can't read --spec file" in str(err) and "No such file" in str(err)

    def test_invalid_spec(self):
        with pytest.raises(SpecError, match="not valid JSON"):
            spec_of("--spec", "{nope")
        with pytest.raises(SpecError, match="unknown key"):
            spec_of("--spec", '{"bogus": 1}')

    def test_non_root_still_gets_a_user_namespace(self):
        base = S.Spec(namespaces=S.Namespaces(user=False))
        assert spec_of("--spec", base.to_json(), uid=1000).namespaces.user
        assert not spec_of("--spec", base.to_json(), uid=0, gid=0).namespaces.user


# ---------------------------------------------------------------- same messages as bwrap 0.8.0

BWRAP = shutil.which("bwrap")


@pytest.mark.skipif(BWRAP is None, reason="bwrap is not installed")
@pytest.mark.parametrize("args", [
    ["--foo", "true"],
    ["-x", "true"],
    ["--bind=/a", "true"],
    ["--bind", "/a"],
    ["--chdir"],
    ["--perms", "0700", "--bind", "/a", "/b", "true"],
    ["--perms", "8", "--dir", "/a", "true"],
    ["--perms", "0700", "--perms", "0700", "--dir", "/a", "true"],
    ["--size", "0", "--tmpfs", "/a", "true"],
    ["--size", "123bogus", "--tmpfs", "/a", "true"],
    ["--size", str(2**63), "--tmpfs", "/a", "true"],
    ["--size", "100", "--dir", "/a", "true"],
    ["--size", "1", "--size", "1", "--tmpfs", "/a", "true"],
    ["--chmod", "99", "/a", "true"],
    ["--file", "3x", "/a", "true"],
    ["--args", "-1", "true"],
    ["--uid", "abc", "true"],
    ["--hostname", "x", "true"],
    ["--as-pid-1", "true"],
    ["--cap-add", "KILL", "true"],
    ["--seccomp", "0a", "true"],
    ["--disable-userns", "true"],
])
def test_error_messages_match_bwrap(args):
    real = subprocess.run([BWRAP, *args], capture_output=True, text=True, timeout=10)
    assert real.returncode == 1
    with pytest.raises(BwrapArgsError) as info:
        parse_bwrap_args(args, environ=ENV, cwd=CWD, uid=os.getuid(), gid=os.getgid())
    assert real.stderr.strip() == f"bwrap: {info.value}"


@pytest.mark.skipif(BWRAP is None or os.getuid() != 0, reason="needs bwrap and root (no user namespace implied)")
def test_uid_error_matches_bwrap_as_root():
    real = subprocess.run([BWRAP, "--uid", "5", "true"], capture_output=True, text=True, timeout=10)
    with pytest.raises(BwrapArgsError) as info:
        parse_bwrap_args(["--uid", "5", "true"], environ=ENV, cwd=CWD, uid=0, gid=0)
    assert real.stderr.strip() == f"bwrap: {info.value}"


@pytest.mark.skipif(BWRAP is None, reason="bwrap is not installed")
@pytest.mark.parametrize("data", [b"x" * 9, b"x"])
def test_seccomp_data_error_matches_bwrap(data):
    theirs, ours = pipe_with(data), pipe_with(data)
    try:
        real = subprocess.run([BWRAP, "--bind", "/", "/", "--seccomp", str(theirs), "true"],
                              capture_output=True, text=True, timeout=10, pass_fds=(theirs,))
    finally:
        os.close(theirs)
    with pytest.raises(BwrapArgsError) as info:
        parse("--seccomp", str(ours), "true")
    assert real.stderr.strip() == f"bwrap: {info.value}"


def test_round_trip_with_the_renderer():
    spec = S.Spec(
        mounts=(S.RoBind("/usr"), S.Symlink("usr/bin", "/bin"), S.Proc(), S.Dev(), S.Tmpfs("/tmp", size=1 << 20),
                S.Dir("/tmp/d", perms=0o700), S.File("/etc/motd", b"hi", perms=0o644, readonly=True)),
        namespaces=S.Namespaces(user=True, pid=True, ipc=True, uts=True, cgroup=False),
        hostname="box", uid=1000, gid=1000, cwd="/tmp", env={"PATH": "/usr/bin", "PWD": "/tmp"},
        limits=S.Limits(cpu_s=5, nofile=64), cap_add=("CAP_NET_BIND_SERVICE",), die_with_parent=True,
        new_session=False, seccomp=Seccomp(raw=DENY_CHMOD), disable_userns=True,
    )
    args = to_bwrap_args(spec, ["sh", "-c", "true"])
    for fd in args.fds:
        track(fd)
    parsed, argv = from_bwrap_args(list(args), environ={}, cwd="/", uid=0, gid=0)
    assert argv == ["sh", "-c", "true"]
    assert parsed == spec
    assert args.fds and all(is_closed(fd) for fd in args.fds)  # the parser consumed them


class TestProcCovers:
    """`--proc` covers bwrap's entries (S.Proc(covers="bwrap")); `--proc-covers strict`
    gives the Python API's set to every --proc of the command line."""

    def test_the_default_is_bwraps(self):
        assert spec_of("--proc", "/proc").mounts == (S.Proc("/proc", covers="bwrap"),)

    @pytest.mark.parametrize("where", ["before", "after"])
    def test_strict_applies_to_every_proc_wherever_it_comes(self, where):
        option = ["--proc-covers", "strict"]
        procs = ["--proc", "/proc", "--proc", "/p2"]
        spec = spec_of(*(option + procs if where == "before" else procs + option))
        assert spec.mounts == (S.Proc("/proc", covers="strict"), S.Proc("/p2", covers="strict"))

    def test_a_bad_choice_is_refused(self):
        assert str(error_of("--proc-covers", "none", "--proc", "/proc")) == "--proc-covers must be one of bwrap, strict"

    def test_a_specs_own_procs_keep_theirs(self):
        base = S.Spec(mounts=[S.Proc("/proc")], seccomp=None)
        spec = spec_of("--spec", base.to_json(), "--proc", "/p2")
        assert spec.mounts == (S.Proc("/proc", covers="strict"), S.Proc("/p2", covers="bwrap"))

    @pytest.mark.parametrize("covers", ["strict", "bwrap"])
    def test_the_unparser_says_them(self, covers):
        spec = S.Spec(mounts=[S.Proc("/proc", covers=covers)], seccomp=None)
        with to_bwrap_args(spec, ["true"]) as args:
            assert ("--proc-covers" in args) == (covers == "strict")
            assert from_bwrap_args(list(args), uid=0, gid=0)[0].mounts == spec.mounts

    def test_the_unparser_refuses_procs_with_different_covers(self):
        spec = S.Spec(mounts=[S.Proc("/proc"), S.Proc("/p2", covers="bwrap")], seccomp=None)
        with pytest.raises(SpecError, match="the same covers"):
            to_bwrap_args(spec, ["true"])
