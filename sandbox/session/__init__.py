"""sandbox.Session: a sandbox that lives, with commands, files and asyncio.

    with sandbox.Session(sandbox.presets.minimal_system()) as s:
        s.start(["python3", "-m", "http.server", "8000"], stdout=sandbox.DEVNULL, stderr=sandbox.DEVNULL)
        s.exec(["curl", "-s", "http://127.0.0.1:8000/"])
        s.write_file("/tmp/notes", b"kept")

The files: session.py (the Session), launch.py (its sandbox: the Spec's
plan, spawned natively with sandbox-session as pid 1), wire.py (the
messages, csrc/sandbox.h), call.py (one command's handle), files.py
(read_file/write_file in the session's root), aio.py (asyncio), cow.py
(the copy-on-write root: the Spec's read-only mounts as overlays), with
cow_host.py (the host facts it reads) and cow_upper.py (a kept upper
directory, checked).
"""

from __future__ import annotations

from .aio import AsyncProcess
from .session import Session

__all__ = ["AsyncProcess", "Session"]
