"""Running consecutive tenants of a recycled Template (Template(spec, recycle=True)).

Which sandbox served a request is its mount namespace: a recycled sandbox
keeps it from one request to the next, a fresh one has its own. Each script
run here prints it first (`WHERE`), then its findings. A request served
by a sandbox whose namespace served an earlier one is a recycled tenant;
requests need not alternate between its standbys, so a planted run is
repeated until each has served it.
"""

from __future__ import annotations

import time

from conftest import child_pids

import sandbox

from .attack import PYTHON

# The first thing each script prints: which sandbox it ran in.
WHERE = 'os.readlink("/proc/self/ns/mnt")'

# Whether /proc/<p> is the sandbox's command maker (csrc/template/template_maker.c: where a recycled sandbox's
# commands are made by one, a child of pid 1 and a copy of the template process, as pid 1 is), for the
# scripts that list the processes left. What the attacks plant runs python3.
IS_MAKER = ('(lambda p: (lambda stat: stat.startswith(f"{p} (sandbox-templat) ")'
            ' and stat.split(") ")[1].split()[1] == "1")(open(f"/proc/{p}/stat").read()))')


class Tenants:
    """The requests of one recycled Template, and the sandboxes that served them."""

    def __init__(self, t: sandbox.Template) -> None:
        self.t = t
        self.served: set[str] = set()
        # its recycled standbys, made when it was: the template process's children while none serves
        self.standbys = len(child_pids(t.pid))
        assert self.standbys >= 2, self.standbys

    def run(self, script: str, *args: str) -> tuple[str, str, bool]:
        """Run `script` (Python, printing WHERE first); (where, what else it printed, whether that
        sandbox had served a request before)."""
        r = self.t.run([PYTHON, "-I", "-S", "-c", script, *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        where, _, rest = r.stdout.strip().partition(" ")
        before = where in self.served
        self.served.add(where)
        return where, rest, before

    def in_each(self, script: str, *args: str) -> list[str]:
        """Run `script` until each standby's sandbox has run it (at most 30 times); what each run printed."""
        places: set[str] = set()
        out = []
        for _ in range(30):
            where, rest, _ = self.run(script, *args)
            out.append(rest)
            places.add(where)
            if len(places) == self.standbys:
                break
        return out

    def recycled(self, script: str, *args: str) -> str:
        """What `script` printed in a sandbox that had served a request before (a recycled tenant)."""
        for _ in range(100):
            _, rest, before = self.run(script, *args)
            if before:
                return rest
            time.sleep(0.02)  # every standby was still being reset: the server made a fresh sandbox
        raise AssertionError("no request was served by a recycled sandbox")
