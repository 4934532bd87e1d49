"""sandbox.Session: a sandbox that lives, with commands, files and asyncio.

    with sandbox.Session(sandbox.presets.minimal_system()) as s:
        s.start(["python3", "-m", "http.server", "8000"], stdout=sandbox.DEVNULL, stderr=sandbox.DEVNULL)
        s.exec(["curl", "-s", "http://127.0.0.1:8000/"])
        s.write_file("/tmp/notes", b"kept")

The files: session.py (the Session), launch.py (its sandbox: the Spec's
plan, spawned natively with sandbox-session as pid 1), wire.py (the
messages, csrc/core/sandbox.h), call.py (one command's handle), files.py
(read_file/write_file in the session's root), aio.py (asyncio), cow.py
(the copy-on-write root: the Spec's read-only mounts as overlays), with
cow_host.py (the host facts it reads) and cow_upper.py (a kept upper
directory, checked); the command line: climain.py (`sandbox session
...`, `sandbox exec`), holder.py (the process that keeps a session across
command lines), clisock.py (their socket). The names are imported on
first use, so the command line pays only for what it runs.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (type checkers read the name)
if TYPE_CHECKING:
    from ..aio import AsyncProcess
    from .session import Session

__all__ = ["AsyncProcess", "Session"]

# lazy imports: PEP 562, so that `sandbox session`/`exec` (climain, clisock) load neither Session (67 ms) nor
# asyncio with AsyncProcess (118 ms): each import timed alone after this package, median of 7


def __getattr__(name: str) -> object:
    if name == "Session":
        from .session import Session

        return Session
    if name == "AsyncProcess":
        from ..aio import AsyncProcess

        return AsyncProcess
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
