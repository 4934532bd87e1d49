"""Spawn+wait latency of /bin/true: native sandbox vs bwrap vs a bare exec.

All variants run interleaved in one process (round-robin), so machine noise
hits them alike; the table reports median and p99 in ms, and each median as a
ratio to bwrap's and to the bare exec's. The sandbox config is flatpak-like:
read-only /usr with the /lib, /lib64, /bin, /sbin links, ld.so.cache, proc,
dev, a tmpfs /tmp, every namespace (a fresh network namespace each time, or
one leased from sandbox.netpool for the network=pool row).

    python benchmarks/latency.py [-n 500] [--json out.json]
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable

import sandbox
from sandbox import netpool

if __package__:
    from .timing import arguments, measure, p99, write_json
else:  # run as a script (or imported by one): benchmarks/ is sys.path[0]
    from timing import arguments, measure, p99, write_json

MOUNTS = [
    sandbox.RoBind("/usr"),
    sandbox.Symlink("usr/lib", "/lib"),
    sandbox.Symlink("usr/lib64", "/lib64"),
    sandbox.Symlink("usr/bin", "/bin"),
    sandbox.Symlink("usr/sbin", "/sbin"),
    sandbox.RoBind("/etc/ld.so.cache"),
    sandbox.Proc("/proc"),
    sandbox.Dev("/dev"),
    sandbox.Tmpfs("/tmp"),
]
BWRAP_ARGS = [
    "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
    "--symlink", "usr/bin", "/bin", "--symlink", "usr/sbin", "/sbin",
    "--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
    "--unshare-all", "--die-with-parent", "--new-session", "--clearenv",
]


def variants() -> dict[str, Callable[[], object]]:
    """name -> one spawn+wait of /bin/true."""
    spec = sandbox.Spec(mounts=MOUNTS)
    pid1 = spec.replace(as_pid_1=True)
    no_filter = spec.replace(seccomp=None)
    netpool.enable(size=8).wait_filled(30)
    out: dict[str, Callable[[], object]] = {
        "subprocess.run /bin/true": lambda: subprocess.run(["/bin/true"], check=True),
        "native sandbox.spawn (leased netns: the default)": lambda: _native(spec),
        "native, fresh netns (pool off)": lambda: _native(spec, pool=False),
        "native, seccomp=None": lambda: _native(no_filter),
        "native, as_pid_1 (no reaper)": lambda: _native(pid1),
    }
    bwrap = shutil.which("bwrap")
    if bwrap:
        out["bwrap (same config)"] = lambda: subprocess.run([bwrap, *BWRAP_ARGS, "/bin/true"], check=True)
        out["sandbox backend=bwrap"] = lambda: _backend(spec, "bwrap")
    return out


def _native(spec: sandbox.Spec, pool: bool = True) -> None:
    netpool.enable(for_network_none=pool)  # the running pool serves network="none", or not
    _backend(spec, "native")


def _backend(spec: sandbox.Spec, backend: str) -> None:
    proc = sandbox.spawn(["/bin/true"], spec, backend=backend)
    if proc.wait() != 0:
        raise RuntimeError(f"sandboxed /bin/true exited {proc.returncode}")


def table(times: dict[str, list[float]]) -> str:
    """A Markdown table with medians, p99s and ratios (to bwrap run bare, with the same options)."""
    med = {k: statistics.median(v) for k, v in times.items()}
    bare = med.get("subprocess.run /bin/true")
    bw = med.get("bwrap (same config)")
    rows = ["| variant | median ms | p99 ms | / bare exec | / bwrap |", "|---|---|---|---|---|"]
    for name, xs in times.items():
        r_bare = f"{med[name] / bare:.2f}x" if bare else "-"
        r_bw = f"{med[name] / bw:.2f}x" if bw else "-"
        rows.append(f"| {name} | {med[name]:.3f} | {p99(xs):.3f} | {r_bare} | {r_bw} |")
    return "\n".join(rows)


def main() -> int:
    ap = arguments(__doc__, 500)
    args = ap.parse_args()
    print(f"# spawn+wait of /bin/true, n={args.n}, uid={os.getuid()}, python {sys.version.split()[0]}, "
          f"kernel {os.uname().release}")
    print(f"# {sandbox.probe().native_reason}")
    times = measure(variants(), args.n)
    print(table(times))
    write_json(args.json, times)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
