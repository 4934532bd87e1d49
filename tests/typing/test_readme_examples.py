"""The README's Python examples type-check for a user of the installed package.

readme_examples.py holds every ```python block of README.md, each as the body
of a readme_example_N function, in order, and every block of docs/*.md (but the
one that shows a framework's own code before it adopts sandbox.task), each as
the body of a docs_<page>_example_N function: the first tests keep them in step,
the second runs mypy --strict on that file against the installed package
(py.typed), as a user's type checker would see it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

import sandbox

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE / "readme_examples.py"
ATTRIBUTES = HERE / "documented_attributes.py"  # the attributes the docs name on results and errors
README = HERE.parents[1] / "README.md"
DOCS = HERE.parents[1] / "docs"
# blocks left out (of docs/*.md), by their first line, and why
NOT_CHECKED = {
    "import os, subprocess, sys": "a framework's own bwrap rendering, before sandbox.task: no API of this package",
}


def readme_blocks(text: str) -> list[str]:
    """The ```python blocks of a Markdown text, in order."""
    return [m.group(1).rstrip("\n") for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M)]


def example_bodies(text: str, prefix: str = "readme") -> list[str]:
    """The bodies of the <prefix>_example_* functions of `text`, dedented, in order."""
    bodies = []
    for m in re.finditer(rf"^def {prefix}_example_\d+\(\) -> None:\n((?:[ \t]*\n|    .*\n)*)", text, re.M):
        bodies.append(textwrap.dedent(m.group(1)).strip("\n"))
    return bodies


def test_examples_are_the_readme_blocks() -> None:
    if not README.is_file():
        pytest.skip(f"{README} is not beside the tests (a copy of tests/ alone)")
    blocks = readme_blocks(README.read_text())
    bodies = example_bodies(EXAMPLES.read_text())
    for i, (block, body) in enumerate(zip(blocks, bodies, strict=False), 1):
        assert body == block, f"readme_example_{i} differs from the README's block:\n{block}"
    assert len(bodies) == len(blocks), (f"README.md has {len(blocks)} python blocks, "
                                        f"{EXAMPLES.name} {len(bodies)} readme_example_* functions")


def test_examples_are_the_docs_blocks() -> None:
    if not DOCS.is_dir():
        pytest.skip(f"{DOCS} is not beside the tests (a copy of tests/ alone)")
    examples = EXAMPLES.read_text()
    left_out = 0
    for page in sorted(DOCS.glob("*.md")):
        blocks = readme_blocks(page.read_text())
        kept = [b for b in blocks if b.split("\n", 1)[0] not in NOT_CHECKED]
        left_out += len(blocks) - len(kept)
        prefix = "docs_" + page.stem.replace("-", "_")
        bodies = example_bodies(examples, prefix)
        for i, (block, body) in enumerate(zip(kept, bodies, strict=False), 1):
            assert body == block, f"{prefix}_example_{i} differs from {page.name}'s block:\n{block}"
        assert len(bodies) == len(kept), (f"docs/{page.name} has {len(kept)} checked python blocks, "
                                          f"{EXAMPLES.name} {len(bodies)} {prefix}_example_* functions")
    assert left_out == len(NOT_CHECKED), "a block NOT_CHECKED names is gone from docs/"


def _site_dirs() -> set[Path]:
    paths = sysconfig.get_paths()
    return {Path(paths[k]).resolve() for k in ("purelib", "platlib")}


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None,
                    reason="mypy is not installed (it is in the test extra: pip install '.[test]')")
def test_readme_examples_pass_mypy_strict(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "MYPYPATH"}
    where = Path(sandbox.__file__).resolve().parents[1]
    if where not in _site_dirs():  # an in-place build (pip install -e .): mypy finds it through MYPYPATH
        env["MYPYPATH"] = str(where)
    # As a user's checker sees the package: its own findings are not the user's (follow_imports = silent, as
    # for anything installed); ray is an extra: without it, RayPool's example is checked against sandbox.ray's
    # own types only; so is inspect-ai (the inspect extra) for docs/inspect.md's task.
    (tmp_path / "mypy.ini").write_text("[mypy]\nstrict = True\nfollow_imports = silent\n\n"
                                       "[mypy-ray,ray.*,inspect_ai,inspect_ai.*]\nignore_missing_imports = True\n")
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(tmp_path / "mypy.ini"), "--cache-dir",
         str(tmp_path / "cache"), "--no-error-summary", str(EXAMPLES), str(ATTRIBUTES)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, f"mypy --strict {EXAMPLES.name} {ATTRIBUTES.name}:\n{result.stdout}{result.stderr}"
