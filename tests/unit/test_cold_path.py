"""The cold path: what a fresh process imports for `import sandbox`, for the
command line's `--version` and for a first `sandbox run`.

Each case runs in a new interpreter of the venv under test (the installed
package; -P keeps the cwd, maybe a checkout, off sys.path) and reads
sys.modules there: a module that was imported cost its import, whether or
not it was used.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import sandbox

# Never imported by `import sandbox` alone: every submodule, the C core, and
# the standard modules that cost the most to import.
HEAVY = ("dataclasses", "typing", "inspect", "json", "subprocess", "ctypes", "pathlib", "platform", "re",
         "_cffi_backend", "pyroute2", "cloudpickle")
# Not imported by a first `sandbox run` that needs none of them (no seccomp
# filter, no forwarded port, no check, no pool, the native backend).
NOT_FOR_A_PLAIN_RUN = (
    "sandbox.seccomp.compile", "sandbox.seccomp.debug", "sandbox.netpool.pool", "sandbox.netpool.lease",
    "sandbox.netpool.factory", "sandbox.netpool.baseline", "sandbox.netpool.rtnetlink", "sandbox.backends.bwrap",
    "sandbox.backends.bwrap.driver", "sandbox.probe", "sandbox.explain", "sandbox.bwrap.unparse", "sandbox.forward",
    "sandbox.template", "sandbox.workerpool", "sandbox.seccomp.stack", "platform", "pyroute2", "cloudpickle",
    # no filter, as bwrap's: no policy, no assembler, no syscall table
    "sandbox.seccomp", "sandbox.seccomp.policy", "sandbox.seccomp.bpf", "sandbox.seccomp.default", "sandbox.syscalls",
    "termios",
)
# ... nor standard modules only some paths use: pathlib (with urllib.parse and ipaddress), json (--spec),
# base64 (a File's or a raw seccomp program's JSON form)
STANDARD_NOT_FOR_A_PLAIN_RUN = ("pathlib", "urllib.parse", "ipaddress", "json", "base64")
# The flatpak-like command line of benchmarks/latency.py
FLATPAK_LIKE = ["--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
                "--symlink", "usr/bin", "/bin", "--symlink", "usr/sbin", "/sbin", "--ro-bind", "/etc/ld.so.cache",
                "/etc/ld.so.cache", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--unshare-all",
                "--die-with-parent", "--new-session", "--clearenv"]


def modules_after(code: str) -> set[str]:
    """The names in sys.modules once `code` has run in a fresh interpreter (its last stdout line)."""
    # printed without json: whether a run imports json is one of the questions
    script = f"{code}\nimport sys\nsys.stdout.write('\\n' + ' '.join(sorted(sys.modules)) + '\\n')"
    done = subprocess.run([sys.executable, "-P", "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.splitlines()[-1].split())


def test_import_sandbox_imports_nothing_else() -> None:
    baseline = modules_after("pass")
    loaded = modules_after("import sandbox") - baseline
    assert loaded <= {"sandbox", "__future__"}, sorted(loaded)
    assert not set(HEAVY) & loaded


def test_every_exported_name_is_there_on_first_use() -> None:
    code = ("import sandbox\n"
            "missing = [n for n in sandbox.__all__ if getattr(sandbox, n, None) is None]\n"
            "assert not missing, missing\n"
            "from sandbox import Spec, Proc, run, spawn, probe, presets, explain, WorkerPool, Template\n"
            "assert sandbox.probe().native in (True, False) and callable(sandbox.explain)\n"
            "assert set(sandbox.__all__) <= set(dir(sandbox))")
    modules_after(code)


@pytest.mark.parametrize("first", ["import sandbox.explain", "from sandbox.explain import describe_plan",
                                   "from sandbox import explain"])
def test_explain_stays_callable_whatever_is_imported_first(first: str) -> None:
    """`sandbox.explain` is a function and `sandbox.explain` a submodule: importing
    the submodule first binds it to the package's name, so it works as the function."""
    modules_after(f"{first}\nimport sandbox\n"
                  "text = sandbox.explain(sandbox.Spec(), ['true'], 'bwrap')\n"
                  "assert text.startswith('backend: bwrap'), text")


def test_submodules_are_attributes_of_the_package() -> None:
    modules_after("import sandbox\nassert sandbox.spec.Spec is sandbox.Spec\nassert sandbox.errors.SpecError\n"
                  "try:\n    sandbox.no_such_thing\nexcept AttributeError:\n    pass\nelse:\n    raise SystemExit(1)")


