#!/usr/bin/env python3
"""The import graph of `sandbox/` (read with `ast`, never by importing) and the include and call graph of `csrc/`.

Every `import` and `from ... import` statement of every module is an edge, relative imports resolved, classed as:
- "module": runs when the module is imported (module level, a class body, a module-level `try`);
- "function": inside a function, so it runs when the function is first called;
- "typing": under `if TYPE_CHECKING:`; it never runs, only mypy follows it.
`from package import name` is an edge to `package.name` when that is a module, else to `package` itself.
A module's enclosing packages are not edges, named or not: importing `sandbox.plan` runs `sandbox/__init__.py`
first, Python's doing, not `plan`'s (import-linter counts the same way), and `from . import _native` in `sandbox.x`
finds the package already there. Dynamic imports (`importlib.import_module` with a computed name, a lazy
package's `__getattr__` table) are not followed.

In C (`c_graph`), `#include "b.h"` is an edge to b.h, and a call of a function that `b.c` defines is an edge to
b.c (the cycles the review of issue 40 found were calls: child.c <-> idmap.c), read with regular expressions over
csrc/'s one style (a definition's head at column 0, its brace on the next line).

Used by tests/unit/test_layers.py, with HACKING.md's layer table (`layer_table`), and for the reasons the
function-level imports give (`lazy_imports`). Run it to see the cycles, the modules the table misses, the upward
imports and the function-level imports that give no reason (with --edges, every edge):
    python3 tools/import_graph.py [--edges]
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("module", "function", "typing")  # Python's; C's are "include" and "call"


@dataclass(frozen=True)
class Edge:
    """One import: `source` imports `target` at `line`, of `kind` module, function or typing (in C: include or
    call)."""

    source: str
    target: str
    line: int
    kind: str


def modules(package: Path) -> dict[str, Path]:
    """Every module under the package directory `package`, by dotted name (a package by its `__init__.py`)."""
    found: dict[str, Path] = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _walk(nodes: Iterable[ast.stmt], kind: str) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement below `nodes`, with the kind its place gives it."""
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, kind
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from _walk(node.body, "typing" if kind == "typing" else "function")
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _walk(node.body, "typing")
            yield from _walk(node.orelse, kind)
        else:
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                children = getattr(node, field, None)
                if isinstance(children, list):
                    for child in children:
                        if isinstance(child, (ast.ExceptHandler, ast.match_case)):
                            yield from _walk(child.body, kind)
                    yield from _walk([c for c in children if isinstance(c, ast.stmt)], kind)


