"""Attack: a nested task sandbox uncovers its parent's framework package (issue 36, breach 4).

A task sandbox covers the framework's own package (`framework_package`,
unless `framework=True`). `narrowed()` let a nested description's
`framework_package` replace the parent's: naming any other installed package
covered that one instead, and the parent's package (pytest's files here)
was readable again in the nested sandbox.

Now a nested description may name only its parent's framework package (or
none: it inherits the parent's), and anything else is refused by name.
"""

from __future__ import annotations

import os

import pluggy
import pytest

import sandbox
from sandbox.task import Sandbox

from .broker_helpers import pyrun, task_backend  # noqa: F401  (task_backend: the fixture `backend`)

pytestmark = pytest.mark.integration

ASK = """
from sandbox import task
for fw in ({other!r}, "pytest", None):
    try:
        r = task.run(["cat", {target!r}], task.Sandbox(framework_package=fw), capture_output=True, text=True)
        print(fw, "->", "READ" if r.returncode == 0 else "covered")
    except Exception as e:
        print(fw, "->", type(e).__name__, getattr(e, "field", None))
try:
    task.run(["true"], task.Sandbox(framework_package={other!r}, framework=True))
except Exception as e:
    print("shown", "->", type(e).__name__, getattr(e, "field", None))
"""


def test_a_nested_sandbox_cannot_name_another_framework_package(backend: str) -> None:
    target = os.path.realpath(pytest.__file__)  # pytest/__init__.py, as installed
    other = pluggy.__name__  # another installed package (one of pytest's own)
    r = pyrun(ASK.format(other=other, target=target), Sandbox(framework_package="pytest"), backend, timeout=120)
    assert r.stdout.strip().split("\n") == [
        f"{other} -> SpecError framework_package", "pytest -> covered", "None -> covered",
        "shown -> SpecError framework_package"], r.stdout + r.stderr


def test_the_parent_covers_it_too() -> None:
    # What the nested sandbox would uncover is covered one level up: the test above attacks a real cover.
    r = sandbox.task.run(["cat", os.path.realpath(pytest.__file__)], Sandbox(framework_package="pytest"),
                         capture_output=True)
    assert r.returncode != 0 and not r.stdout
