"""Every exception the package defines pickles and unpickles to an equal one (issue 39, item 3).

A node-side SetupError once reached a Ray driver as "RemoteError.__init__()
missing 1 required positional argument": pickle rebuilds an exception by
calling its class with `args`, which fails for a constructor of other or
keyword-only parameters. The classes are found by walking every module of
the package (a new one is covered without being listed here); each is built
by hypothesis from its constructor's annotations, every annotated attribute
of the class is set too, and the copy must have the same class, args, C-level
OSError fields and attributes, through pickle (every protocol) and
cloudpickle (what Ray uses).
"""

from __future__ import annotations

import ast
import collections.abc
import dataclasses
import importlib
import importlib.util
import inspect
import os
import pathlib
import pickle
import pkgutil
import subprocess
import types
import typing
from typing import Any, Union

import cloudpickle
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sandbox
from sandbox.cgroups import Usage

PLAIN = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
NESTED = st.builds(ValueError, st.text(max_size=20)) | st.builds(KeyboardInterrupt) | st.builds(
    sandbox.SetupError, st.text(max_size=20), step=st.text(max_size=10))
OSERROR_ARGS = st.tuples(st.integers(0, 200), st.text(max_size=20)) | st.tuples(
    st.integers(0, 200), st.text(max_size=20), st.text(max_size=20))
CHECK = settings(max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck))


def _module_names(path: list[str], prefix: str) -> list[str]:
    """Every module and package below `path`, found from the files alone (pkgutil.walk_packages
    imports each package to descend into it)."""
    out = []
    for info in pkgutil.iter_modules(path, prefix):
        out.append(info.name)
        if info.ispkg:
            out += _module_names([os.path.join(path[0], info.name.rpartition(".")[2])], info.name + ".")
    return out


def _defines_a_class(name: str) -> bool:
    """Whether module `name`'s source defines a class deriving from an *Error or *Exception base."""
    where = pathlib.Path(sandbox.__path__[0], *name.split(".")[1:])  # found without importing its package
    source = where / "__init__.py" if where.is_dir() else where.with_suffix(".py")
    tree = ast.parse(source.read_text())
    return any(isinstance(node, ast.ClassDef) and any(ast.unparse(b).endswith(("Error", "Exception"))
                                                      for b in node.bases) for node in ast.walk(tree))


def exception_classes() -> list[type[BaseException]]:
    """Every exception class defined in a module of the package (its entry points left out)."""
    found: dict[str, type[BaseException]] = {}
    for name in _module_names(sandbox.__path__, "sandbox."):
        if name.rpartition(".")[2] == "__main__":
            continue
        if name == "sandbox.ray" or name.startswith("sandbox.ray."):
            # not imported here: this runs at collection, and Ray reads its environment when first
            # imported (test_ray.py sets it first); its source is read instead, for classes of its own
            assert not _defines_a_class(name), f"{name} defines classes: import it to check them"
            continue
        if name.split(".")[:2] == ["sandbox", "inspect"] and importlib.util.find_spec("inspect_ai") is None:
            continue  # the inspect extra is not installed: its modules cannot be imported
        module = importlib.import_module(name)
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, BaseException) and obj.__module__ == module.__name__:
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return [found[name] for name in sorted(found)]


CLASSES = exception_classes()


def strategy(hint: Any) -> st.SearchStrategy[Any]:
    """Values of the annotation `hint` that compare equal to their copies (no NaN)."""
    if hint is object or hint is Any:
        return PLAIN
    if hint is float:
        return st.floats(allow_nan=False)
    if isinstance(hint, type) and issubclass(hint, BaseException):
        return NESTED
    if typing.get_origin(hint) is os.PathLike:
        return st.text(max_size=10).map(pathlib.PurePosixPath)
    if typing.get_origin(hint) is collections.abc.Sequence:
        return st.lists(strategy(typing.get_args(hint)[0]), max_size=3)
    if typing.get_origin(hint) in (Union, types.UnionType):
        return st.one_of(*(strategy(arg) for arg in typing.get_args(hint)))
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint)
        return st.builds(hint, **{f.name: strategy(hints[f.name]) for f in dataclasses.fields(hint) if f.init})
    return st.from_type(hint)


