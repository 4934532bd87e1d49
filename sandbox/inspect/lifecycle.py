"""The Sessions alive in this process, by task: what task_cleanup and sample_cleanup close.

A Session ends with its caller (its pid 1 sees its control socket close
when this process dies, however it dies), so an interrupted eval leaves no
process, mount or namespace behind even when no cleanup runs; these books
let an eval that goes on (Ctrl-C caught, a task's end) close what a failed
sample_init or a skipped sample_cleanup left open.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from ..session import Session

_lock = threading.Lock()
_open: dict[str, set[Session]] = {}


def opened(task_name: str, session: Session) -> None:
    """Book `session` under its task."""
    with _lock:
        _open.setdefault(task_name, set()).add(session)


def close(task_name: str, sessions: Iterable[Session]) -> list[BaseException]:
    """Close `sessions` (each, whatever the others do) and strike them off; the errors met."""
    errors: list[BaseException] = []
    for session in list(sessions):
        try:
            session.close()
        except Exception as exc:  # every session gets its close; the first error is raised by the caller
            errors.append(exc)
        with _lock:
            _open.get(task_name, set()).discard(session)
    return errors


def close_task(task_name: str | None) -> list[BaseException]:
    """Close every session of `task_name` still open (of every task with None)."""
    with _lock:
        names = list(_open) if task_name is None else [task_name]
        work = [(name, list(_open.pop(name, set()))) for name in names]
    return [err for name, sessions in work for err in close(name, sessions)]


def open_count() -> int:
    """How many sessions are booked (for tests and benchmarks)."""
    with _lock:
        return sum(len(s) for s in _open.values())
