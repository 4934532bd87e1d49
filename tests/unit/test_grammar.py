"""The option table of `sandbox.bwrap.grammar`, walked: each option is complete, parsed or
refused by name, printed by usage(), and the renderers speak only what the parser reads."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import os
import re
import shutil
import subprocess
import sys

import pytest

import sandbox.bwrap
from sandbox import spec as S
from sandbox.backends.bwrap.render import render_plan
from sandbox.backends.native import TRAITS as NATIVE
from sandbox.bwrap import argv, grammar, parse, unparse
from sandbox.bwrap.grammar import BY_NAME, GROUPS, LIMIT_FIELD, LIMIT_OPTION, LIMITS, OPTIONS, BwrapArgsError
from sandbox.bwrap.parse import parse_bwrap_args, spec_environment
from sandbox.bwrap.unparse import to_bwrap_args
from sandbox.host import HostInfo
from sandbox.plan import compile_plan, resolve_env
from sandbox.seccomp import Seccomp

ENV = {"HOME": "/home/u", "PATH": "/usr/bin:/bin"}
HANDLED = [option for option in OPTIONS if option.handler is not None]
REFUSED = [option for option in OPTIONS if option.refused is not None]


def names(options: list[grammar.Option]) -> list[str]:
    return [option.name for option in options]


def parse_args(*args: str) -> tuple[S.Spec, list[str], parse.CliExtras]:
    return parse_bwrap_args(list(args), environ=ENV, cwd="/", uid=1000, gid=1000)


# ---------------------------------------------------------------- the table itself

@pytest.mark.parametrize("option", OPTIONS, ids=names(list(OPTIONS)))
def test_every_option_is_complete(option: grammar.Option) -> None:
    assert re.fullmatch(r"--[a-z0-9]+(-[a-z0-9]+)*", option.name)
    assert option.help.strip() and option.help[0].isupper()
    assert len(option.metavar) == option.nargs and all(re.fullmatch(r"[A-Z_|a-z]+", m) for m in option.metavar)
    assert (option.handler is None) != (option.refused is None), "a handler or a refusal, not both"
    assert option.group in GROUPS
    assert (option.group == grammar.REFUSED) == (option.refused is not None)


def test_names_are_unique() -> None:
    assert len(BY_NAME) == len(OPTIONS)


def test_modifiers_and_last_wins_are_handled_options() -> None:
    for option in OPTIONS:
        if option.modifier or option.last_wins:
            assert option.handler is not None and option.nargs == 1


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap is not installed")
def test_every_bwrap_option_is_in_the_table() -> None:
    """The installed bwrap's own --help lists no option we neither parse nor refuse, and
    every option of ours outside "ours" is bwrap's."""
    real = subprocess.run(["bwrap", "--help"], capture_output=True, text=True, timeout=10).stdout
    theirs = set(re.findall(r"^\s+(--[a-z0-9-]+)", real, re.MULTILINE))
    assert theirs, real
    version = subprocess.run(["bwrap", "--version"], capture_output=True, text=True, timeout=10).stdout
    if version.split()[-1] == "0.8.0":
        assert theirs - set(BY_NAME) == set()
        assert {o.name for o in OPTIONS if o.group != grammar.OURS} == theirs
    else:  # newer options are unknown to the 0.8.0 grammar; the old ones must still be covered
        assert {o.name for o in OPTIONS if o.group != grammar.OURS} <= theirs


# ---------------------------------------------------------------- the parser follows the table

@pytest.mark.parametrize("option", REFUSED, ids=names(REFUSED))
def test_refused_by_name(option: grammar.Option) -> None:
    with pytest.raises(BwrapArgsError) as info:
        parse_args(option.name, *["3"] * option.nargs, "true")
    assert str(info.value) == f"{option.name} is not supported by this sandbox"
    assert info.value.field == option.name


