"""The command line: `sandbox run <options> /bin/true` against `bwrap <options> /bin/true`, warm and cold.

Every row is a fresh process, what a program that runs the command line pays
for each command, started with subprocess.run and timed to its exit. The
installed `sandbox` command is the CLI server's client (csrc/client/cliclient.c,
docs/cli.md): this copies it (and its `sandbox-py`) into two private
installations, so each has a server of its own:

- warm: its server is started first and serves every call;
- cold: no server; each call starts one (and runs its command line
  directly, as a first use does), and that server is stopped again right
  after the call, outside its timed part.

Two command lines: the flatpak-like options of latency.py (read-only /usr
with its links, ld.so.cache, proc, dev, a tmpfs /tmp, --unshare-all,
--die-with-parent, --new-session, --clearenv), and a coding agent's (about
40 options through `--args FD`, as such wrappers pass them: / read-only,
binds of a work tree and caches, tmpfs masks, new pid/ipc/uts namespaces,
--die-with-parent, --new-session), each under the name bwrap as a drop-in
is installed. Then `--version` of bwrap and of ours, `python -c 'import
sandbox'`, the interpreter's floor (`python -I -S -c pass`), the
Python CLI run directly (SANDBOX_CLI_SERVER=0: a cold call's floor) and
sandbox-launch running the flatpak-like plan (what a harness execs per
command: sandbox.launcher, the avatar; C only, no server). All
interleaved round-robin, so machine noise hits them alike; medians and
p99s in ms, and each median as a ratio to bwrap's with the same options.
`--compare BINDIR` adds the warm, direct, cold and launcher rows of another
installation (its `sandbox` and `sandbox-py` in BINDIR, e.g. a venv of
another commit, and the sandbox-launch of its package), copied and served
as ours are, called in turn with ours: a before/after in one run.
Where flatpak is installed, `flatpak run` of a minimal test app
(benchmarks/flatpak_app.py: a private user installation) with the real
bwrap and with our warm one as the `bwrap` on its PATH; left out, saying
why, where it is not.

    python benchmarks/cli.py [-n 100] [--json out.json] [--compare BINDIR]
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import sandbox

if __package__:
    from . import flatpak_app
    from .latency import BWRAP_ARGS
    from .timing import arguments, measure, p99, write_json
else:  # run as a script (or imported by one): benchmarks/ is sys.path[0]
    import flatpak_app
    from latency import BWRAP_ARGS
    from timing import arguments, measure, p99, write_json

TRUE = ["/bin/true"]
BWRAP = "bwrap <flatpak-like> /bin/true"
AGENT_BWRAP = "bwrap --args FD <agent> /bin/true"
FLOOR = "python -I -S -c pass"
FLATPAK = "flatpak run <test app>, bwrap"
BASELINE = {BWRAP: BWRAP, AGENT_BWRAP: AGENT_BWRAP, "bwrap --version": "bwrap --version"}


def agent_args(work: Path) -> list[str]:
    """A coding agent's sandbox: / read-only, its work tree and caches writable, secrets masked (~40 options)."""
    home = work / "home"
    out = ["--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
           "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    for sub in ("repo", "cache", "npm", "cargo", "pip", "go"):
        (home / sub).mkdir(parents=True, exist_ok=True)
        out += ["--bind", str(home / sub), str(home / sub)]
    for secret in (".ssh", ".aws", ".gnupg", ".config/gh", ".docker", ".kube"):
        out += ["--tmpfs", str(home / secret)]
    for path in ("/etc/ssl", "/etc/ca-certificates", "/usr/share/ca-certificates", "/etc/resolv.conf"):
        out += ["--ro-bind-try", path, path]
    out += ["--setenv", "HOME", str(home), "--setenv", "TMPDIR", "/tmp", "--chdir", str(home / "repo")]
    return out


def _run(argv: list[str], env: dict[str, str] | None = None, args_file: list[str] | None = None,
         ) -> Callable[[], object]:
    """One fresh process of `argv`; with `args_file`, its options come through `--args FD` (a new pipe each time)."""
    data = b"".join(a.encode() + b"\0" for a in args_file or [])

    def call() -> None:
        fds: tuple[int, ...] = ()
        cmd = argv
        if args_file is not None:
            r, w = os.pipe()
            os.write(w, data)
            os.close(w)
            fds = (r,)
            cmd = [argv[0], "--args", str(r), *argv[1:]]
        try:
            done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, pass_fds=fds)
        finally:
            for fd in fds:
                os.close(fd)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:3])} ... exited {done.returncode}: {done.stderr.decode()[-300:]}")
    return call


