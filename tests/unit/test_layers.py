"""HACKING.md's layer table, enforced: no upward import, no import cycle in sandbox/, no cycle of C files in csrc/.

The table ("## Where code goes") is the single source: each row is a layer, the rows go up the stack, and a module
may import only modules of its own row or of the rows above it. The imports are read with `ast`
(tools/import_graph.py), module-level and function-level alike (only `if TYPE_CHECKING:` imports are left out: they
never run), so an import hidden in a function counts. A module no row names fails, so the table stays complete.
And an import of the package's own modules inside a function says why it is not at the top (`# lazy: ...`).

It reads the checkout (sandbox/, HACKING.md, csrc/ and tools/), not the installed package: where the tests run
from a staged copy without them (run-tests.sh's unprivileged run), it skips. Which user runs it changes nothing.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

CHECKOUT = Path(__file__).resolve().parents[2]
TOOL = CHECKOUT / "tools" / "import_graph.py"

if not (TOOL.exists() and (CHECKOUT / "HACKING.md").exists() and (CHECKOUT / "sandbox").is_dir()):
    pytest.skip("no checkout here (tools/, HACKING.md, sandbox/): a staged copy of the tests", allow_module_level=True)


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_graph", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("import_graph", module)  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


G = _tool()
TABLE = G.layer_table(CHECKOUT / "HACKING.md")
MODULES = G.modules(CHECKOUT / "sandbox")
EDGES = G.graph(CHECKOUT / "sandbox")
RUNNING = [e for e in EDGES if e.kind != "typing"]


def _where(e: Any) -> str:
    return f"{e.source}:{e.line} imports {e.target} ({e.kind}-level)"


def test_the_table_is_read() -> None:
    names = [name for name, _ in TABLE]
    assert names[:2] == ["foundation", "description"] and "faces" in names, names
    assert all(paths for name, paths in TABLE if name != "C core"), TABLE


def test_every_module_has_a_layer() -> None:
    _, missing = G.layers(MODULES, TABLE)
    assert not missing, f"modules HACKING.md's layer table does not name (add each to its row): {missing}"


def test_no_module_imports_a_higher_layer() -> None:
    layer, _ = G.layers(MODULES, TABLE)
    up = [f"{_where(e)}: {TABLE[layer[e.source]][0]} -> {TABLE[layer[e.target]][0]}"
          for e in G.upward(RUNNING, layer)]
    assert not up, "imports of a higher layer (move the code to the layer it belongs to):\n" + "\n".join(up)


def test_no_import_cycle() -> None:
    found = G.cycles(RUNNING)
    detail = [_where(e) for cycle in found for e in RUNNING if e.source in cycle and e.target in cycle]
    assert not found, f"import cycles: {found}\n" + "\n".join(detail)


def test_no_cycle_of_c_files() -> None:
    edges = G.c_graph(CHECKOUT / "csrc")
    assert any(e.kind == "call" and e.source == "child.c" for e in edges), "the C reader found no calls"
    found = G.cycles(edges)
    detail = [f"{e.source}:{e.line} -> {e.target} ({e.kind})" for cycle in found for e in edges
              if e.source in cycle and e.target in cycle]
    assert not found, f"cycles of C files (by #include or by call): {found}\n" + "\n".join(detail)


def test_the_reader_sees_what_a_module_hides() -> None:
    """A function-level import, a relative one, `from package import module`, and a TYPE_CHECKING one, each as
    Python would resolve it: the classes the layer and cycle checks rely on."""
    by = {(e.source, e.target): e.kind for e in EDGES}
    assert by[("sandbox.presets", "sandbox.probe")] == "function"  # inside overlay_works
    assert by[("sandbox.api", "sandbox.stdio")] == "module"
    assert by[("sandbox.probe", "sandbox.backends.bwrap")] == "module"  # `from .backends import bwrap as ...`
    assert by[("sandbox.presets", "sandbox.images")] == "function"
    assert "typing" in by.values()


def test_the_core_of_csrc_uses_no_program() -> None:
    """csrc/core/ (the library every program links) includes no header of a program's folder and calls none of
    their functions: the programs are built on the core, never the other way."""
    folder = {path.name: path.parent.name for path in (CHECKOUT / "csrc").glob("*/*.[ch]")}
    edges = G.c_graph(CHECKOUT / "csrc")
    up = [f"{e.source}:{e.line} -> {e.target} ({e.kind})" for e in edges
          if folder[e.source] == "core" and folder[e.target] != "core"]
    assert folder and not up, "csrc/core/ reaches into a program's folder:\n" + "\n".join(up)


def test_every_function_level_import_says_why() -> None:
    """An import inside a function hides an edge from a reader of the module's head, so it is kept only where the
    top would cost a cold start something measured, or would not do (a module importable without the C core, a
    value read when called), and it says which: `# lazy: why` on its line or right above it, or the module's one
    `# lazy imports: why` note (tools/import_graph.py, `lazy_imports`)."""
    found = G.lazy_imports(CHECKOUT / "sandbox")
    assert len(found) > 40, "the reader finds the function-level imports"
    silent = [f"{item.module}:{item.line}: {item.text}" for item in found if item.reason is None]
    assert not silent, ("function-level imports that do not say why (move each to the top, or add `# lazy: ...`"
                        " naming the cold-start gain measured or what the top would break):\n" + "\n".join(silent))


def test_the_lazy_import_reader_finds_a_missing_reason(tmp_path: Path) -> None:
    """The reader of the reasons, on a package of its own: a reason on the line, above a group of imports, and as
    the module's note count; an import whose comment says nothing of why, or is stripped, does not."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text(
        "import os\n\n\ndef f() -> None:\n"
        "    from . import b  # lazy: b is heavy\n"
        "    # lazy: c and d only here\n"
        "    from . import c\n    from .d import e\n\n"
        "    from . import b as again  # a comment, but no reason\n"
        "    import os.path\n\n\n"
        "def g() -> None:\n"
        "    from .b import x\n")
    (package / "n.py").write_text("# lazy imports: each call loads its own\n\n\ndef f() -> None:\n"
                                  "    from . import b\n")
    found = {(item.module, item.line): item.reason for item in G.lazy_imports(package)}
    assert found == {("pkg.a", 5): "b is heavy", ("pkg.a", 7): "c and d only here",
                     ("pkg.a", 8): "c and d only here", ("pkg.a", 10): None, ("pkg.a", 15): None,
                     ("pkg.n", 5): "each call loads its own"}, found
