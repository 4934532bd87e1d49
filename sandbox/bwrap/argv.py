"""Writing bwrap command lines: the spelling both renderers share.

`unparse.to_bwrap_args` writes a Spec in this package's grammar, the bwrap
backend's `render_plan` writes a Plan for /usr/bin/bwrap (0.8.0). Each
option they emit is spelled here once (or is a plain `--name VALUE` of
`grammar.OPTIONS`).

File contents (`--file`, `--ro-bind-data`) and seccomp programs travel
through fds, as bwrap wants them: each gets its own memfd (anonymous memory,
never a file on disk), positioned at the start. A rendered argv keeps those
fds in `.fds`; whoever consumes the command line reads and closes them
(bwrap, or `from_bwrap_args`), and the renderer's owner closes its copies
with `.close()`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from ..errors import SpecError


class BwrapArgv(list[str]):
    """A rendered bwrap argument list (a list of str) that owns the data fds it names."""

    def __init__(self, args: Iterable[str] = (), fds: Iterable[int] = ()) -> None:
        super().__init__(args)
        self.fds: list[int] = list(fds)

    def close(self) -> None:
        """Close this process's copies of the data fds (idempotent)."""
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds.clear()

    def __enter__(self) -> BwrapArgv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def data_fd(data: bytes) -> int:
    """A close-on-exec memfd holding `data`, at offset 0 (pass it to a child explicitly)."""
    fd = os.memfd_create("sandbox-file", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


# ---------------------------------------------------------------- filesystem operations

def bind_args(src: str, dest: str, *, readonly: bool, devices: bool, optional: bool) -> list[str]:
    """`--bind`, `--ro-bind` or `--dev-bind` (with `-try` if optional). bwrap binds read-only
    binds nodev, so a read-only bind with devices cannot be said."""
    if readonly and devices:
        raise SpecError("mounts", dest, "bwrap cannot bind read-only with device access")
    name = "--ro-bind" if readonly else "--dev-bind" if devices else "--bind"
    return [name + ("-try" if optional else ""), src, dest]


def tmpfs_args(dest: str, mode: int, size: int | None) -> list[str]:
    """A tmpfs of `mode`, of `size` bytes if given (else the kernel's default)."""
    sized = ["--size", str(size)] if size else []
    return ["--perms", f"{mode:04o}", *sized, "--tmpfs", dest]


def dir_args(dest: str, mode: int) -> list[str]:
    """A directory of `mode` (bwrap leaves an existing one as it is)."""
    return ["--perms", f"{mode:04o}", "--dir", dest]


def file_args(dest: str, data: bytes, mode: int, readonly: bool, fds: list[int]) -> list[str]:
    """A file of `mode` holding `data`, read-only bound if `readonly`; the data goes into
    a new memfd appended to `fds`."""
    fd = data_fd(data)
    fds.append(fd)
    return ["--perms", f"{mode:04o}", "--ro-bind-data" if readonly else "--file", str(fd), dest]


def chmod_args(path: str, mode: int) -> list[str]:
    """Change the mode of an existing `path`."""
    return ["--chmod", f"{mode:04o}", path]


# ---------------------------------------------------------------- the rest of a sandbox

def unshare_args(*, user: bool, pid: bool, net: bool, ipc: bool, uts: bool, cgroup: bool) -> list[str]:
    """The namespaces to create (the mount namespace is always made by bwrap)."""
    wanted = (("--unshare-user", user), ("--unshare-pid", pid), ("--unshare-net", net),
              ("--unshare-ipc", ipc), ("--unshare-uts", uts), ("--unshare-cgroup", cgroup))
    return [option for option, on in wanted if on]


def env_args(env: Iterable[tuple[str, str]]) -> list[str]:
    """Exactly the environment `env`, whatever the caller's is."""
    out = ["--clearenv"]
    for name, value in env:
        out += ["--setenv", name, value]
    return out


def cap_args(caps: Iterable[str]) -> list[str]:
    """Exactly `caps` (bwrap's root default is "keep everything", ours is "nothing")."""
    out = ["--cap-drop", "ALL"]
    for cap in caps:
        out += ["--cap-add", cap]
    return out


def seccomp_args(program: bytes, fds: list[int]) -> list[str]:
    """Install the BPF `program`, given in a new memfd appended to `fds`."""
    fds.append(data_fd(program))
    return ["--seccomp", str(fds[-1])]