@pytest.mark.parametrize("option", REFUSED, ids=names(REFUSED))
def test_refused_even_without_a_value(option: grammar.Option) -> None:
    with pytest.raises(BwrapArgsError, match="not supported"):
        parse_args(option.name)


def test_refused_after_valid_options_and_inside_args_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refused option is refused wherever it comes (every bwrap 0.8.0 option is
    implemented now: the test refuses one of its own)."""
    monkeypatch.setitem(BY_NAME, "--mqueue", grammar._refuse("--mqueue", ("DEST",), "Mount new mqueue", "a test"))
    r, w = os.pipe()
    os.write(w, b"--mqueue\x00/mq\x00")
    os.close(w)
    with pytest.raises(BwrapArgsError, match="--mqueue is not supported"):
        parse_args("--unshare-pid", "--args", str(r), "true")


def test_options_inside_args_files_apply_in_place() -> None:
    r, w = os.pipe()
    os.write(w, b"--mqueue\x00/mq\x00")
    os.close(w)
    spec, _, _ = parse_args("--unshare-ipc", "--args", str(r), "--dir", "/d", "true")
    assert spec.mounts == (S.Mqueue("/mq"), S.Dir("/d"))


@pytest.mark.parametrize("option", HANDLED, ids=names(HANDLED))
def test_every_handled_option_reaches_its_handler(option: grammar.Option) -> None:
    """Given placeholder values the option may fail on them, but never as unknown or refused;
    given too few it fails as bwrap does."""
    try:
        parse_args(option.name, *["x"] * option.nargs, "true")
    except BwrapArgsError as exc:
        assert "Unknown option" not in str(exc)
        assert "not supported" not in str(exc) or str(exc) == "labeling not supported on this system"
    if option.nargs:
        with pytest.raises(BwrapArgsError, match=f"^{option.name} takes "):
            parse_args(option.name, *["x"] * (option.nargs - 1))


# ---------------------------------------------------------------- usage()

def test_usage_shows_every_option_with_its_values_and_help() -> None:
    text = grammar.usage()
    for option in OPTIONS:
        line = next((ln for ln in text.splitlines() if ln.split()[:1] == [option.name]), None)
        assert line is not None, option.name
        assert line.split()[1:1 + option.nargs] == list(option.metavar)
        assert option.help in line
        if option.refused:
            assert option.refused in line


def test_usage_groups_options_in_table_order() -> None:
    text = grammar.usage()
    for group, title in GROUPS.items():  # a group without options is left out
        assert (f"\n{title}:\n" in text) == any(option.group == group for option in OPTIONS)
    positions = [text.index(f"    {option.name} ") for option in OPTIONS]
    groups = list(GROUPS)
    ordered = sorted(OPTIONS, key=lambda o: groups.index(o.group))
    assert [o.name for o in ordered] == [o.name for _, o in sorted(zip(positions, OPTIONS, strict=True))]


# ---------------------------------------------------------------- the limits table, both ways

def test_limit_maps_are_inverse() -> None:
    assert {v: k for k, v in LIMIT_FIELD.items()} == LIMIT_OPTION
    fields = {f.name for f in dataclasses.fields(S.Limits)}
    assert set(LIMIT_OPTION) <= fields
    # file_bytes: said in bytes (the grammar has MB only); the rest are this package's, not bwrap's
    assert fields - set(LIMIT_OPTION) == {"file_bytes", "address_space_mb", "require_cgroups"}


@pytest.mark.parametrize("limit", LIMITS, ids=[limit.option for limit in LIMITS])
def test_limit_round_trips(limit: grammar.Limit) -> None:
    assert BY_NAME[limit.option].handler is not None
    spec = parse_args(limit.option, "7", "true")[0]
    assert getattr(spec.limits, limit.field) == 7
    with to_bwrap_args(S.Spec(limits=S.Limits(**{limit.field: 7})), ["true"]) as args:
        assert args[args.index(limit.option) + 1] == "7"


# ---------------------------------------------------------------- the writers speak the table

def walk(args: list[str]) -> list[str]:
    """The options of a rendered command line, each checked to be a handled option of the
    table, skipping their values by its nargs; stops at `--`."""
    seen, i = [], 0
    while i < len(args) and args[i] != "--":
        option = BY_NAME.get(args[i])
        assert option is not None and option.handler is not None, args[i]
        seen.append(option.name)
        i += 1 + option.nargs
    assert i <= len(args)
    return seen


EVERYTHING = S.Spec(
    mounts=(S.Bind("/a", "/b"), S.RoBind("/usr"), S.DevBind("/dev", optional=True), S.Tmpfs("/t", size=4096),
            S.Proc(), S.Dev(), S.Dir("/d/e/f", perms=0o711), S.Symlink("usr/bin", "/bin"),
            S.File("/etc/x", b"x", perms=0o600), S.File("/etc/y", b"y", readonly=True), S.RemountRo("/usr"),
            S.Chmod("/d", 0o755)),
    namespaces=S.Namespaces(user=True, pid=True, ipc=True, uts=True, cgroup=True), network="pool",
    hostname="h", uid=5, gid=6, cwd="/d", env={"A": "b"}, limits=S.Limits(cpu_s=1, nofile=9),
    die_with_parent=True, new_session=True, as_pid_1=True, disable_userns=True, cap_add=("CAP_KILL",),
    seccomp=Seccomp(deny=("chmod",)),
)
MOUNT_OPTIONS = {"--bind", "--ro-bind", "--dev-bind-try", "--perms", "--size", "--tmpfs", "--proc", "--dev", "--dir",
                 "--symlink", "--file", "--ro-bind-data", "--remount-ro", "--chmod"}


def test_unparse_emits_only_handled_options() -> None:
    with to_bwrap_args(EVERYTHING, ["true"]) as args:
        seen = walk(list(args))
        assert args[-2:] == ["--", "true"]
    assert MOUNT_OPTIONS | {"--netns-pool", "--limit-cpu", "--seccomp", "--hostname", "--uid"} <= set(seen)


def test_render_plan_emits_only_handled_bwrap_options() -> None:
    spec = EVERYTHING.replace(network="none", limits=S.Limits())
    plan = compile_plan(spec, HostInfo(executor=NATIVE, uid=0, gid=0, cwd="/", environ={}))
    with render_plan(plan) as args:
        seen = walk(list(args))
    assert MOUNT_OPTIONS | {"--unshare-net", "--seccomp", "--as-pid-1"} <= set(seen)
    assert all(BY_NAME[name].group != grammar.OURS for name in seen), "the real bwrap would refuse ours"


# ---------------------------------------------------------------- no planner below the grammar

def test_the_grammar_package_does_not_import_the_planner_or_backends() -> None:
    for module in (sandbox.bwrap, grammar, parse, unparse, argv):
        tree = ast.parse(inspect.getsource(module))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = node.module or ""
                assert not (node.level == 2 and target.split(".")[0] in ("plan", "backends", "api")), \
                    f"{module.__name__} imports {target}"
                assert not target.startswith(("sandbox.plan", "sandbox.backends")), module.__name__
    assert "sandbox.bwrap" in sys.modules


@pytest.mark.parametrize("inherit, env", [
    ((), {"A": "1"}),
    (("KEEP_*",), {"KEEP_B": "mine"}),
    (("*",), {}),
    (("PATH", "HO?E"), {"PATH": "/x"}),
])
def test_spec_environment_reads_env_inherit_as_the_planner_does(inherit: tuple[str, ...],
                                                              env: dict[str, str]) -> None:
    spec = S.Spec(env=env, env_inherit=inherit)
    environ = {"KEEP_A": "a", "KEEP_B": "theirs", "PATH": "/bin", "HOME": "/h", "HOSE": "1", "DROP": "x"}
    assert spec_environment(spec, environ) == resolve_env(spec, environ)
