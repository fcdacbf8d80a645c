"""The started pipeline's heap is frozen out of Python's cyclic collector (``services/common/heap.py``), and
thawed when it stops: a full collection then walks only what requests built since start-up."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest

from lookahead_rag.services.app import Pipeline
from lookahead_rag.services.common.heap import freeze_startup_heap, thaw_heap
from lookahead_rag.services.config import AllSettings


class Cycle:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_frozen_objects_are_not_walked_and_garbage_is_collected_first() -> None:
    garbage = Cycle()  # unreachable once the name is gone: freeze must collect it, not keep it forever
    gone = weakref.ref(garbage)
    del garbage
    kept = [Cycle()]  # alive at start-up: frozen
    try:
        frozen = freeze_startup_heap()
        # a frozen object can still die (another test's thread dropping its last reference): never more
        assert 0 < gc.get_freeze_count() <= frozen
        assert gone() is None  # collected before the freeze
        assert all(o is not kept[0] for o in gc.get_objects())  # frozen: no generation holds it
    finally:
        thaw_heap()
    assert gc.get_freeze_count() == 0
    assert any(o is kept[0] for o in gc.get_objects())  # thawed: collectable again


@pytest.mark.asyncio
async def test_a_started_pipeline_freezes_its_heap_and_stop_thaws_it(tmp_path: Path) -> None:
    settings = AllSettings.load(None, draftcache={"data_dir": tmp_path / "dc", "port": 0})
    pipeline = await Pipeline.start(settings, ["draftcache"])
    try:
        assert gc.get_freeze_count() > 0  # the store, the bus, the servers' objects: out of every collection
        assert all(o is not pipeline for o in gc.get_objects())
    finally:
        await pipeline.stop()
    assert gc.get_freeze_count() == 0
