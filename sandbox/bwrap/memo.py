"""Specs built from a command line, remembered by its words.

Building the Spec (validating every mount, the environment, the
capabilities) is most of parsing. When every option of a command line means
what its words say, whatever the fds and files of the moment (no `--file`,
`--seccomp`, `--spec`, status fd, ...; an `--args` file counts by its
content), the Spec is a function of those words and of the caller's ids,
cwd and environment; the host facts _build reads besides (user namespaces
available, the cgroup namespace, root's effective capabilities) are the
same for every caller of one CLI server, which checks that (cliserver/peer.py).
So the same command line from the same place gets the same Spec object,
and with it the plan compiled for it (sandbox.plan_cache keys on the Spec's
identity) and the native backend's serialized blob.

The CLI server's spare (cliserver/spare.py) parses the previous client's
command line while it waits, so the next one that repeats it skips the
build, the plan and the blob. The memo is small, lives per process, and is
used only where `enable()` was called (the server's spare and worker): a
long-lived caller of the Python API would keep host facts that may change.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

from .. import spec as S
from ..host import HostInfo
from .state import ParseState

MAX_SPECS = 8

# Options that take no fd, read no file and check nothing of the moment when parsed (a bind's
# source is looked up when the sandbox is made, not here; a '..' in one is resolved now: not pure).
PURE = frozenset({
    "--unshare-all", "--share-net", "--unshare-user", "--unshare-user-try", "--unshare-ipc", "--unshare-pid",
    "--unshare-net", "--unshare-uts", "--unshare-cgroup", "--unshare-cgroup-try", "--disable-userns",
    "--uid", "--gid", "--hostname", "--chdir", "--clearenv", "--setenv", "--unsetenv", "--new-session",
    "--die-with-parent", "--as-pid-1",
    "--bind", "--bind-try", "--dev-bind", "--dev-bind-try", "--ro-bind", "--ro-bind-try", "--remount-ro",
    "--proc", "--dev", "--tmpfs", "--mqueue", "--dir", "--symlink", "--perms", "--size", "--chmod",
    "--cap-add", "--cap-drop", "--backend", "--proc-covers", "--close-fds", "--netns-pool", "--seccomp-default",
    "--verbose", "--limit-cpu", "--limit-memory", "--limit-file", "--limit-nofile", "--limit-nproc",
    "--limit-cpu-cores",
})

_enabled = False
_specs: collections.OrderedDict[tuple[Any, ...], S.Spec] = collections.OrderedDict()


def note(st: ParseState, name: str, values: list[str]) -> None:
    """Record option `name` with `values` in the state's replay (or end it: not pure).
    `--args` itself is not recorded: the options of its file are, as they are applied."""
    if st.replay is None or name == "--args":
        return
    if name in PURE and not any(".." in v.split("/") for v in values):
        st.replay += [name, *values]
    else:
        st.replay = None


def built(st: ParseState, host: HostInfo, build: Callable[[ParseState, HostInfo], S.Spec]) -> S.Spec:
    """build(st, host), or the Spec built before from the same words and caller."""
    if st.replay is None or not _enabled:
        return build(st, host)
    key = (tuple(st.replay), host.uid, host.gid, host.cwd, tuple(host.environ.items()))
    spec = _specs.get(key)
    if spec is not None:
        _specs.move_to_end(key)
        return spec
    spec = build(st, host)
    _specs[key] = spec
    if len(_specs) > MAX_SPECS:
        _specs.popitem(last=False)
    return spec


def enable() -> None:
    """Remember Specs in this process from now on (a CLI server's spare, for its one worker)."""
    global _enabled
    _enabled = True