def _base(name: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a `from` statement names (relative levels resolved against `name`)."""
    if node.level == 0:
        return node.module or ""
    parts = name.split(".")
    anchor = parts if is_package else parts[:-1]
    anchor = anchor[:len(anchor) - (node.level - 1)]
    return ".".join(anchor + ([node.module] if node.module else []))


def _resolve(dotted: str, known: Mapping[str, Path]) -> str | None:
    """The longest prefix of `dotted` that is one of the `known` modules, or None (outside the package)."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in known:
            return candidate
    return None


def imports(name: str, path: Path, known: Mapping[str, Path]) -> list[Edge]:
    """The edges from module `name` (source at `path`) to the other `known` modules."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    edges: list[Edge] = []
    for node, kind in _walk(tree.body, "module"):
        if isinstance(node, ast.Import):
            targets = [_resolve(alias.name, known) for alias in node.names]
        else:
            base = _base(name, is_package, node)
            targets = [_resolve(f"{base}.{alias.name}", known) for alias in node.names]
        for target in targets:
            if target is not None and target != name and not name.startswith(target + "."):
                edges.append(Edge(name, target, node.lineno, kind))
    return list(dict.fromkeys(edges))


def graph(package: Path = ROOT / "sandbox") -> list[Edge]:
    """Every edge between the modules of `package`."""
    known = modules(package)
    return [edge for name, path in known.items() for edge in imports(name, path, known)]


# A function-level import says why it is not at the top (HACKING.md: only where a cold start measures the gain, or
# where the top would not do: a cycle, a module importable without the C core): a comment holding `lazy:` on one of
# its lines or in the comment lines right above it (above the first of adjacent import lines, for all of them); or,
# for every such import of a module, one note at column 0 of its top level, `# lazy imports: why`.
LAZY_REASON = re.compile(r"#.*\blazy: *(\S.*)")
LAZY_NOTE = re.compile(r"^# lazy imports: *(\S.*)", re.MULTILINE)


@dataclass(frozen=True)
class Lazy:
    """A function-level import in `module` (at `line`) of the package itself: `text`, and the `reason` written for
    it (None if none is)."""

    module: str
    line: int
    text: str
    reason: str | None


def _own(node: ast.Import | ast.ImportFrom, package: str) -> bool:
    """Whether `node` imports from `package` (relatively, or by its name): the compiled core and the package's own
    names (`from . import __version__`) included, which no edge of `graph` shows."""
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or (node.module or "").split(".")[0] == package
    return any(alias.name.split(".")[0] == package for alias in node.names)


def _reason(lines: list[str], first: int, last: int, import_lines: set[int]) -> str | None:
    """The `lazy:` reason on lines `first`..`last` (1-based) or in the comments above them, skipping up over
    adjacent import lines (a group of imports shares the comment above it)."""
    for number in range(first, last + 1):
        found = LAZY_REASON.search(lines[number - 1])
        if found:
            return found.group(1)
    number = first - 1
    while number in import_lines:
        number -= 1
    while number >= 1 and lines[number - 1].lstrip().startswith("#"):
        found = LAZY_REASON.search(lines[number - 1])
        if found:
            return found.group(1)
        number -= 1
    return None


def lazy_imports(package: Path = ROOT / "sandbox") -> list[Lazy]:
    """Every function-level import of the package's own modules in the modules of `package`, with its reason."""
    found: list[Lazy] = []
    for name, path in modules(package).items():
        text = path.read_text()
        lines = text.splitlines()
        tree = ast.parse(text, str(path))
        note = LAZY_NOTE.search(text)
        nodes = list(_walk(tree.body, "module"))
        import_lines = {n for node, _ in nodes for n in range(node.lineno, (node.end_lineno or node.lineno) + 1)}
        for node, kind in nodes:
            if kind != "function" or not _own(node, package.name):
                continue
            reason = _reason(lines, node.lineno, node.end_lineno or node.lineno, import_lines)
            found.append(Lazy(name, node.lineno, ast.unparse(node), reason or (note.group(1) if note else None)))
    return found


INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)
# comments and string/char literals (blanked before C is read for names), and GNU attributes (they hold parentheses)
C_NOISE = re.compile(r"/\*.*?\*/|//[^\n]*|\"(?:\\.|[^\"\\])*\"|'(?:\\.|[^'\\])*'", re.DOTALL)
C_ATTRIBUTE = re.compile(r"__attribute__\s*\(\((?:[^()]|\([^()]*\))*\)\)")
# a function definition in csrc/'s style (.clang-format): its head at column 0, its brace alone on the next line
C_DEFINITION = re.compile(r"^(?![#\s{}/])([^;{}()\n]*?)\b(\w+)\s*\([^;{}]*\)\s*\n\{", re.MULTILINE)
C_CALL = re.compile(r"\b(\w+)\s*\(")


def _c_text(path: Path) -> str:
    return C_ATTRIBUTE.sub(" ", C_NOISE.sub(" ", path.read_text()))


def c_graph(csrc: Path = ROOT / "csrc") -> list[Edge]:
    """The edges between the C files of `csrc` (in its program folders, csrc/*/), by file name: `#include "b.h"` in
    a.c or a.h makes an edge to b.h (kind "include"); a.c calling a function that b.c defines (not static) makes
    `a.c -> b.c` (kind "call", the first call's line). A function defined by more than one file (each program's
    `main`) makes no edge."""
    edges: list[Edge] = []
    files = sorted([*csrc.glob("*/*.c"), *csrc.glob("*/*.h")])
    names = {path.name for path in files}
    for path in files:
        text = path.read_text()
        for match in INCLUDE.finditer(text):
            if match.group(1) in names:
                edges.append(Edge(path.name, match.group(1), text.count("\n", 0, match.start()) + 1, "include"))
    texts = {path.name: _c_text(path) for path in files if path.suffix == ".c"}
    defined: dict[str, set[str]] = {stem: set() for stem in texts}
    definers: dict[str, list[str]] = {}
    for stem, text in texts.items():
        for match in C_DEFINITION.finditer(text):
            defined[stem].add(match.group(2))
            if "static" not in match.group(1).split():
                definers.setdefault(match.group(2), []).append(stem)
    calls: dict[tuple[str, str], int] = {}
    for stem, text in texts.items():
        for match in C_CALL.finditer(text):
            owners = definers.get(match.group(1), [])
            if match.group(1) not in defined[stem] and len(owners) == 1:
                calls.setdefault((stem, owners[0]), text.count("\n", 0, match.start()) + 1)
    return edges + [Edge(source, target, line, "call") for (source, target), line in calls.items()]


