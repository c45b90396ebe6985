"""``freeze_long_lived_objects``: what a trainer rank does to its start-up heap before its first step."""

from __future__ import annotations

import gc
import weakref

import pytest

from hpcppo.train.build import freeze_long_lived_objects


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


@pytest.fixture
def frozen_heap():
    yield freeze_long_lived_objects()
    gc.unfreeze()  # back into the oldest generation: the rest of the suite runs with a normal collector


def test_everything_alive_is_frozen_and_later_cycles_are_still_collected(frozen_heap):
    assert frozen_heap > 10_000  # this process's modules, classes and functions
    a, b = _Node(), _Node()
    a.other, b.other = b, a  # a cycle made after the freeze: only the collector can free it
    gone = weakref.ref(a)
    del a, b
    gc.collect()
    assert gone() is None


def test_a_frozen_object_is_still_freed_by_reference_counting(frozen_heap):
    node = _Node()
    gc.collect()
    gc.freeze()  # as if it had been alive at start-up
    gone = weakref.ref(node)
    del node
    assert gone() is None
