"""Generate references are bounded, and a large one is built off the engine's thread.

A tenant's huge reference is refused at once (INVALID_ARGUMENT); a large allowed one is put in its
trie on another thread, so a neighbour's answer never waits for it (the test holds A's trie build
until B has finished). Out-of-vocabulary ids are refused at AddOutput and dropped from fetched drafts.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import grpc
import pytest
from lookahead_core.config import DecodingConfig
from lookahead_core.engine.request import ServeRequest
from lookahead_core.vocab import tokenizer_id, vocab_size_of

import lookahead_rag.services.generator.core as engine_module
from lookahead_rag.services.common.errors import InvalidArgument
from lookahead_rag.services.common.rules.limits import RequestLimits
from lookahead_rag.services.draftcache.convert import continuations_from_proto
from lookahead_rag.services.draftcache.settings import DraftCacheSettings
from lookahead_rag.services.draftcache.store import DraftCacheStore
from lookahead_rag.services.generator.prepared import Prepared
from lookahead_rag.v1 import draftcache_pb2, generator_pb2
from tests.pipeline import helpers as ph
from tests.pipeline.helpers import module_loop

MAX_REFERENCE_TOKENS = 3000  # [limits] max_reference_tokens of this module's pipeline
N = 8  # tokens each answer takes
HOLD_S = 120.0  # the longest A's trie build is held (B must be done long before)

pipe = ph.module_pipeline(limits={"max_reference_tokens": MAX_REFERENCE_TOKENS},
                       generator={"max_running": 4})


def generate(tenant: str, prompt: str, reference_ids: list[int]) -> generator_pb2.GenerateRequest:
    return generator_pb2.GenerateRequest(tenant=tenant, prompt=prompt, reference_ids=reference_ids,
                                         params=ph.params(max_new_tokens=N))


@module_loop
async def test_a_huge_reference_is_refused_at_once(pipe: Any) -> None:
    # one token past the bound: INVALID_ARGUMENT naming the limit, and nothing reached the engine
    forwards = pipe.generator.scheduler.forwards
    request = generate(ph.unique_tenant("huge"), "Hi", [5] * (MAX_REFERENCE_TOKENS + 1))
    err = await ph.rpc_error(lambda: pipe.generate(request))
    ph.assert_status(err, grpc.StatusCode.INVALID_ARGUMENT, "references", str(MAX_REFERENCE_TOKENS))
    assert pipe.generator.scheduler.forwards == forwards


@module_loop
async def test_a_large_reference_never_holds_a_neighbour(pipe: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # A's trie build (the largest allowed reference) is held on its thread; B is answered, exactly
    # greedy, while it is held; then A goes on and is exactly greedy too
    tenant_a, tenant_b = ph.unique_tenant("big-ref"), ph.unique_tenant("neighbour")
    release, holding = threading.Event(), threading.Event()
    real_fill = engine_module.fill_trie

    def held_fill(req: ServeRequest, continuations: list[tuple[list[int], int]]) -> None:
        if req.tenant == tenant_a:
            holding.set()
            release.wait(HOLD_S)
        real_fill(req, continuations)

    monkeypatch.setattr(engine_module, "fill_trie", held_fill)
    reference = [(7 * i) % 40_000 + 100 for i in range(MAX_REFERENCE_TOKENS)]
    a = asyncio.ensure_future(pipe.generate(generate(tenant_a, "Tell me about tries.", reference)))
    assert await ph.wait_until(holding.is_set)
    try:
        b = await pipe.generate(generate(tenant_b, "Name a prime number.", []), timeout=ph.CALL_TIMEOUT_S)
        assert not a.done()  # B finished while A's trie was still being built
    finally:
        release.set()
    got_a = await a
    for got in (got_a, b):
        assert got.final is not None
        assert list(got.final.output_ids) == ph.greedy(pipe.model, got.final.prompt_ids, N)


def test_add_output_refuses_ids_outside_the_tokenizers_vocabulary(tmp_path: Any) -> None:
    # a tokenizer id names its vocabulary's size: an output id at or past it is refused
    tok_id = tokenizer_id(ph.shared_model()[1])
    size = vocab_size_of(tok_id)
    assert size == len(ph.shared_model()[1])
    store = DraftCacheStore(DraftCacheSettings(data_dir=tmp_path), RequestLimits())
    with pytest.raises(InvalidArgument, match=f"output_ids\\[1\\] = {size} "):
        store.add_output("acme", tok_id, [5, size], "e1")
    assert store.add_output("acme", tok_id, [5, size - 1], "e2")  # the last id is fine
    # a caller's own tokenizer name names no vocabulary: only the id range is checked
    assert store.add_output("acme", "my-tokenizer", [5, size], "e3")


def test_vocab_size_of_reads_only_tokenizer_ids() -> None:
    # the size inside "<class>-<size>-<12 hex>"; anything else names no vocabulary
    assert vocab_size_of("gpt2tokenizer-50257-0123456789ab") == 50257
    assert vocab_size_of("tok-a") is None
    assert vocab_size_of("gpt2tokenizer-50257-0123456789ab-x") is None
    assert vocab_size_of("gpt2tokenizer-50257-XYZ") is None


@module_loop
async def test_fetched_drafts_outside_the_vocabulary_are_dropped(pipe: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # a draft cache holding another vocabulary's ids (an old snapshot): the generator drops those
    # continuations and keeps the good ones
    engine = pipe.generator
    size = engine.vocab_size

    async def poisoned(*_args: Any, **_kw: Any) -> Any:
        return continuations_from_proto(draftcache_pb2.FetchResponse(continuations=[
            draftcache_pb2.Branch(ids=[5, size + 3], weight=2.0),
            draftcache_pb2.Branch(ids=[5, 6], weight=1.0),
        ]))  # what a client returns: the reply read back from the wire

    monkeypatch.setattr(engine.draft_cache, "fetch", poisoned)
    prep = Prepared("acme", "", [1, 2, 3], [], DecodingConfig(), "r1")
    kept, ok = await engine._fetch(prep, None)
    assert ok and kept == [([5, 6], 1)]
