"""A task description compiled into a Spec: pure, given the host's Facts.

The world is an allowlist. In order (later mounts cover earlier ones):
the system read-only (/usr, its links, a few /etc files), a fresh /proc,
/dev and /tmp; then every bind, the interpreter's and the grants together,
shallowest first, so the most specific grant wins (a read-only path inside a
writable one stays read-only, and the reverse); then other interpreters'
site directories emptied; then the covers of `hide` and of the framework
package, each under every name it is shown by.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from .. import spec as S
from ..paths import is_under
from ..plan import resolve_env
from .broker_socket import INSIDE as BROKER_INSIDE
from .description import Sandbox
from .facts import HIDE_ENV, Facts
from .translate import Translator

SYSTEM_PATH = ("/usr/local/bin", "/usr/bin", "/bin")
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
NO_PROXY_VARS = ("NO_PROXY", "no_proxy")
# What urllib, requests and httpx match as loopback in NO_PROXY (each by
# name: none resolves a name first, none reads 127.0.0.0/8 alike, and httpx
# fails on a bracketed "[::1]").
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
# A loopback URL in an environment value: scheme://[user@]127.0.0.1|localhost[:port]
LOOPBACK_URL = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*)://(?:[^@/\s]*@)?(?:127\.0\.0\.1|localhost)(?::(\d{1,5}))?")
DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


@dataclass(frozen=True)
class Shown:
    """One bind of the compiled world: host `source` at `target`."""

    source: str
    target: str
    writable: bool


@dataclass(frozen=True)
class Compiled:
    """The Spec and what the record and the caller need to know about it."""

    spec: S.Spec
    translator: Translator
    binds: tuple[Shown, ...]
    hidden: tuple[str, ...]  # paths inside covered for hide / the framework package
    emptied: tuple[str, ...]  # other interpreters' site directories, emptied
    env_names: tuple[str, ...]
    forward: tuple[tuple[int, int | str], ...]


def _depth(path: str) -> int:
    return len([p for p in path.split("/") if p])


def shown_binds(sb: Sandbox, facts: Facts) -> list[Shown]:
    """Every bind, sorted so that the more specific comes later (and wins)."""
    py = facts.python
    python = [*py.executable_chain, *([py.venv_cfg] if py.venv_cfg else []), *py.stdlib, *py.site_dirs]
    # A link of the chain inside a directory bound at its own path is shown by that bind, as a link:
    # a bind of its own would follow it, in the new root, to a target not mounted yet (ENOENT).
    same = [*sb.read, *sb.write, *(b.source for b in sb.binds if b.source == b.target)]
    shown = {link for link in py.executable_chain[:-1] if any(link != d and is_under(link, d) for d in same)}
    out = [Shown(p, p, False) for p in dict.fromkeys(python) if not is_under(p, "/usr") and p not in shown]
    out += [Shown(p, p, False) for p in facts.packages]
    if sb.framework and sb.framework_package:
        out += [Shown(p, p, False) for p in facts.framework_paths if any(is_under(p, d) for d in py.site_dirs)]
    out += [Shown(p, p, False) for p in sb.read]
    out += [Shown(p, p, True) for p in sb.write]
    out += [Shown(b.source, b.target, b.writable) for b in sb.binds]
    return sorted(out, key=lambda s: _depth(s.target))


def names_of(path: str, binds: list[Shown], realpaths: Mapping[str, str]) -> list[str]:
    """Every path inside by which host `path` is shown: under /usr at its own
    path, and below each bind's target whose source holds it (or its link's end)."""
    real = realpaths.get(path, path)
    out = []
    if is_under(path, "/usr"):
        out.append(path)
    for b in binds:
        src_real = realpaths.get(b.source, b.source)
        for candidate, root in ((path, b.source), (real, b.source), (path, src_real), (real, src_real)):
            if is_under(candidate, root):
                rest = candidate[len(root):].lstrip("/") if root != "/" else candidate.lstrip("/")
                out.append(b.target if not rest else b.target.rstrip("/") + "/" + rest)
    return list(dict.fromkeys(out))


def _empty(dest: str) -> list[S.Mount]:
    """An empty read-only directory over `dest`."""
    return [S.Tmpfs(dest, perms=0o555), S.RemountRo(dest)]


def cover_mounts(path: str, is_dir: bool, names: list[str], empty_file: str) -> list[S.Mount]:
    """Cover `path` under each of its `names`: a directory by an empty one, a
    file by an empty file and its package's __pycache__ by an empty directory."""
    out: list[S.Mount] = []
    for name in names:
        if is_dir:
            out += _empty(name)
        else:
            out.append(S.RoBind(empty_file, name))
    return out


def build_env(sb: Sandbox, facts: Facts, environ: Mapping[str, str], tr: Translator,
              binds: list[Shown], proxy_port: int | None) -> dict[str, str]:
    """The command's environment: the allowed names and patterns, the explicit
    values, each value translated; PATH rebuilt; SANDBOX_HIDE passed on."""
    allowed = resolve_env(S.Spec(env_inherit=sb.env_allow), environ) if sb.env_allow else {}
    env = tr.env({**allowed, **sb.env_dict})
    # This interpreter's directory leads, so `#!/usr/bin/env python3` runs on it.
    path_dirs = [facts.python.bindir, *SYSTEM_PATH]
    for entry in environ.get("PATH", "").split(":"):
        if entry.startswith("/") and any(is_under(entry, b.source) for b in binds):
            path_dirs.append(tr.path(entry))
    env["PATH"] = ":".join(dict.fromkeys(path_dirs))
    hidden = [n for n, _ in facts.hidden]
    if hidden:
        env[HIDE_ENV] = ",".join(hidden)
    extra = [os.path.dirname(p) for p in facts.packages
             if not any(is_under(p, d) for d in facts.python.site_dirs)]
    if extra:
        env["PYTHONPATH"] = ":".join(dict.fromkeys([*extra, *filter(None, env.get("PYTHONPATH", "").split(":"))]))
    if proxy_port is not None:
        for name in PROXY_VARS:
            env[name] = f"http://127.0.0.1:{proxy_port}"
    return env


