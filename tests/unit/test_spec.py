"""Spec validation and its JSON round trip. Pure: nothing runs, nothing needs privileges."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sandbox import Limits, Namespaces, Spec
from sandbox.errors import SpecError
from sandbox.mounts import Bind, Chmod, Dev, DevBind, Dir, File, Proc, RemountRo, RoBind, Symlink, Tmpfs
from sandbox.plan import check_argv
from sandbox.spec import MAX_ID


def spec_error(build: Any) -> SpecError:
    """Call `build()` and return the SpecError it raises (fail if it does not)."""
    with pytest.raises(SpecError) as info:
        build()
    return info.value


# ---------------------------------------------------------------- paths


@pytest.mark.parametrize(
    ("build", "field", "value"),
    [
        (lambda: Bind("usr"), "bind.src", "usr"),
        (lambda: Bind("/usr", "usr"), "bind.dest", "usr"),
        (lambda: RoBind("relative/path"), "ro-bind.src", "relative/path"),
        (lambda: DevBind(""), "dev-bind.src", ""),
        (lambda: Tmpfs("tmp"), "tmpfs.dest", "tmp"),
        (lambda: Proc("proc"), "proc.dest", "proc"),
        (lambda: Dev("dev"), "dev.dest", "dev"),
        (lambda: Dir("a/b"), "dir.dest", "a/b"),
        (lambda: Symlink("target", "link"), "symlink.dest", "link"),
        (lambda: File("etc/passwd"), "file.dest", "etc/passwd"),
        (lambda: RemountRo("usr"), "remount-ro.dest", "usr"),
        (lambda: Chmod("x", 0o755), "chmod.path", "x"),
    ],
)
def test_relative_paths_are_rejected_naming_field_and_value(build: Any, field: str, value: str) -> None:
    err = spec_error(build)
    assert err.field == field
    assert err.value == value
    assert "absolute" in err.problem
    assert field in str(err) and repr(value) in str(err)


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: Bind("/a\0b"), "bind.src"),
        (lambda: Bind("/a", "/b\0"), "bind.dest"),
        (lambda: Tmpfs("/t\0"), "tmpfs.dest"),
        (lambda: Dir("/\0"), "dir.dest"),
        (lambda: File("/f\0x"), "file.dest"),
        (lambda: Symlink("tar\0get", "/l"), "symlink.target_path"),
        (lambda: Chmod("/x\0", 0o700), "chmod.path"),
    ],
)
def test_nul_bytes_are_rejected(build: Any, field: str) -> None:
    err = spec_error(build)
    assert err.field == field
    assert "\0" in err.value
    assert "NUL" in err.problem


@pytest.mark.parametrize("path", ["/a/../b", "/..", "/a/..", "/../etc", "/a/b/../../.."])
def test_dotdot_components_are_rejected(path: str) -> None:
    for build, field in ((lambda: Bind(path), "bind.src"), (lambda: Tmpfs(path), "tmpfs.dest"),
                         (lambda: Dir(path), "dir.dest")):
        err = spec_error(build)
        assert (err.field, err.value) == (field, path)
        assert ".." in err.problem


def test_dots_inside_a_name_are_fine() -> None:
    assert Dir("/a/..b/c..").dest == "/a/..b/c.."
    assert Dir("/...").dest == "/..."


def test_paths_are_normalized() -> None:
    assert Bind("/usr//lib/./x/").src == "/usr/lib/x"
    assert Bind("/usr//lib/./x/").dest == "/usr/lib/x"
    assert Tmpfs("//tmp/").dest == "/tmp"
    assert Chmod("/a/./b", 0o700).path == "/a/b"
    assert Spec(cwd="/a//b/").cwd == "/a/b"


def test_bind_dest_defaults_to_src() -> None:
    assert Bind("/opt/x").dest == "/opt/x"
    assert RoBind("/opt/x", "/y").dest == "/y"


def test_non_string_paths_are_rejected() -> None:
    err = spec_error(lambda: Bind(b"/usr"))  # type: ignore[arg-type]
    assert (err.field, err.value) == ("bind.src", b"/usr")
    err = spec_error(lambda: Tmpfs(None))  # type: ignore[arg-type]
    assert err.field == "tmpfs.dest"


def test_mount_errors_inside_a_spec_name_the_index() -> None:
    # A mount object is validated again by the Spec, under its position.
    good = Tmpfs("/t")
    object.__setattr__(good, "dest", "relative")
    err = spec_error(lambda: Spec(mounts=[Dir("/a"), good]))
    assert (err.field, err.value) == ("mounts[1].dest", "relative")


def test_mounts_must_be_mount_operations() -> None:
    err = spec_error(lambda: Spec(mounts=["/usr"]))  # type: ignore[list-item]
    assert (err.field, err.value) == ("mounts[0]", "/usr")
    err = spec_error(lambda: Spec(mounts="/usr"))  # type: ignore[arg-type]
    assert err.field == "mounts"


def test_symlink_target_may_be_relative_but_not_empty() -> None:
    assert Symlink("usr/bin", "/bin").target_path == "usr/bin"
    assert Symlink("../x", "/a/b").target_path == "../x"
    err = spec_error(lambda: Symlink("", "/l"))
    assert (err.field, err.value) == ("symlink.target_path", "")


# ---------------------------------------------------------------- argv


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        ([], "argv"),
        ((), "argv"),
        ("sh", "argv"),
        (b"sh", "argv"),
        ([""], "argv[0]"),
        (["sh", "-c", "a\0b"], "argv[2]"),
        (["sh", 1], "argv[1]"),
        (["sh", None], "argv[1]"),
        (["sh", b"bytes"], "argv[1]"),
    ],
)
def test_check_argv_rejects(argv: Any, field: str) -> None:
    err = spec_error(lambda: check_argv(argv))
    assert err.field == field


def test_check_argv_accepts_paths_and_returns_a_list() -> None:
    from pathlib import PurePosixPath

    assert check_argv(("echo", "")) == ["echo", ""]
    assert check_argv([PurePosixPath("/usr/bin/env"), "x"]) == ["/usr/bin/env", "x"]


# ---------------------------------------------------------------- destinations


def test_two_creators_of_one_path_conflict() -> None:
    err = spec_error(lambda: Spec(mounts=[Symlink("a", "/x"), Symlink("b", "/x")]))
    assert (err.field, err.value) == ("mounts[1].dest", "/x")
    assert "mounts[0]" in err.problem


@pytest.mark.parametrize("mount", [Tmpfs("/x"), Bind("/etc", "/x"), Dir("/x"), RoBind("/usr", "/x")])
def test_a_mount_on_a_symlink_follows_it(mount: Any) -> None:
    # as bwrap: --dir /d --symlink d /x --bind /etc /x mounts on /d
    assert len(Spec(mounts=[Dir("/d"), Symlink("d", "/x"), mount]).mounts) == 3
    assert len(Spec(mounts=[Dir("/a/d"), Symlink("d", "/a/l"), Symlink("a/l", "/x"), mount]).mounts) == 4


@pytest.mark.parametrize("target", ["/d", "../d", "../../x", "l2"])
def test_a_mount_follows_only_a_relative_link_that_stays_inside(target: str) -> None:
    # an absolute or climbing link names another place under bwrap (its intermediate root)
    err = spec_error(lambda: Spec(mounts=[Symlink("../oops", "/l2"), Symlink(target, "/x"), Tmpfs("/x")]))
    assert (err.field, err.value) == ("mounts[2].dest", "/x")
    assert "relative" in err.problem


@pytest.mark.parametrize(
    "mounts",
    [
        [File("/f", readonly=True), File("/f")],  # bwrap: --ro-bind-data, then a file there fails
        [File("/f", readonly=True), File("/f", readonly=True)],
        [File("/f"), Tmpfs("/f")],
        [Symlink("a", "/l"), Symlink("a", "/l")],  # bwrap 0.8.0 fails on an identical link too
        [Symlink("a", "/l"), Symlink("b", "/l")],
        [Dir("/d"), File("/d")],
        [Bind("/usr", "/u"), Symlink("x", "/u")],
        [File("/d"), Dir("//d/")],  # normalized to the same path
    ],
)
def test_conflicting_destinations(mounts: list[Any]) -> None:
    err = spec_error(lambda: Spec(mounts=mounts))
    assert err.field == f"mounts[{len(mounts) - 1}].dest"
    assert err.value == mounts[-1].dest_path()


@pytest.mark.parametrize(
    "mounts",
    [
        [Dir("/x"), Tmpfs("/x")],  # bwrap allows --dir /x --tmpfs /x
        [Tmpfs("/t"), Dir("/t")],  # --dir on an existing directory keeps it
        [RoBind("/", "/"), Tmpfs("/")],
        [Tmpfs("/t"), Tmpfs("/t")],
        [Bind("/usr", "/u"), RoBind("/usr", "/u")],
        [Tmpfs("/t"), RemountRo("/t"), Chmod("/t", 0o700), RemountRo("/t")],  # modifiers create nothing
    ],
)
def test_overmounting_directories_is_allowed(mounts: list[Any]) -> None:
    assert len(Spec(mounts=mounts).mounts) == len(mounts)


@pytest.mark.parametrize("parent", [Symlink("/etc", "/x"), File("/x")])
def test_nothing_may_be_created_under_a_link_or_file(parent: Any) -> None:
    err = spec_error(lambda: Spec(mounts=[Tmpfs("/t"), parent, File("/x/passwd")]))
    assert (err.field, err.value) == ("mounts[2].dest", "/x/passwd")
    assert parent.kind in err.problem


# ---------------------------------------------------------------- numbers


@pytest.mark.parametrize("perms", [-1, 0o10000, 1 << 20, True, "755", 7.0, None])
def test_perms_out_of_range(perms: Any) -> None:
    for build, field in ((lambda: Dir("/d", perms=perms), "dir.perms"),
                         (lambda: Tmpfs("/t", perms=perms), "tmpfs.perms"),
                         (lambda: File("/f", perms=perms), "file.perms"),
                         (lambda: Chmod("/c", perms), "chmod.perms")):
        err = spec_error(build)
        assert err.field == field
        assert err.value is perms


@pytest.mark.parametrize("perms", [0, 0o7777, 0o1777, 0o4755])
def test_perms_in_range(perms: int) -> None:
    assert Dir("/d", perms=perms).perms == perms


@pytest.mark.parametrize("size", [0, -1, True, 1.5, "1M"])
def test_tmpfs_size_must_be_positive(size: Any) -> None:
    err = spec_error(lambda: Tmpfs("/t", size=size))
    assert (err.field, err.value) == ("tmpfs.size", size)


@pytest.mark.parametrize("name", ["uid", "gid"])
@pytest.mark.parametrize("value", [-1, MAX_ID + 1, 2**40, True, "0", 1.0])
def test_ids_out_of_range(name: str, value: Any) -> None:
    err = spec_error(lambda: Spec(**{name: value}))
    assert (err.field, err.value) == (name, value)


@pytest.mark.parametrize("name", ["uid", "gid"])
def test_ids_need_a_user_namespace(name: str) -> None:
    err = spec_error(lambda: Spec(namespaces=Namespaces(user=False), **{name: 1000}))
    assert (err.field, err.value) == (name, 1000)
    assert "user namespace" in err.problem
    assert getattr(Spec(**{name: MAX_ID}), name) == MAX_ID


def test_hostname_needs_a_uts_namespace() -> None:
    err = spec_error(lambda: Spec(hostname="box", namespaces=Namespaces(uts=False)))
    assert (err.field, err.value) == ("hostname", "box")
    assert "UTS" in err.problem


@pytest.mark.parametrize("hostname", ["", "a" * 65, "a/b", "x\0y", 5])
def test_bad_hostnames(hostname: Any) -> None:
    err = spec_error(lambda: Spec(hostname=hostname))
    assert (err.field, err.value) == ("hostname", hostname)


def test_longest_hostname_is_fine() -> None:
    assert Spec(hostname="h" * 64).hostname == "h" * 64


@pytest.mark.parametrize("cap", ["CAP_NOPE", "NOPE", "", "CAP_", "cap_sys_admin2"])
def test_unknown_capabilities(cap: str) -> None:
    err = spec_error(lambda: Spec(cap_add=[cap]))
    assert (err.field, err.value) == ("cap_add", cap)


def test_capability_names_are_normalized() -> None:
    spec = Spec(cap_add=["net_bind_service", "CAP_SYS_ADMIN", "Cap_Chown"])
    assert spec.cap_add == ("CAP_NET_BIND_SERVICE", "CAP_SYS_ADMIN", "CAP_CHOWN")


def test_cap_add_must_be_a_list() -> None:
    err = spec_error(lambda: Spec(cap_add="CAP_CHOWN"))  # type: ignore[arg-type]
    assert err.field == "cap_add"


@pytest.mark.parametrize("name", ["cpu_s", "memory_mb", "file_mb", "nofile", "nproc", "address_space_mb"])
@pytest.mark.parametrize("value", [0, -5, True, 1.5, "10"])
def test_bad_limits(name: str, value: Any) -> None:
    err = spec_error(lambda: Spec(limits=Limits(**{name: value})))
    assert (err.field, err.value) == (f"limits.{name}", value)


@pytest.mark.parametrize("value", [0, -0.5, True, "1", 0.0001, 1e9])
def test_bad_cpu_cores(value: Any) -> None:
    err = spec_error(lambda: Spec(limits=Limits(cpu_cores=value)))
    assert (err.field, err.value) == ("limits.cpu_cores", value)


def test_cgroup_limits_round_trip_through_json() -> None:
    spec = Spec(limits=Limits(memory_mb=100, nproc=32, cpu_cores=0.5, address_space_mb=8192, require_cgroups=True))
    assert Spec.from_json(spec.to_json()).limits == spec.limits
    assert spec_error(lambda: Spec(limits=Limits(require_cgroups=1))).field == "limits.require_cgroups"  # type: ignore[arg-type]


def test_limits_must_be_a_limits() -> None:
    err = spec_error(lambda: Spec(limits={"nofile": 5}))  # type: ignore[arg-type]
    assert err.field == "limits"


# ---------------------------------------------------------------- other fields


def test_network_modes() -> None:
    assert Spec(network="host").network == "host"
    err = spec_error(lambda: Spec(network="bridge"))
    assert (err.field, err.value) == ("network", "bridge")


@pytest.mark.parametrize("name", ["die_with_parent", "new_session", "as_pid_1"])
def test_boolean_fields_must_be_bools(name: str) -> None:
    err = spec_error(lambda: Spec(**{name: 1}))
    assert (err.field, err.value) == (name, 1)


@pytest.mark.parametrize("name", ["user", "mount", "pid", "ipc", "uts", "cgroup"])
def test_namespace_flags_must_be_bools(name: str) -> None:
    err = spec_error(lambda: Spec(namespaces=Namespaces(**{name: "yes"})))
    assert (err.field, err.value) == (f"namespaces.{name}", "yes")


def test_as_pid_1_needs_a_pid_namespace() -> None:
    err = spec_error(lambda: Spec(as_pid_1=True, namespaces=Namespaces(pid=False)))
    assert err.field == "as_pid_1"


def test_mounts_need_a_mount_namespace() -> None:
    err = spec_error(lambda: Spec(mounts=[Tmpfs("/t")], namespaces=Namespaces(mount=False)))
    assert (err.field, err.value) == ("namespaces.mount", False)
    assert Spec(namespaces=Namespaces(mount=False)).mounts == ()


@pytest.mark.parametrize("cwd", ["relative", "/a/../b", "/x\0"])
def test_bad_cwd(cwd: str) -> None:
    err = spec_error(lambda: Spec(cwd=cwd))
    assert (err.field, err.value) == ("cwd", cwd)


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"A=B": "x"}, "env"),
        ({"": "x"}, "env"),
        ({"A\0": "x"}, "env"),
        ({"A": "x\0y"}, "env['A']"),
        ({"A": 1}, "env['A']"),
        ("A=1", "env"),
        ([("A",)], "env"),
    ],
)
def test_bad_env(env: Any, field: str) -> None:
    err = spec_error(lambda: Spec(env=env))
    assert err.field == field


def test_env_is_stored_sorted_and_accepts_pairs() -> None:
    spec = Spec(env={"B": "2", "A": "1"})
    assert spec.env == (("A", "1"), ("B", "2"))
    assert spec.env_dict == {"A": "1", "B": "2"}
    assert Spec(env=[("B", "2"), ("A", "1")]) == spec


def test_bad_env_inherit() -> None:
    assert spec_error(lambda: Spec(env_inherit="LC_*")).field == "env_inherit"  # type: ignore[arg-type]
    err = spec_error(lambda: Spec(env_inherit=["LANG", 3]))  # type: ignore[list-item]
    assert (err.field, err.value) == ("env_inherit[1]", 3)


def test_spec_is_frozen_and_replace_validates() -> None:
    spec = Spec(hostname="a")
    with pytest.raises(AttributeError):
        spec.hostname = "b"  # type: ignore[misc]
    assert spec.replace(hostname="b").hostname == "b"
    err = spec_error(lambda: spec.replace(namespaces=Namespaces(uts=False)))
    assert err.field == "hostname"


def test_defaults_are_the_safe_ones() -> None:
    spec = Spec()
    assert spec.mounts == ()
    assert spec.network == "none"
    assert spec.env == () and spec.env_inherit == ()
    assert spec.cap_add == ()
    assert spec.die_with_parent and spec.new_session and not spec.as_pid_1
    ns = spec.namespaces
    assert ns.user and ns.mount and ns.pid and ns.ipc and ns.uts and ns.cgroup


# ---------------------------------------------------------------- JSON


def full_spec() -> Spec:
    """A Spec using every mount type and most fields."""
    return Spec(
        mounts=[
            RoBind("/usr"), Bind("/srv/data", "/data", optional=True), DevBind("/dev/null", "/null"),
            Tmpfs("/tmp", size=1 << 20, perms=0o1777), Proc(), Dev("/dev"), Dir("/work", perms=0o750),
            Symlink("usr/bin", "/bin"), File("/etc/blob", data=b"\x00\xff\xfe binary\n", perms=0o600, readonly=True),
            File("/etc/empty"), RemountRo("/tmp"), Chmod("/work", 0o700),
        ],
        namespaces=Namespaces(ipc=False, cgroup=False),
        network="host",
        hostname="box",
        uid=1000,
        gid=100,
        env={"PATH": "/usr/bin", "LANG": "C.UTF-8"},
        env_inherit=["LC_*", "TERM"],
        cwd="/work",
        limits=Limits(cpu_s=5, memory_mb=512, file_mb=10, nofile=64, nproc=32),
        die_with_parent=False,
        new_session=False,
        as_pid_1=True,
        cap_add=["CAP_NET_BIND_SERVICE"],
    )


def test_json_round_trip() -> None:
    spec = full_spec()
    text = spec.to_json()
    again = Spec.from_json(text)
    assert again == spec
    assert again.to_json() == text
    assert Spec.from_json(text.encode()) == spec
    assert Spec.from_dict(json.loads(spec.to_json(indent=2))) == spec


def test_json_keeps_file_bytes_exactly() -> None:
    data = bytes(range(256))
    spec = Spec(mounts=[Tmpfs("/t"), File("/t/f", data=data)])
    again = Spec.from_json(spec.to_json())
    assert isinstance(again.mounts[1], File)
    assert again.mounts[1].data == data
    assert "data_base64" in json.loads(spec.to_json())["mounts"][1]


def test_file_data_may_be_text() -> None:
    assert File("/f", data="héllo").data == "héllo".encode()
    err = spec_error(lambda: File("/f", data=5))  # type: ignore[arg-type]
    assert (err.field, err.value) == ("file.data", 5)


def test_default_spec_round_trips() -> None:
    assert Spec.from_json(Spec().to_json()) == Spec()
    assert Spec.from_dict({}) == Spec()


def test_unknown_top_level_key_is_named() -> None:
    data = full_spec().to_dict()
    data["mountz"] = []
    err = spec_error(lambda: Spec.from_dict(data))
    assert (err.field, err.value) == ("spec", "mountz")


def test_unknown_mount_key_is_named() -> None:
    data = {"mounts": [{"type": "tmpfs", "dest": "/t"}, {"type": "dir", "dest": "/d", "mode": 0o700}]}
    err = spec_error(lambda: Spec.from_dict(data))
    assert (err.field, err.value) == ("mounts[1]", "mode")


def test_file_takes_base64_not_raw_data() -> None:
    err = spec_error(lambda: Spec.from_dict({"mounts": [{"type": "file", "dest": "/f", "data": "x"}]}))
    assert (err.field, err.value) == ("mounts[0]", "data")
    err = spec_error(lambda: Spec.from_dict({"mounts": [{"type": "file", "dest": "/f", "data_base64": "!!"}]}))
    assert err.field == "mounts[0].data_base64"


def test_unknown_limits_key_is_named() -> None:
    err = spec_error(lambda: Spec.from_dict({"limits": {"cpu": 1}}))
    assert (err.field, err.value) == ("limits", "cpu")


def test_unknown_namespaces_key_is_named() -> None:
    err = spec_error(lambda: Spec.from_dict({"namespaces": {"net": True}}))
    assert (err.field, err.value) == ("namespaces", "net")


def test_unknown_mount_type_is_named() -> None:
    err = spec_error(lambda: Spec.from_dict({"mounts": [{"type": "unionfs", "dest": "/o"}]}))
    assert (err.field, err.value) == ("mounts[0].type", "unionfs")


@pytest.mark.parametrize("mount", [{"dest": "/t"}, "tmpfs", {"type": "bind"}])
def test_malformed_mounts_in_json(mount: Any) -> None:
    err = spec_error(lambda: Spec.from_dict({"mounts": [mount]}))
    assert err.field.startswith("mounts[0]")


def test_json_values_are_validated_too() -> None:
    err = spec_error(lambda: Spec.from_dict({"mounts": [{"type": "tmpfs", "dest": "tmp"}]}))
    # The mount validates itself on construction, so the field names its kind
    # (not its position in the list).
    assert err.field in ("mounts[0].dest", "tmpfs.dest")
    assert err.value == "tmp"
    err = spec_error(lambda: Spec.from_dict({"limits": {"nofile": 0}}))
    assert err.field == "limits.nofile"


@pytest.mark.parametrize("text", ["{", "[]", "null", '"spec"', ""])
def test_invalid_json_documents(text: str) -> None:
    err = spec_error(lambda: Spec.from_json(text))
    assert err.field == "spec"


def test_check_is_check_networks_old_name() -> None:
    """`Spec.check` became `check_network`: the old name is still taken by the constructor, `replace`,
    `from_dict` and read as a property; the JSON form writes the new one; the two given apart must agree."""
    spec = Spec(check=True)
    assert spec.check_network is True and spec.check is True and spec == Spec(check_network=True)
    assert spec.to_dict()["check_network"] is True and "check" not in spec.to_dict()
    assert Spec.from_dict({"check": True}) == spec == Spec.from_json(spec.to_json())
    assert Spec().replace(check=True) == spec and spec.replace(check=False).check_network is False
    with pytest.raises(SpecError, match="check_network's old name"):
        Spec(check=False, check_network=True)
    with pytest.raises(SpecError, match="check_network's old name"):
        Spec().replace(check=False, check_network=True)
