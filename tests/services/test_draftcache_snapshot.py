"""Snapshots: every tenant's trie, whole outputs and applied event ids survive; bad bytes are refused."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from lookahead_rag.services.draftcache.codec import MAGIC, SnapshotError
from lookahead_rag.services.draftcache.store import DraftCacheStore
from tests.builders import TOKENIZER
from tests.services.draftcache_helpers import small_settings

TENANTS = ["acme", "globex", "initech"]
EVENTS = 120  # events filled_store applies
QUERIES = [[1, 2], [3, 4, 5, 6], [7, 8, 9], [2, 2, 2], [10, 11, 12, 13]]


def event_of(i: int) -> tuple[str, str]:
    """(tenant, event id) of the i-th event filled_store applies."""
    tenant = TENANTS[i % len(TENANTS)]
    return tenant, f"{tenant}-{i}"


def filled_store(seed: int = 3) -> DraftCacheStore:
    """Three tenants, two tokenizers, repeated outputs, some pruning (capacity 64)."""
    store = DraftCacheStore(small_settings(node_capacity=64, max_references=6))
    rng = random.Random(seed)
    for i in range(EVENTS):
        tenant, event_id = event_of(i)
        tok = TOKENIZER if i % 4 else "tok-b"
        ids = [rng.randrange(14) for _ in range(rng.randrange(1, 9))]
        store.add_output(tenant, tok, ids, event_id)
    return store


def observe(store: DraftCacheStore) -> list[object]:
    """What a client can see: stats (less the approximate bytes) and the fetches of several queries."""
    seen: list[object] = [
        [(s.tenant, s.tokenizer_id, s.nodes, s.outputs, s.references) for s in store.stats()]
    ]
    for tenant in TENANTS:
        for tok in (TOKENIZER, "tok-b"):
            seen += [store.fetch(tenant, tok, q, q[::-1], 48) for q in QUERIES]
    return seen


def test_roundtrip_restores_equal_state() -> None:
    store = filled_store()
    data = store.snapshot()
    restored = DraftCacheStore(small_settings(node_capacity=64, max_references=6))
    restored.restore(data)
    assert observe(restored) == observe(store)
    assert any(observe(store)[1:])  # the queries do find continuations (the comparison is not vacuous)
    assert restored.snapshot() == data
    # applied event ids came along: replaying every event changes nothing
    for i in range(EVENTS):
        tenant, event_id = event_of(i)
        assert restored.add_output(tenant, TOKENIZER, [1], event_id) is False
    assert restored.snapshot() == data


def test_restore_replaces_the_state() -> None:
    store = filled_store()
    other = DraftCacheStore(small_settings(node_capacity=64, max_references=6))
    other.add_output("stale-tenant", TOKENIZER, [1, 2, 3], "x")
    other.restore(store.snapshot())
    assert "stale-tenant" not in other.tenants()
    assert other.tenants() == sorted(TENANTS)


def test_restore_with_lower_capacity_prunes() -> None:
    store = filled_store()
    small = DraftCacheStore(small_settings(node_capacity=20, max_references=6))
    small.restore(store.snapshot())
    assert all(s.nodes <= 20 for s in small.stats())


def _flip_last_byte(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 1])


BAD_SNAPSHOTS = [
    # not a snapshot at all
    ("foreign", lambda d: b"hello world", "not a draft cache snapshot"),
    # cut short inside the header
    ("short header", lambda d: d[: len(MAGIC) + 3], "truncated snapshot header"),
    # cut short inside the payload
    ("short payload", lambda d: d[:-5], "checksum or length mismatch"),
    # one bit flipped
    ("bit flip", _flip_last_byte, "checksum or length mismatch"),
    # a newer format version
    ("version", lambda d: MAGIC + (99).to_bytes(4, "little") + d[len(MAGIC) + 4 :], "version 99"),
]


@pytest.mark.parametrize(("name", "damage", "message"), BAD_SNAPSHOTS, ids=[b[0] for b in BAD_SNAPSHOTS])
def test_bad_snapshot_is_refused_and_state_kept(name: str, damage: object, message: str) -> None:
    store = filled_store()
    target = filled_store(seed=4)
    before = target.snapshot()
    with pytest.raises(SnapshotError, match=message):
        target.restore(damage(store.snapshot()))  # type: ignore[operator]
    assert target.snapshot() == before


def test_branch_length_mismatch_is_refused() -> None:
    data = filled_store().snapshot()
    other = DraftCacheStore(small_settings(branch_length=5))
    with pytest.raises(SnapshotError, match="branch_length 4; configured 5"):
        other.restore(data)


def test_save_and_load_snapshot_file(tmp_path: Path) -> None:
    store = filled_store()
    path = tmp_path / "sub" / "draftcache.snapshot"
    size = store.save_snapshot(path)
    assert path.stat().st_size == size
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left behind
    loaded = DraftCacheStore(small_settings(node_capacity=64, max_references=6))
    assert loaded.load_snapshot(path) is True
    assert observe(loaded) == observe(store)
    # saving again replaces the file in one piece
    store.add_output("acme", TOKENIZER, [13, 13, 13], "one-more")
    assert store.save_snapshot(path) == len(store.snapshot())
    assert DraftCacheStore(small_settings()).load_snapshot(tmp_path / "missing") is False
