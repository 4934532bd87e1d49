"""A data file over an earlier one at the same path (`--file`, `--bind-data`, `--ro-bind-data`), as bwrap 0.8.0 does it.

Flatpak sends `--file FD /.flatpak-info` then `--ro-bind-data FD2
/.flatpak-info` on every app start: bwrap binds the second over the first.
Each pair of the three options is run by the real bwrap and by ours (both
backends); where bwrap succeeds ours must too, with the later file's
content and the same writability. Ours refuses before anything runs where
the earlier file is read-only (bwrap fails there too).

Known differences, where the Spec cannot tell `--file` from `--bind-data`
(both are a writable `File`, and ours writes the file rather than binding a
copy): a `--bind-data` over a `--file` keeps the earlier file's mode
(bwrap's bound copy has the later's), and a file over a `--bind-data` is
written in place as over a `--file`, where bwrap fails for a later
`--bind-data` or `--ro-bind-data` (its bound copy is unlinked).
"""

from __future__ import annotations

import os

import pytest
from test_bwrap_dropin import backend, ours, real  # noqa: F401

pytestmark = pytest.mark.integration

KINDS = ("--file", "--bind-data", "--ro-bind-data")
WORLD = ["--ro-bind", "/", "/", "--tmpfs", "/tmp"]
SHOW = "cat /tmp/f; echo; if echo x >> /tmp/f; then echo writable; else echo read-only; fi"
BWRAP_FAILS = {("--bind-data", "--bind-data"), ("--bind-data", "--ro-bind-data")}  # ours: written in place


def _run(runner, earlier: str, later: str, *prefix: str) -> tuple[int, str, str]:
    fds = []
    try:
        for data in (b"first", b"second"):
            r, w = os.pipe()
            os.write(w, data)
            os.close(w)
            fds.append(r)
        args = [*prefix, *WORLD, earlier, str(fds[0]), "/tmp/f", later, str(fds[1]), "/tmp/f", "sh", "-c", SHOW]
        result = runner(*args, pass_fds=fds)
        return result.returncode, result.stdout, result.stderr
    finally:
        for fd in fds:
            os.close(fd)


@pytest.mark.parametrize("later", KINDS)
@pytest.mark.parametrize("earlier", KINDS)
def test_a_file_over_an_earlier_one_as_bwrap(backend: str, earlier: str, later: str) -> None:  # noqa: F811
    theirs = _run(real, earlier, later)
    mine = _run(lambda *a, **kw: ours(backend, *a, **kw), earlier, later)
    if earlier == "--ro-bind-data":  # refused before anything runs; bwrap fails as it mounts
        assert theirs[0] != 0 and mine[0] != 0, (theirs, mine)
        assert "conflicts with mounts[" in mine[2], mine
    elif (earlier, later) in BWRAP_FAILS:
        assert theirs[0] != 0 and mine[:2] == (0, f"second\n{'read-only' if 'ro' in later else 'writable'}\n")
    else:
        assert theirs[0] == 0, theirs
        assert mine[:2] == theirs[:2], (theirs, mine)
