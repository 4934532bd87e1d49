"""The WorkerPool's reply loader (no sandbox): what it rebuilds and what it refuses."""

from __future__ import annotations

import collections
import os
import pickle

import pytest

from sandbox.workerpool.results import ReplyLoader, UnsafeResultError


class Outer:
    class Inner:
        """A class the caller vouches for, named by a dotted qualname."""


class Amplified:
    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return list, (range(3_000_000),)


def test_result_types_with_a_dotted_qualname_are_rebuilt() -> None:
    loader = ReplyLoader(result_types=[Outer.Inner])
    assert type(loader.loads(pickle.dumps(Outer.Inner()))) is Outer.Inner


def test_plain_data_loads_and_copying_calls_are_charged() -> None:
    loader = ReplyLoader()
    value = collections.defaultdict(list, {1: [2]})
    assert loader.loads(pickle.dumps(value, 5)) == value
    with pytest.raises(UnsafeResultError, match="more than it sent"):
        loader.loads(pickle.dumps(Amplified(), 5))
    with pytest.raises(UnsafeResultError, match="not rebuilt without trust"):
        loader.loads(pickle.dumps(os.system))
