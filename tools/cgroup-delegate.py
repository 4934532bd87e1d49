#!/usr/bin/env python3
"""Give a user a delegated cgroup subtree, as systemd's Delegate=yes would, and take it back.

    cgroup-delegate.py create USER NAME   (as root) prints two lines:
        the value for $SANDBOX_CGROUP_PARENT (one directory per hierarchy, ':'-separated)
        the v2 directory the user's process must be moved into first ("" if no v2 hierarchy)
    cgroup-delegate.py remove DIR[:DIR...]  kills what is left inside and removes the subtrees

In each mounted hierarchy that has the memory, pids or cpu controller (v1),
and in the v2 one, a directory NAME is made beneath root's own cgroup there
(so the user's sandboxes stay inside whatever bounds root's caller has), and
it and its files are given to USER. On v2, a process may only be moved
between cgroups below one it may write, so the user's process itself must
live inside: NAME/runner is made for it, and the controllers it offers are
enabled for NAME's children. Standard library only (run-tests.sh runs it
before the package is importable by the user).
"""

from __future__ import annotations

import os
import pwd
import signal
import sys
import time

WANTED = {"memory", "pids", "cpu", "cpuacct"}  # cpuacct: a sandbox's CPU time where cpu lacks it


def hierarchies() -> list[tuple[int, str, str, set[str]]]:
    """(version, mount point, mount root, controllers) of each cgroup mount worth delegating."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            parts, rparts = left.split(), right.split()
            if len(rparts) < 3 or rparts[0] not in ("cgroup", "cgroup2"):
                continue
            ctrls = set(rparts[2].split(",")) & WANTED if rparts[0] == "cgroup" else set()
            if rparts[0] == "cgroup2" or ctrls:
                out.append((2 if rparts[0] == "cgroup2" else 1, parts[4], parts[3], ctrls))
    return out


def own_path(version: int, ctrls: set[str]) -> str:
    with open("/proc/self/cgroup") as f:
        for line in f:
            _id, names, path = line.rstrip("\n").split(":", 2)
            if version == 2 and names == "":
                return path
            if version == 1 and set(names.split(",")) & ctrls:
                return path
    return "/"


def give(path: str, uid: int, gid: int) -> None:
    os.chown(path, uid, gid)
    for name in os.listdir(path):
        if name.startswith("cgroup.") or name == "tasks":
            try:
                os.chown(os.path.join(path, name), uid, gid)
            except OSError:
                pass


def create(user: str, name: str) -> None:
    pw = pwd.getpwnam(user)
    dirs, runner = [], ""
    for version, point, root, ctrls in hierarchies():
        own = own_path(version, ctrls)
        rel = os.path.relpath(own, root) if own.startswith(root) else "."
        top = os.path.normpath(os.path.join(point, rel, name))
        os.mkdir(top)
        give(top, pw.pw_uid, pw.pw_gid)
        dirs.append(top)
        if version == 2:
            runner = os.path.join(top, "runner")
            os.mkdir(runner)
            give(runner, pw.pw_uid, pw.pw_gid)
            offered = open(os.path.join(top, "cgroup.controllers")).read().split()
            wanted = [c for c in offered if c in WANTED]
            if wanted:
                with open(os.path.join(top, "cgroup.subtree_control"), "w") as f:
                    f.write(" ".join("+" + c for c in wanted))
    print(":".join(dirs))
    print(runner)


def remove(spec: str) -> None:
    for top in [d for d in spec.split(":") if d]:
        for _ in range(50):
            if not os.path.isdir(top):
                break
            for path, _subdirs, _files in os.walk(top, topdown=False):
                kill = os.path.join(path, "cgroup.kill")
                if os.path.exists(kill):
                    try:
                        with open(kill, "w") as f:
                            f.write("1")
                    except OSError:
                        pass
                else:
                    for pid in open(os.path.join(path, "cgroup.procs")).read().split():
                        try:
                            os.kill(int(pid), signal.SIGKILL)
                        except OSError:
                            pass
                try:
                    os.rmdir(path)
                except OSError:
                    pass
            if os.path.isdir(top):
                time.sleep(0.1)
        if os.path.isdir(top):
            print(f"cgroup-delegate: could not remove {top}", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "create":
        create(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "remove":
        remove(sys.argv[2])
    else:
        sys.exit(__doc__)
