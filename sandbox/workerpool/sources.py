"""Source lines for the frames of a remote traceback that ran code sent by value.

cloudpickle sends a function the sandbox cannot import (one of `__main__`, a
closure, a module of the caller's checkout) as its code object, with the file
name replaced by "<dynamic-code>", so the task's traceback names no file and
shows no line. The caller still has that code: each such frame is matched, by
function name and line number, to a code object of the modules the call was
sent from, and gets its file and source line back.
"""

from __future__ import annotations

import linecache
import re
import sys
import types
from collections.abc import Iterable, Iterator

_FRAME = re.compile(r'^  File "<dynamic-code>", line (\d+), in (.+)$')


def _code_objects(module: types.ModuleType) -> Iterator[types.CodeType]:
    """Every code object defined in `module`'s file: its functions, the
    methods of its classes, and whatever they nest (lambdas, closures)."""
    todo: list[object] = list(vars(module).values())
    seen: set[int] = set()
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, types.CodeType):
            if obj.co_filename == getattr(module, "__file__", None):
                yield obj
            todo += [c for c in obj.co_consts if isinstance(c, types.CodeType)]
        elif isinstance(obj, (types.FunctionType, types.MethodType)):
            todo.append(getattr(obj, "__func__", obj).__code__)
        elif isinstance(obj, (staticmethod, classmethod)):
            todo.append(obj.__func__)
        elif isinstance(obj, type) and obj.__module__ == module.__name__:
            todo += list(vars(obj).values())


def _lines(code: types.CodeType) -> tuple[int, int]:
    numbers = [line for _, _, line in code.co_lines() if line is not None]
    return (min(numbers), max(numbers)) if numbers else (code.co_firstlineno, code.co_firstlineno)


def _find(name: str, line: int, modules: Iterable[str]) -> str | None:
    """The file of the code object called `name` whose lines hold `line`."""
    for module_name in modules:
        module = sys.modules.get(module_name)
        if module is None:
            continue
        for code in _code_objects(module):
            if code.co_name == name.split(".")[-1]:
                first, last = _lines(code)
                if first <= line <= last:
                    return code.co_filename
    return None


def restore_frames(traceback: str, modules: Iterable[str]) -> str:
    """`traceback` with each "<dynamic-code>" frame given back its file and source line."""
    if "<dynamic-code>" not in traceback:
        return traceback
    names = list(dict.fromkeys(["__main__", *modules]))
    out: list[str] = []
    for text in traceback.splitlines(keepends=True):
        match = _FRAME.match(text.rstrip("\n"))
        filename = match and _find(match.group(2), int(match.group(1)), names)
        if not match or not filename:
            out.append(text)
            continue
        line = int(match.group(1))
        out.append(f'  File "{filename}", line {line}, in {match.group(2)}\n')
        source = linecache.getline(filename, line).strip()
        if source:
            out.append(f"    {source}\n")
    return "".join(out)