def installation(root: Path, here: Path | None = None) -> Path:
    """A private copy of the installed client (and its sandbox-py, and a `bwrap` link to it) in `root`;
    `here`: the bin directory to copy them from (default: this interpreter's)."""
    here = here or Path(sys.executable).parent
    root.mkdir()
    for name in ("sandbox", "sandbox-py"):
        if not (here / name).exists():
            raise SystemExit(f"no `{name}` beside {sys.executable}: run this with the installation's python")
        shutil.copy2(here / name, root / name)
    (root / "bwrap").symlink_to("sandbox")
    return root


def launcher_of(bindir: Path) -> Path:
    """The sandbox-launch of the venv whose scripts are in `bindir`."""
    found = sorted(bindir.parent.glob("lib/python3*/site-packages/sandbox/_bin/sandbox-launch"))
    if not found:
        raise SystemExit(f"no sandbox-launch in the venv of {bindir}")
    return found[-1]


def launcher_rows(compare: Path | None) -> dict[str, Callable[[], object]]:
    """sandbox-launch running the flatpak-like plan (made by this package, run by ours and by the
    compared installation's launcher), as a harness execs it per command."""
    from sandbox.launcher import launcher_argv

    spec, command = sandbox.from_bwrap_args([*BWRAP_ARGS, *TRUE])
    argv = launcher_argv(spec, command, "/")
    if not argv[0].endswith("/sandbox-launch"):
        return {}  # no native launcher here: the argv is the Python CLI's
    out = {"sandbox-launch --plan <flatpak-like> /bin/true": _run(argv, _env())}
    if compare is not None:
        out["compared sandbox-launch --plan <flatpak-like> /bin/true"] = _run(
            [str(launcher_of(compare)), *argv[1:]], _env())
    return out