def no_proxy(env: Mapping[str, str], ports: list[int]) -> dict[str, str]:
    """NO_PROXY and no_proxy for a sandbox with the proxy: the loopback names
    and each forwarded port on them go direct (the proxy would refuse them:
    they are the sandbox's own listeners, not hosts of the allowlist), after
    whatever the environment already lists there."""
    given = [e.strip() for v in NO_PROXY_VARS for e in env.get(v, "").split(",") if e.strip()]
    ours = [*LOOPBACK_NAMES, *(f"{h}:{p}" for p in sorted(ports) for h in ("127.0.0.1", "localhost"))]
    value = ",".join(dict.fromkeys([*given, *ours]))
    return {name: value for name in NO_PROXY_VARS}


def env_ports(env: Mapping[str, str]) -> list[int]:
    """The ports of the 127.0.0.1 and localhost URLs in `env`'s values."""
    ports = []
    for value in env.values():
        for m in LOOPBACK_URL.finditer(value):
            port = int(m.group(2)) if m.group(2) else DEFAULT_PORTS.get(m.group(1).lower())
            if port is not None and 1 <= port <= 65535:
                ports.append(port)
    return sorted(set(ports))


def compile_task(sb: Sandbox, facts: Facts, environ: Mapping[str, str], proxy_port: int | None = None,
                 pinned: Mapping[str, str] | None = None, broker_socket: str | None = None) -> Compiled:
    """The Spec of `sb` on the host of `facts`; `proxy_port` is where the allowlist proxy listens.
    `pinned` maps a bind's host source to `/proc/self/fd/N`, an fd of the spawning process that
    holds what was checked (the broker's): the bind is made of that, never of the path again.
    `broker_socket`, the host path of the broker's socket, is bound read-only at BROKER_INSIDE
    (in the fresh root, before every grant: a grant over it hides it, nothing is made in a grant)."""
    pin = pinned or {}
    tr = Translator.of(sb)
    binds = shown_binds(sb, facts)
    mounts: list[S.Mount] = [*facts.system]
    mounts += [S.RoBind(p, optional=True) for p in facts.etc]
    mounts += [S.Proc(), S.Dev(), S.Tmpfs("/tmp", perms=0o1777)]
    if broker_socket is not None:
        mounts.append(S.RoBind(broker_socket, BROKER_INSIDE))
    mounts += [S.Bind(pin.get(b.source, b.source), b.target) if b.writable
               else S.RoBind(pin.get(b.source, b.source), b.target) for b in binds]
    emptied = [d for d in facts.python.other_site_dirs if names_of(d, binds, facts.realpaths)]
    for d in emptied:
        mounts += _empty(d)
    hidden: list[str] = []
    covers = [p for _, p in facts.hidden]
    if sb.framework_package and not sb.framework:
        covers += list(facts.framework_paths)
    for path in dict.fromkeys(covers):
        # A link is covered where it leads (nothing is mounted on a link:
        # the link itself then leads to the cover).
        path = facts.realpaths.get(path, path) if os.path.islink(path) else path
        names = names_of(path, binds, facts.realpaths)
        is_dir = os.path.isdir(path)
        mounts += cover_mounts(path, is_dir, names, facts.empty_file)
        hidden += names
        if not is_dir:
            cache = [os.path.join(os.path.dirname(n), "__pycache__") for n in names]
            cache = [c for c in cache if c not in hidden and os.path.isdir(_host_of(c, path, names))]
            for c in cache:
                mounts += _empty(c)
            hidden += cache
    # The root, and the directories made in it for the mounts, read-only too.
    mounts.append(S.RemountRo("/"))
    env = build_env(sb, facts, environ, tr, binds, proxy_port)
    forward: dict[int, int | str] = {}
    if sb.network == "isolated":
        forward.update({p: p for p in env_ports(env)})
        forward.update({p: p for p in sb.ports})
        forward.update(dict(sb.sockets))
        if proxy_port is not None:
            forward[proxy_port] = proxy_port
    if proxy_port is not None:
        env.update(no_proxy(env, [p for p in forward if p != proxy_port]))
    spec = S.Spec(
        mounts=tuple(mounts), network="none" if sb.network == "isolated" else "host", env=env,
        cwd=tr.path(sb.chdir) if sb.chdir else None,
        limits=S.Limits(memory_mb=sb.limits.memory_mb, file_mb=sb.limits.file_mb, cpu_s=sb.limits.cpu_s),
        probe_paths=sb.probes, forward=tuple(sorted(forward.items())), check_network=sb.network == "isolated",
    )
    return Compiled(spec=spec, translator=tr, binds=tuple(binds), hidden=tuple(dict.fromkeys(hidden)),
                    emptied=tuple(emptied), env_names=tuple(sorted(env)), forward=spec.forward)


def _host_of(cache_inside: str, host_file: str, names: list[str]) -> str:
    """The host directory a covered `__pycache__` name stands for (beside the module file)."""
    del cache_inside, names
    return os.path.join(os.path.dirname(host_file), "__pycache__")
