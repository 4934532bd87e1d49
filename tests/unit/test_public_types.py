"""The public constructors take what a caller naturally has and keep frozen values.

- Each frozen class with a hand-written __init__ (it accepts a list, a dict, a
  pathlib.Path where the value keeps a tuple or a str) has exactly its fields
  as parameters, in order, with the fields' defaults: the dataclass and its
  __init__ cannot drift apart.
- Lists, dicts, sets, generators and os.PathLike values are accepted and kept
  as tuples, sorted pairs and str; the result equals the one built from the
  frozen forms, hashes, and round-trips through JSON.
- A value of the wrong type is a SpecError naming the field and saying what
  it accepts, from every public entry point (the JSON forms included).
Pure: nothing runs.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import os
import struct
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from conftest import BadPath, BytesPath

import sandbox
from sandbox import Spec, task
from sandbox.api import check_pass_fds, with_call_options
from sandbox.errors import SpecError, shown
from sandbox.mounts import Bind, Chmod, Dev, DevBind, Dir, File, Mqueue, Proc, RemountRo, RoBind, Symlink, Tmpfs
from sandbox.plan import check_argv
from sandbox.seccomp import ArgRule, Seccomp

HAND_WRITTEN = [Spec, Bind, RoBind, DevBind, Tmpfs, Proc, Dev, Mqueue, Dir, Symlink, File, RemountRo, Chmod,
                Seccomp, ArgRule, task.Sandbox, task.Bind, task.Layout, task.Proxy]


def spec_error(build: Any) -> SpecError:
    with pytest.raises(SpecError) as info:
        build()
    return info.value


# ---------------------------------------------------------------- __init__ against the fields

OLD_NAMES = {(Spec, "check")}  # a renamed field's old name, still taken by keyword (Spec.check_network)


@pytest.mark.parametrize("cls", HAND_WRITTEN, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_init_has_the_fields_and_their_defaults(cls: type) -> None:
    params = [p for p in inspect.signature(cls).parameters.values()
              if (cls, p.name) not in OLD_NAMES or p.kind is not inspect.Parameter.KEYWORD_ONLY]
    fields = dataclasses.fields(cls)
    assert [p.name for p in params] == [f.name for f in fields]
    for p, f in zip(params, fields, strict=True):
        if f.default is not dataclasses.MISSING:
            assert p.default == f.default, f.name
        elif f.default_factory is not dataclasses.MISSING:
            assert p.default == f.default_factory(), f.name
        else:
            assert p.default is inspect.Parameter.empty, f.name
        assert p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD


# ---------------------------------------------------------------- what a caller has, kept frozen

def test_spec_takes_lists_dicts_and_paths() -> None:
    given = Spec(mounts=[RoBind(Path("/usr")), Bind(PurePosixPath("/home/me/work"), Path("/work"))],
                 env={"PATH": "/usr/bin", "A": "1"}, env_inherit=["LANG", "LC_*"], cwd=Path("/work"),
                 cap_add={"CAP_NET_RAW"}, probe_paths=(p for p in [Path("/etc/shadow"), "/root"]),
                 forward={8080: 9000, 5432: Path("/run/pg.sock")})
    frozen = Spec(mounts=(RoBind("/usr"), Bind("/home/me/work", "/work")), env=(("A", "1"), ("PATH", "/usr/bin")),
                  env_inherit=("LANG", "LC_*"), cwd="/work", cap_add=("CAP_NET_RAW",),
                  probe_paths=("/etc/shadow", "/root"), forward=((5432, "/run/pg.sock"), (8080, 9000)))
    assert given == frozen and hash(given) == hash(frozen)
    assert isinstance(given.mounts, tuple) and given.env == (("A", "1"), ("PATH", "/usr/bin"))
    assert type(given.cwd) is str and all(type(p) is str for p in given.probe_paths)
    assert given.forward == ((5432, "/run/pg.sock"), (8080, 9000))
    assert Spec.from_json(given.to_json()) == given


@pytest.mark.parametrize("mount", [Bind(Path("/a"), Path("/b")), RoBind(Path("/a")), DevBind(Path("/dev/null")),
                                   Tmpfs(Path("/t")), Proc(Path("/p")), Dev(Path("/d")), Mqueue(Path("/m")),
                                   Dir(Path("/x/y")), Symlink(Path("usr/bin"), Path("/bin")),
                                   File(Path("/f"), "text"), RemountRo(Path("/r")), Chmod(Path("/c"), 0o700)],
                         ids=lambda m: m.kind)
def test_mounts_take_path_objects_and_keep_str(mount: Any) -> None:
    for f in dataclasses.fields(mount):
        value = getattr(mount, f.name)
        assert not isinstance(value, os.PathLike), f.name
    assert isinstance(mount.dest_path(), str) and mount.target() == mount.dest_path()  # the old name stays


def test_seccomp_takes_lists_dicts_and_names() -> None:
    given = Seccomp(deny=["ptrace", "bpf"], errno="EPERM", errnos={"clone3": "ENOSYS"},
                    rules=[ArgRule("ioctl", 1, "eq", 0x5412, errno="EACCES")])
    frozen = Seccomp(deny=("bpf", "ptrace"), errno=1, errnos=(("clone3", 38),),
                     rules=(ArgRule("ioctl", 1, "eq", 0x5412, errno=13),))
    assert given == frozen and hash(given) == hash(frozen)
    allow_all = struct.pack("=HBBI", 0x06, 0, 0, 0x7FFF0000)  # BPF_RET|BPF_K SECCOMP_RET_ALLOW
    assert Seccomp(raw=bytearray(allow_all)).raw == allow_all


def test_task_description_takes_lists_dicts_and_paths() -> None:
    given = task.Sandbox(read=[Path("/data")], write=(Path("/runs/1"),), binds=[task.Bind(Path("/w"), "/work")],
                         layout=task.Layout(Path("/w"), Path("/work")), chdir=Path("/w"), hide=["x.y"],
                         env_allow={"MWM_*"}, env={"K": "v"}, ports=[8080], sockets={9000: Path("/run/s.sock")},
                         proxy=task.Proxy(allowed_hosts=["API.example.com"]), records=Path("/runs/rec"),
                         probes=[Path("/root")])
    frozen = task.Sandbox(read=("/data",), write=("/runs/1",), binds=(task.Bind("/w", "/work"),),
                          layout=task.Layout("/w", "/work"), chdir="/w", hide=("x.y",), env_allow=("MWM_*",),
                          env=(("K", "v"),), ports=(8080,), sockets=((9000, "/run/s.sock"),),
                          proxy=task.Proxy(allowed_hosts=("api.example.com",)), records="/runs/rec", probes=("/root",))
    assert given == frozen and hash(given) == hash(frozen)
    assert task.Sandbox.from_json(given.to_json()) == given


def test_call_options_take_path_objects() -> None:
    assert with_call_options(Spec(), Path("/w"), {"A": "b"}) == Spec(cwd="/w", env={"A": "b"})
    assert check_argv([Path("/bin/true"), "x"]) == ["/bin/true", "x"]
    assert check_pass_fds({0, 1}) == (0, 1)


# ---------------------------------------------------------------- wrong types: SpecError naming the field

WRONG: list[tuple[str, Any, str]] = [
    # (what, build, field named)
    ("Spec mounts", lambda: Spec(mounts=RoBind("/usr")), "mounts"),  # type: ignore[arg-type]
    ("Spec mounts str", lambda: Spec(mounts="/usr"), "mounts"),  # type: ignore[arg-type]
    ("Spec mounts set", lambda: Spec(mounts={RoBind("/usr")}), "mounts"),  # type: ignore[arg-type]
    ("Spec mount item", lambda: Spec(mounts=["/usr"]), "mounts[0]"),  # type: ignore[list-item]
    ("Spec env", lambda: Spec(env="A=b"), "env"),  # type: ignore[arg-type]
    ("Spec env value", lambda: Spec(env={"A": 1}), "env['A']"),  # type: ignore[dict-item]
    ("Spec env name", lambda: Spec(env={1: "a"}), "env"),  # type: ignore[dict-item]
    ("Spec env_inherit", lambda: Spec(env_inherit="HOME"), "env_inherit"),
    ("Spec env_inherit dict", lambda: Spec(env_inherit={"HOME": 1}), "env_inherit"),
    ("Spec env_inherit item", lambda: Spec(env_inherit=[1]), "env_inherit[0]"),  # type: ignore[list-item]
    ("Spec cwd", lambda: Spec(cwd=3), "cwd"),  # type: ignore[arg-type]
    ("Spec cwd bytes path", lambda: Spec(cwd=BytesPath()), "cwd"),  # type: ignore[arg-type]
    ("Spec cwd bad path", lambda: Spec(cwd=BadPath()), "cwd"),  # type: ignore[arg-type]
    ("Spec network", lambda: Spec(network=["none"]), "network"),  # type: ignore[arg-type]
    ("Spec hostname", lambda: Spec(hostname=5), "hostname"),  # type: ignore[arg-type]
    ("Spec uid", lambda: Spec(uid="0"), "uid"),  # type: ignore[arg-type]
    ("Spec limits", lambda: Spec(limits={"cpu_s": 1}), "limits"),  # type: ignore[arg-type]
    ("Spec namespaces", lambda: Spec(namespaces=None), "namespaces"),  # type: ignore[arg-type]
    ("Spec cap_add", lambda: Spec(cap_add=[None]), "cap_add[0]"),  # type: ignore[list-item]
    ("Spec seccomp", lambda: Spec(seccomp="default"), "seccomp"),  # type: ignore[arg-type]
    ("Spec landlock", lambda: Spec(landlock=[True]), "landlock"),  # type: ignore[arg-type]
    ("Spec probe_paths", lambda: Spec(probe_paths=Path("/etc")), "probe_paths"),
    ("Spec probe_paths item", lambda: Spec(probe_paths=[b"/etc"]), "probe_paths[0]"),  # type: ignore[list-item]
    ("Spec forward", lambda: Spec(forward=8080), "forward"),  # type: ignore[arg-type]
    ("Spec forward port", lambda: Spec(forward={"²": 80}), "forward['²']"),  # type: ignore[dict-item]
    ("Spec forward long port", lambda: Spec(forward={"9" * 5000: 80}), f"forward[{shown('9' * 5000)}]"),
    ("Spec forward huge port", lambda: Spec(forward=[(10**5000, 80)]), "forward[<int object>]"),
    ("Spec forward target", lambda: Spec(forward={80: 1.5}), "forward[80]"),  # type: ignore[dict-item]
    ("Spec check_network", lambda: Spec(check_network=1), "check_network"),  # type: ignore[arg-type]
    ("Spec check", lambda: Spec(check=1), "check_network"),  # type: ignore[arg-type]  # its old name
    ("Spec check and check_network", lambda: Spec(check=False, check_network=True), "check"),
    ("Bind src", lambda: Bind(None), "bind.src"),  # type: ignore[arg-type]
    ("Bind dest", lambda: Bind("/a", 1), "bind.dest"),  # type: ignore[arg-type]
    ("Tmpfs size", lambda: Tmpfs("/t", size="1M"), "tmpfs.size"),  # type: ignore[arg-type]
    ("Symlink target", lambda: Symlink(b"usr/bin", "/bin"), "symlink.target_path"),  # type: ignore[arg-type]
    ("File data", lambda: File("/f", data=[1]), "file.data"),  # type: ignore[arg-type]
    ("File data surrogate", lambda: File("/f", data="\ud800"), "file.data"),
    ("Chmod perms", lambda: Chmod("/c", "755"), "chmod.perms"),  # type: ignore[arg-type]
    ("Seccomp deny", lambda: Seccomp(deny="ptrace"), "seccomp.deny"),
    ("Seccomp deny item", lambda: Seccomp(deny=[1]), "seccomp.deny"),  # type: ignore[list-item]
    ("Seccomp errnos", lambda: Seccomp(errnos=5), "seccomp.errnos"),  # type: ignore[arg-type]
    ("Seccomp rules", lambda: Seccomp(rules=ArgRule("ioctl", 1, "eq", 1)), "seccomp.rules"),  # type: ignore[arg-type]
    ("Seccomp default", lambda: Seccomp(default=["kill"]), "seccomp.default"),  # type: ignore[arg-type]
    ("ArgRule op", lambda: ArgRule("ioctl", 1, ["eq"], 1), "rule.op"),  # type: ignore[arg-type]
    ("ArgRule width", lambda: ArgRule("ioctl", 1, "eq", 1, width=True), "rule.width"),
    ("task read", lambda: task.Sandbox(read="/data"), "read"),
    ("task read item", lambda: task.Sandbox(read=[3]), "read[0]"),  # type: ignore[list-item]
    ("task binds", lambda: task.Sandbox(binds=[("/a", "/b")]), "binds[0]"),  # type: ignore[list-item]
    ("task env", lambda: task.Sandbox(env=["A=b"]), "env"),  # type: ignore[list-item]
    ("task ports", lambda: task.Sandbox(ports=8080), "ports"),  # type: ignore[arg-type]
    ("task port", lambda: task.Sandbox(ports=["http"]), "ports[0]"),  # type: ignore[list-item]
    ("task sockets", lambda: task.Sandbox(sockets={"٣": "/s"}), "sockets['٣']"),  # type: ignore[dict-item]
    ("task network", lambda: task.Sandbox(network=None), "network"),  # type: ignore[arg-type]
    ("task role", lambda: task.Sandbox(role={"task"}), "role"),  # type: ignore[arg-type]
    ("task proxy hosts", lambda: task.Proxy(allowed_hosts="a.example"), "proxy.allowed_hosts"),
    ("task Bind", lambda: task.Bind(b"/a", "/b"), "binds.source"),  # type: ignore[arg-type]
    ("argv", lambda: check_argv([BadPath()]), "argv[0]"),  # type: ignore[list-item]
    ("pass_fds", lambda: check_pass_fds(3), "pass_fds"),  # type: ignore[arg-type]
    ("pass_fds item", lambda: check_pass_fds(["1", 2]), "pass_fds"),  # type: ignore[list-item]
    ("call cwd", lambda: with_call_options(Spec(), 3, None), "cwd"),  # type: ignore[arg-type]
    ("call env", lambda: with_call_options(Spec(), None, ["A=b"]), "env"),  # type: ignore[arg-type]
    ("backend", lambda: sandbox.backends.choose(["native"]), "backend"),  # type: ignore[arg-type]
    ("run timeout", lambda: sandbox.run(["true"], Spec(), timeout="1"), "timeout"),  # type: ignore[arg-type]
    ("run input", lambda: sandbox.run(["true"], Spec(), input=5), "input"),  # type: ignore[arg-type]
    ("explain spec", lambda: sandbox.explain(5, ["true"]), "spec"),  # type: ignore[arg-type]
    ("Spec.replace unknown", lambda: Spec().replace(nosuch=1), "spec"),
    ("Seccomp.extend deny", lambda: Seccomp().extend(deny=5), "deny"),  # type: ignore[arg-type]
    ("Seccomp.extend errnos", lambda: Seccomp().extend(errnos=5), "errnos"),  # type: ignore[arg-type]
    ("presets writable", lambda: sandbox.presets.host_view(writable=5), "writable"),  # type: ignore[arg-type]
    ("presets executable", lambda: sandbox.presets.python_mounts(5), "executable"),  # type: ignore[arg-type]
    ("from_bwrap_args", lambda: sandbox.from_bwrap_args(5), "args"),  # type: ignore[arg-type]
    ("from_bwrap_args item", lambda: sandbox.from_bwrap_args(["--bind", 5]), "args[1]"),  # type: ignore[list-item]
    ("from_bwrap_args environ", lambda: sandbox.from_bwrap_args(["true"], environ=5), "environ"),  # type: ignore[arg-type]
    ("task.compile", lambda: task.compile(5), "sandbox"),  # type: ignore[arg-type]
    ("task.compile environ", lambda: task.compile(task.Sandbox(), 5), "environ"),  # type: ignore[arg-type]
    ("task.translate argv", lambda: task.translate(task.Sandbox(), 5), "argv"),  # type: ignore[arg-type]
    ("task.outside", lambda: task.outside(task.Sandbox(), 5), "inside_path"),  # type: ignore[arg-type]
    ("task.sanitized_copy", lambda: task.sanitized_copy(5, "/tmp/x"), "src"),  # type: ignore[arg-type]
    ("task.worker_spec", lambda: task.worker_spec(5), "sandbox"),  # type: ignore[arg-type]
    ("task.narrowed", lambda: task.narrowed(task.Sandbox(), 5), "child"),  # type: ignore[arg-type]
    ("task view binds", lambda: task.Sandbox().view(binds=5), "binds"),  # type: ignore[arg-type]
    ("task replace unknown", lambda: task.Sandbox().replace(nosuch=1), "sandbox"),
    ("Spec.from_json type", lambda: Spec.from_json(5), "spec"),  # type: ignore[arg-type]
    ("Spec.from_json long bytes", lambda: Spec.from_json(b"{" * 100), "spec"),
    ("Spec.from_json deep", lambda: Spec.from_json("[" * 100_000), "spec"),
    ("Spec.from_dict int keys", lambda: Spec.from_dict({1: 2, "a": 3}), "spec"),  # type: ignore[dict-item]
    ("Sandbox.from_json long bytes", lambda: task.Sandbox.from_json(b"[" * 100), "sandbox"),
    ("Sandbox.from_json type", lambda: task.Sandbox.from_json(None), "sandbox"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("build", "field"), [(b, f) for _, b, f in WRONG], ids=[w for w, _, _ in WRONG])
def test_wrong_types_are_spec_errors_naming_the_field(build: Any, field: str) -> None:
    err = spec_error(build)
    assert err.field == field
    assert str(err).startswith(f"{field}=") and err.problem


def test_an_error_shows_a_long_or_deep_value_shortened() -> None:
    deep: list[Any] = []
    for _ in range(5000):
        deep = [deep]
    err = spec_error(lambda: Spec(env_inherit=[deep]))
    assert err.field == "env_inherit[0]" and len(str(err)) < 200
    err = spec_error(lambda: Spec(hostname="x" * 100_000))
    assert err.field == "hostname" and len(str(err)) < 600


def test_the_packages_three_name_lists_agree() -> None:
    """sandbox/__init__.py names its public API three times: `__all__`, `_EXPORTS` (where `__getattr__`
    finds each name on first use) and the `if TYPE_CHECKING:` imports (what a type checker sees: a name
    missing there types as `object`, as `sandbox.Overlay` once did). Read from the source, all three agree,
    each name from the same module."""
    tree = ast.parse(Path(sandbox.__file__).read_text())
    typed: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom), ast.dump(imp)
                for alias in imp.names:
                    typed[alias.asname or alias.name] = imp.module or alias.name  # `from . import presets`
    exports = {name: module for name, (module, _) in sandbox._EXPORTS.items()}
    assert set(sandbox.__all__) == set(exports) == set(typed)
    assert len(sandbox.__all__) == len(set(sandbox.__all__))
    assert typed == exports