def _env() -> dict[str, str]:
    """This environment without the package's settings (a client with any runs directly)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_")}


class Server:
    """The CLI server of a private installation: started, or stopped between rounds."""

    def __init__(self, root: Path) -> None:
        self.root = root
        # as that installation's own package names it (another commit's may put it elsewhere)
        python = (root / "sandbox-py").read_text().split("\n", 1)[0].removeprefix("#!").strip()
        self.socket = subprocess.run(
            [python, "-c", "import sys\nfrom sandbox.cliserver import socket_path\nprint(socket_path(sys.argv[1]))",
             str(root)], capture_output=True, text=True, check=True, env=_env(), cwd="/").stdout.strip()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        st = os.stat(self.root / "sandbox")
        self.proc = subprocess.Popen([str(self.root / "sandbox-py"), "serve", "--socket", self.socket, "--client",
                                      f"{st.st_dev}:{st.st_ino}:{st.st_mtime_ns}", "--idle", "600"],
                                     env=_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        self._wait(lambda: os.path.exists(self.socket))

    def stop_started(self) -> None:
        """Stop the server a cold call started (once it listens), so the next call is cold again."""
        self._wait(lambda: os.path.exists(self.socket))
        for pid in self._pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        self._wait(lambda: not self._pids())

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait()
        with contextlib.suppress(SystemExit):
            self.stop_started()
        for leftover in (".lock", ".log"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket.removesuffix(".sock") + leftover)
        with contextlib.suppress(OSError):  # the socket directory, if nothing else is in it
            os.rmdir(os.path.dirname(self.socket))

    def _pids(self) -> list[int]:
        found = []
        for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as f:
                if self.socket.encode() in f.read().split(b"\0"):
                    found.append(pid)
        return found

    @staticmethod
    def _wait(cond: Callable[[], bool], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise SystemExit(f"the CLI server did not come up (or go) in time: {cond}")
            time.sleep(0.01)


def variants(warm: Path, cold: Path, work: Path, cold_server: Server, cold_times: dict[str, list[float]],
             other: tuple[Path, Path, Server] | None = None, compare: Path | None = None,
             flatpak: flatpak_app.FlatpakApp | None = None) -> dict[str, Callable[[], object]]:
    """name -> one fresh process, waited for (a cold row's own time goes to `cold_times`); `other`:
    another installation's warm copy, cold copy and the cold copy's server, whose rows follow ours;
    `compare`: its bin directory (for its sandbox-launch); `flatpak`: the test app of the `flatpak run`
    rows."""
    python = sys.executable
    env = _env()
    agent = agent_args(work)
    out: dict[str, Callable[[], object]] = {}
    bwrap = shutil.which("bwrap")
    if bwrap:
        out[BWRAP] = _run([bwrap, *BWRAP_ARGS, *TRUE])
    out["warm: sandbox run <flatpak-like> /bin/true"] = _run([str(warm / "sandbox"), "run", *BWRAP_ARGS, *TRUE], env)
    out["warm: named bwrap <flatpak-like> /bin/true"] = _run([str(warm / "bwrap"), *BWRAP_ARGS, *TRUE], env)
    if bwrap:
        out[AGENT_BWRAP] = _run([bwrap, *TRUE], args_file=agent)
    out["warm: named bwrap --args FD <agent> /bin/true"] = _run([str(warm / "bwrap"), *TRUE], env, agent)
    if other is not None:
        other_warm = other[0]
        out["compared warm: sandbox run <flatpak-like> /bin/true"] = _run(
            [str(other_warm / "sandbox"), "run", *BWRAP_ARGS, *TRUE], env)
        out["compared warm: named bwrap <flatpak-like> /bin/true"] = _run(
            [str(other_warm / "bwrap"), *BWRAP_ARGS, *TRUE], env)
        out["compared warm: named bwrap --args FD <agent> /bin/true"] = _run([str(other_warm / "bwrap"), *TRUE],
                                                                            env, agent)
    if bwrap:
        out["bwrap --version"] = _run([bwrap, "--version"])
    out["sandbox --version"] = _run([str(warm / "sandbox"), "--version"], env)
    out["named bwrap: --version"] = _run([str(warm / "bwrap"), "--version"], env)
    if other is not None:
        out["compared sandbox --version"] = _run([str(other[0] / "sandbox"), "--version"], env)
    out["python -c 'import sandbox'"] = _run([python, "-c", "import sandbox"])
    out[FLOOR] = _run([python, "-I", "-S", "-c", "pass"])
    out.update(launcher_rows(compare))
    if flatpak is not None:
        out.update(flatpak_rows(flatpak, warm, other[0] if other else None))
    out.update(cold_variants("", cold, cold_server, cold_times, agent))
    if other is not None:
        out.update(cold_variants("compared ", other[1], other[2], cold_times, agent))
    return out


def flatpak_rows(app: flatpak_app.FlatpakApp, warm: Path, other_warm: Path | None,
                 ) -> dict[str, Callable[[], object]]:
    """`flatpak run` of the test app with the host's bwrap, then with ours (warm) as its `bwrap`."""
    out = {FLATPAK: _run(app.argv, app.env(app.shim())),
           "warm: flatpak run <test app>, our bwrap": _run(app.argv, app.env(warm))}
    if other_warm is not None:
        out["compared warm: flatpak run <test app>, our bwrap"] = _run(app.argv, app.env(other_warm))
    return out


def build_flatpak_app(root: Path) -> flatpak_app.FlatpakApp | None:
    """The test app of the `flatpak run` rows, or None (and a line saying why they are left out)."""
    reason = flatpak_app.unavailable()
    if reason is None:
        try:
            return flatpak_app.FlatpakApp.build(root)
        except (OSError, RuntimeError, subprocess.CalledProcessError) as e:
            reason = f"its test app could not be built: {e}"
    print(f"# no `flatpak run` rows: {reason}")
    return None


def cold_variants(prefix: str, cold: Path, server: Server, cold_times: dict[str, list[float]],
                  agent: list[str]) -> dict[str, Callable[[], object]]:
    """The direct and cold rows of one installation's cold copy, named with `prefix`."""
    env = _env()
    # the Python CLI alone, with no server to start or ask: what a cold call costs at best
    out: dict[str, Callable[[], object]] = {
        f"{prefix}direct: SANDBOX_CLI_SERVER=0 sandbox run <flatpak-like> /bin/true": _run(
            [str(cold / "sandbox"), "run", *BWRAP_ARGS, *TRUE], {**env, "SANDBOX_CLI_SERVER": "0"})}
    cold_rows = {f"{prefix}cold: sandbox run <flatpak-like> /bin/true": _run(
                     [str(cold / "sandbox"), "run", *BWRAP_ARGS, *TRUE], env),
                 f"{prefix}cold: named bwrap --args FD <agent> /bin/true": _run([str(cold / "bwrap"), *TRUE], env,
                                                                                 agent)}
    for name, call in cold_rows.items():
        out[name] = _cold(call, server, cold_times.setdefault(name, []))
    return out


def _cold(call: Callable[[], object], server: Server, times: list[float]) -> Callable[[], object]:
    """`call`, timed into `times`; then the server it started is stopped (untimed), so the next call is
    cold too and no server warming up competes with it."""
    def cold() -> None:
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1000)
        server.stop_started()
    return cold