def instances(cls: type[BaseException]) -> st.SearchStrategy[BaseException]:
    """`cls` built from its constructor's annotated parameters (or the args its
    builtin base takes), then every annotated attribute of the class set."""
    init = cls.__init__
    if inspect.isfunction(init):
        hints = typing.get_type_hints(init, localns={"Usage": Usage})  # (imported for type checking only)
        params = [p for p in inspect.signature(init).parameters.values() if p.name != "self"]
        assert all(p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params), cls
        made = st.builds(cls, **{p.name: strategy(hints[p.name]) for p in params})
    elif issubclass(cls, OSError):
        made = OSERROR_ARGS.map(lambda args: cls(*args))
    else:
        made = st.lists(st.text(max_size=20), max_size=3).map(lambda args: cls(*args))
    attributes = {name: strategy(hint) for name, hint in class_hints(cls).items()}
    return st.tuples(made, st.fixed_dictionaries(attributes)).map(lambda pair: _with(*pair))


def class_hints(cls: type) -> dict[str, Any]:
    """The instance attributes a class annotates (of the package's classes in its MRO)."""
    out: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        if klass.__module__.startswith("sandbox"):
            out.update({k: v for k, v in typing.get_type_hints(klass).items() if not k.startswith("_")})
    return {k: v for k, v in out.items() if typing.get_origin(v) is not typing.ClassVar}


def _with(exc: BaseException, attributes: dict[str, Any]) -> BaseException:
    for name, value in attributes.items():
        setattr(exc, name, value)
    return exc


def same(a: Any, b: Any) -> bool:
    """Equal values; exceptions (which compare by identity) by class, args, OSError fields and attributes."""
    if not isinstance(a, BaseException):
        return bool(type(a) is type(b) and a == b)
    fields = ("errno", "strerror", "filename", "filename2")
    return (type(a) is type(b) and same(a.args, b.args) and vars(a).keys() == vars(b).keys()
            and all(same(vars(a)[k], vars(b)[k]) for k in vars(a))
            and (not isinstance(a, OSError) or all(getattr(a, f) == getattr(b, f) for f in fields)))


def round_trips(exc: BaseException) -> None:
    copies = [pickle.loads(pickle.dumps(exc, protocol)) for protocol in range(pickle.HIGHEST_PROTOCOL + 1)]
    copies.append(cloudpickle.loads(cloudpickle.dumps(exc)))
    for copy in copies:
        assert same(exc, copy), (exc, vars(exc), copy, vars(copy))
        assert str(copy) == str(exc)


def test_the_walk_finds_the_package_errors() -> None:
    names = {c.__name__ for c in CLASSES}
    assert {"SetupError", "SpecError", "ExecNotFoundError", "IsolationError", "TaskError", "TaskLimitError",
            "RemoteError", "BrokenWorkerPool", "StoreFullError", "BwrapArgsError"} <= names


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_every_exception_pickles_to_an_equal_one(cls: type[BaseException]) -> None:
    @CHECK
    @given(instances(cls))
    def check(exc: BaseException) -> None:
        # every attribute a constructor sets is annotated somewhere, so the strategies above reach it
        assert set(vars(exc)) <= set(class_hints(cls)) | _init_params(cls) | {"filename"}, vars(exc)
        round_trips(exc)

    check()


def _init_params(cls: type) -> set[str]:
    """The parameters of the constructors in `cls`'s MRO (a base's set attributes of its own)."""
    inits = [vars(klass)["__init__"] for klass in cls.__mro__ if "__init__" in vars(klass)]
    return {name for init in inits if inspect.isfunction(init) for name in inspect.signature(init).parameters}


def test_what_run_raises_on_a_timeout_pickles_too() -> None:
    exc = subprocess.TimeoutExpired(["sleep", "9"], 1.5, b"out", b"err")
    exc.killed_by = "timeout"  # type: ignore[attr-defined]
    usage = Usage("cgroup2", cpu_s=0.5, memory_peak_mb=3.0, pids_peak=2, events={"oom_kill": 0})
    exc.usage = usage  # type: ignore[attr-defined]
    round_trips(exc)


def test_a_setup_error_keeps_its_step_and_errno() -> None:
    err = sandbox.SetupError("Can't find source path /nope", step="bind", path="/nope", errno=2, backend="native")
    copy = pickle.loads(pickle.dumps(err))
    assert (type(copy), str(copy), copy.step, copy.path, copy.errno, copy.backend) == (
        sandbox.SetupError, "Can't find source path /nope", "bind", "/nope", 2, "native")