def test_the_version_imports_nothing_heavy() -> None:
    baseline = modules_after("pass")
    loaded = modules_after("import sys\nfrom sandbox.cli import main\nassert main(['--version']) == 0\n"
                           "sys.argv = ['bwrap', '--version']\nassert main() == 0") - baseline
    assert loaded <= {"sandbox", "sandbox.cli", "sandbox.bwrap", "__future__"}, sorted(loaded)


def test_a_first_run_imports_only_what_it_uses() -> None:
    found = sandbox.probe()
    if not found.native:
        pytest.skip(f"native backend unavailable: {found.native_reason}")
    loaded = modules_after(
        "import sys\nfrom sandbox.cli import main\n"
        "sys.argv = ['sandbox', 'run', '--ro-bind', '/', '/', '--unshare-all', '--proc', '/proc', 'true']\n"
        "assert main() == 0")
    assert "sandbox.backends.native" in loaded  # it ran there
    assert not set(NOT_FOR_A_PLAIN_RUN) & loaded, sorted(set(NOT_FOR_A_PLAIN_RUN) & loaded)


def test_a_policy_brings_its_compiler() -> None:
    loaded = modules_after("from sandbox import Spec\nfrom sandbox.plan import compile_plan\n"
                           "from sandbox.host import HostInfo\nfrom sandbox.capabilities import ALL, Traits\n"
                           "compile_plan(Spec(), HostInfo(uid=1000, gid=1000, cwd='/', environ={}, pool=None, "
                           "executor=Traits('test', 'a test', ALL)))")
    assert "sandbox.seccomp.compile" in loaded
    loaded = modules_after("from sandbox import Spec\nfrom sandbox.plan import compile_plan\n"
                           "from sandbox.host import HostInfo\nfrom sandbox.capabilities import ALL, Traits\n"
                           "compile_plan(Spec(seccomp=None), HostInfo(uid=1000, gid=1000, cwd='/', environ={}, "
                           "pool=None, executor=Traits('test', 'a test', ALL)))")
    assert "sandbox.seccomp.compile" not in loaded


def test_the_default_policy_is_loaded_by_the_spec_that_takes_it() -> None:
    """Spec's seccomp default is the default policy, imported only by a Spec that keeps it."""
    loaded = modules_after("from sandbox.spec import Spec\nassert Spec(seccomp=None).seccomp is None\n"
                           "Spec().replace(seccomp=None)")
    assert "sandbox.seccomp.default" in loaded  # Spec() took it
    loaded = modules_after("from sandbox.spec import Spec, RoBind\n"
                           "spec = Spec([RoBind('/usr')], seccomp=None).replace(network='host')\n"
                           "assert spec.seccomp is None and Spec.from_json(spec.to_json()).seccomp is None")
    assert not {"sandbox.seccomp", "sandbox.seccomp.policy", "sandbox.seccomp.default"} & loaded
    modules_after("from sandbox.spec import Spec\nfrom sandbox.seccomp import DEFAULT_POLICY\n"
                  "assert Spec().seccomp is DEFAULT_POLICY and Spec(seccomp=DEFAULT_POLICY) == Spec()\n"
                  "assert Spec().replace(hostname='x').seccomp is DEFAULT_POLICY\n"
                  "assert Spec.from_json(Spec().to_json()) == Spec()")


def test_a_command_line_loads_seccomp_only_when_it_asks_for_a_filter() -> None:
    """The parser imports the seccomp package where a filter is asked for (each way), and only there."""
    parse = "from sandbox.bwrap.parse import parse_bwrap_args\n"
    loaded = modules_after(f"{parse}spec, _, _ = parse_bwrap_args(['--unshare-all', 'true'])\n"
                           "assert spec.seccomp is None")
    assert "sandbox.seccomp" not in loaded
    modules_after(f"{parse}spec, _, _ = parse_bwrap_args(['--seccomp-default', 'true'])\n"
                  "from sandbox.seccomp import DEFAULT_POLICY\nassert spec.seccomp is DEFAULT_POLICY")
    allow = "struct.pack('HBBI', 0x06, 0, 0, 0x7fff0000)"  # BPF_RET|BPF_K SECCOMP_RET_ALLOW
    for option in ("--seccomp", "--add-seccomp-fd"):
        modules_after(f"import os, struct\n{parse}r, w = os.pipe()\nos.write(w, {allow})\nos.close(w)\n"
                      f"spec, _, _ = parse_bwrap_args(['{option}', str(r), 'true'])\n"
                      f"assert spec.seccomp is not None and spec.seccomp.raw == {allow}, spec.seccomp")