def cycles(edges: Iterable[Edge]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm, iterative), each sorted."""
    succ: dict[str, set[str]] = {}
    for edge in edges:
        succ.setdefault(edge.source, set()).add(edge.target)
        succ.setdefault(edge.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(succ):
        if root in index:
            continue
        work = [(root, iter(sorted(succ[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(succ[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return sorted(found)


TICKED = re.compile(r"`([^`]+)`")


def layer_table(hacking: Path = ROOT / "HACKING.md") -> list[tuple[str, list[str]]]:
    """The rows of HACKING.md's layer table (under "## Where code goes"), lowest layer first: (layer, paths).

    A path is a backticked `x.py` (a module) or `x/` (a package and everything in it) of the "where" column, relative
    to `sandbox/` (a leading `sandbox/` is dropped; `{a,b}` expands); other backticked words are prose, and `csrc/`
    paths are the C core's.
    """
    section = hacking.read_text().split("\n## Where code goes", 1)[1].split("\n## ", 1)[0]
    rows: list[tuple[str, list[str]]] = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 3 or cells[0] in ("layer", "") or set(cells[0]) <= set("-: "):
            continue
        paths = []
        for word in TICKED.findall(cells[1]):
            word = word.removeprefix("sandbox/")
            if word.startswith("csrc/") or not (word.endswith(".py") or word.endswith("/")):
                continue
            paths.extend(_expand(word))
        rows.append((cells[0], paths))
    return rows


def _expand(word: str) -> list[str]:
    """`backends/{native,bwrap}/` as `backends/native/` and `backends/bwrap/`."""
    match = re.search(r"\{([^}]*)\}", word)
    if match is None:
        return [word]
    return [out for choice in match.group(1).split(",")
            for out in _expand(word[:match.start()] + choice.strip() + word[match.end():])]


def _module_of(path: str, package: str = "sandbox") -> str:
    """The dotted module (or package) a table path names."""
    parts = path.removesuffix("/").removesuffix(".py").split("/")
    return ".".join([package, *(parts[:-1] if parts[-1] == "__init__" else parts)])


def layers(known: Iterable[str], table: list[tuple[str, list[str]]]) -> tuple[dict[str, int], list[str]]:
    """Each of the `known` modules' layer (its row's index in `table`) and the modules no row names.

    A module path (`x.py`, `x/__init__.py`) claims that module; a package path (`x/`) claims the package and every
    module below it; the most specific claim wins. The package `sandbox` itself is left out: it only re-exports.
    """
    modules_of: dict[str, int] = {}
    packages: dict[str, int] = {}
    for index, (_, paths) in enumerate(table):
        for path in paths:
            (packages if path.endswith("/") else modules_of)[_module_of(path)] = index
    found: dict[str, int] = {}
    missing: list[str] = []
    for name in known:
        parts = name.split(".")
        owners = [".".join(parts[:end]) for end in range(len(parts), 1, -1) if ".".join(parts[:end]) in packages]
        if name in modules_of:
            found[name] = modules_of[name]
        elif owners:
            found[name] = packages[owners[0]]
        elif name != "sandbox":
            missing.append(name)
    return found, missing


def upward(edges: Iterable[Edge], layer: Mapping[str, int]) -> list[Edge]:
    """The edges from a module to one of a higher layer (modules without a layer are left out)."""
    return [e for e in edges if e.source in layer and e.target in layer and layer[e.target] > layer[e.source]]


def main(argv: list[str]) -> int:
    """Print the cycles (with and without function-level edges), the C cycles, and with --edges every edge."""
    edges = graph()
    running = [e for e in edges if e.kind != "typing"]
    print(f"{len(edges)} edges: " + ", ".join(f"{sum(e.kind == k for e in edges)} {k}" for k in KINDS))
    print("cycles, module-level edges:", cycles(e for e in running if e.kind == "module"))
    print("cycles, module- and function-level edges:", cycles(running))
    print("C cycles (includes and calls):", cycles(c_graph()))
    table = layer_table()
    layer, missing = layers(modules(ROOT / "sandbox"), table)
    print("modules the layer table does not name:", missing)
    for e in upward(running, layer):
        print(f"upward: {e.kind:8} {e.source}:{e.line} ({table[layer[e.source]][0]}) -> {e.target} "
              f"({table[layer[e.target]][0]})")
    lazy = lazy_imports()
    unexplained = [item for item in lazy if item.reason is None]
    print(f"function-level imports of sandbox's own modules: {len(lazy)}, {len(unexplained)} without a reason")
    for item in unexplained:
        print(f"no reason: {item.module}:{item.line}: {item.text}")
    if "--edges" in argv:
        for e in sorted(edges, key=lambda e: (e.kind, e.source, e.line)):
            print(f"{e.kind:8} {e.source}:{e.line} -> {e.target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