def _baseline(name: str) -> str | None:
    if "flatpak run" in name:
        return FLATPAK
    if "--version" in name:
        return "bwrap --version"
    if "<agent>" in name:
        return AGENT_BWRAP
    if "<flatpak-like>" in name:
        return BWRAP
    return None


def table(times: dict[str, list[float]]) -> str:
    """A Markdown table: medians, p99s, and ratios to bwrap's with the same options and to the interpreter."""
    med = {k: statistics.median(v) for k, v in times.items()}
    floor = med.get(FLOOR)
    rows = ["| process | median ms | p99 ms | / bwrap | / python -I -S |", "|---|---|---|---|---|"]
    for name, xs in times.items():
        base = _baseline(name)
        r_bw = f"{med[name] / med[base]:.2f}x" if base in med else "-"
        r_floor = f"{med[name] / floor:.2f}x" if floor else "-"
        rows.append(f"| {name} | {med[name]:.2f} | {p99(xs):.2f} | {r_bw} | {r_floor} |")
    return "\n".join(rows)


def main() -> int:
    ap = arguments(__doc__, 100, "runs per row")
    ap.add_argument("--compare", type=Path,
                    help="also the warm, direct and cold rows of the installation in this bin directory")
    args = ap.parse_args()
    print(f"# fresh processes, n={args.n}, uid={os.getuid()}, {os.cpu_count()} CPUs, "
          f"python {sys.version.split()[0]}, kernel {os.uname().release}, load {os.getloadavg()[0]:.2f}")
    print(f"# sandbox {sandbox.__version__} in {Path(sandbox.__file__).parent}; {sandbox.probe().native_reason}")
    with tempfile.TemporaryDirectory(prefix="sandbox-cli-bench-") as tmp:
        Path(tmp).chmod(0o755)
        warm, cold = installation(Path(tmp) / "warm"), installation(Path(tmp) / "cold")
        warm_server, cold_server = Server(warm), Server(cold)
        other, servers = None, [warm_server, cold_server]
        if args.compare:
            other_warm = installation(Path(tmp) / "compared", args.compare)
            other_cold = installation(Path(tmp) / "compared-cold", args.compare)
            other = (other_warm, other_cold, Server(other_cold))
            servers += [Server(other_warm), other[2]]
            servers[2].start()
        flatpak = build_flatpak_app(Path(tmp) / "flatpak")
        warm_server.start()
        try:
            cold_times: dict[str, list[float]] = {}
            warmup = min(5, args.n)
            times = measure(variants(warm, cold, Path(tmp) / "work", cold_server, cold_times, other, args.compare,
                                     flatpak), args.n, warmup=warmup)
            times.update({name: xs[warmup:] for name, xs in cold_times.items()})
        finally:
            for server in servers:
                server.stop()
    print(table(times))
    write_json(args.json, times)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