def test_a_first_run_of_a_bwrap_command_line_runs_only_what_it_uses() -> None:
    """The benchmark's command line, as the console script runs it: no module only some paths use is imported."""
    found = sandbox.probe()
    if not found.native:
        pytest.skip(f"native backend unavailable: {found.native_reason}")
    argv = ["sandbox-py", "run", *FLATPAK_LIKE, "/bin/true"]
    loaded = modules_after(f"import sys\nfrom sandbox.cli import main\nsys.argv = {argv!r}\nassert main() == 0")
    assert "sandbox.backends.native" in loaded and "sandbox.coldstart" in loaded  # it ran there, as one shot
    unused = {*NOT_FOR_A_PLAIN_RUN, *STANDARD_NOT_FOR_A_PLAIN_RUN}
    assert not unused & loaded, sorted(unused & loaded)


def test_the_parser_compiles_no_dataclass() -> None:
    """The command line's own classes are plain (bwrap/record.py): on Python 3.11 a dataclass
    compiles its methods when its module is imported, which a direct run pays for."""
    code = ("import dataclasses, sys\nfrom sandbox.bwrap import parse\n"
            "made = [f'{m}.{n}' for m, mod in list(sys.modules.items()) if m.startswith('sandbox.bwrap')\n"
            "        for n, v in vars(mod).items() if isinstance(v, type) and v.__module__ == m\n"
            "        and dataclasses.is_dataclass(v)]\n"
            "assert not made, made")
    modules_after(code)


def test_the_parser_records_behave_as_their_dataclasses_did() -> None:
    from sandbox.bwrap.grammar import BY_NAME
    from sandbox.bwrap.monitor import Monitor
    from sandbox.bwrap.parse import CliExtras

    assert CliExtras() == CliExtras(replay=("--unshare-all",)) != CliExtras(verbose=True)  # replay not compared
    assert CliExtras(monitor=Monitor()) == CliExtras()
    changed = Monitor()
    changed.info_fd = 3
    assert Monitor() == Monitor() != changed and CliExtras(monitor=changed) != CliExtras()
    assert repr(CliExtras()).startswith("CliExtras(backend='auto', close_fds=False,")
    with pytest.raises(AttributeError, match="read-only"):
        CliExtras().backend = "native"  # type: ignore[misc]
    with pytest.raises(AttributeError, match="read-only"):
        BY_NAME["--bind"].nargs = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        hash(Monitor())  # mutable: unhashable
    assert len({BY_NAME["--bind"], BY_NAME["--bind"], BY_NAME["--ro-bind"]}) == 2


def test_the_collector_waits_for_the_start_only() -> None:
    """A one-shot run starts with the garbage collector off and turns it on for
    the wait, which may be long; a run that fails before the sandbox starts turns
    it on again too, and main(argv) leaves it alone."""
    found = sandbox.probe()
    if not found.native:
        pytest.skip(f"native backend unavailable: {found.native_reason}")
    code = ("import gc, sys\nfrom sandbox import cli, signal_relay\n"
            "seen = []\nwait = signal_relay.SignalForwarder.wait\n"
            "def watched(self, proc, readers=None):\n"
            "    seen.append(gc.isenabled())\n    return wait(self, proc, readers)\n"
            "signal_relay.SignalForwarder.wait = watched\n"
            "parse = cli._run\n"
            "def parsing(*args):\n    seen.append(gc.isenabled())\n    return parse(*args)\n"
            "cli._run = parsing\n"
            f"sys.argv = ['sandbox-py', 'run', {', '.join(map(repr, FLATPAK_LIKE))}, 'true']\n"
            "assert cli.main() == 0 and seen == [False, True] and gc.isenabled(), seen\n"
            "sys.argv = ['sandbox-py', 'run', '--no-such-option']\n"
            "assert cli.main() == 125 and gc.isenabled()\n"
            "gc.disable()\n"
            f"assert cli.main(['run', {', '.join(map(repr, FLATPAK_LIKE))}, 'true']) == 0 and not gc.isenabled()\n")
    modules_after(code)
