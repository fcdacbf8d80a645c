"""Sampled answers through the whole pipeline on real gRPC (loopback, port 0): a request with a
temperature streams exactly plain one-token-per-forward sampling (``generate_sampled``) of the same
prompt, config and seed, whatever drafts, batch-mates or repeats it meets; an unseeded request
reports the seed it got, and that seed gives its text again; temperature 0 is plain greedy.

One pipeline for the module; every test uses its own tenant. Past sessions are off ([limits]
default_m=0) so a repeated question has the same prompt (its first answer still feeds the draft
cache, so the repeat is decoded with drafts from it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from lookahead_core import DecodingConfig
from lookahead_core.sampling import generate_sampled

from tests.pipeline.helpers import (
    CALL_TIMEOUT_S,
    Answered,
    RunningPipeline,
    collect,
    greedy,
    module_loop,
    module_pipeline,
    wait_until,
)
from tests.pipeline.spies import ForwardGate, SubmitSpy

pytestmark = module_loop

N = 12  # max_new_tokens of every answer here (small: CI runs on 2 shared cores)
SEED = 20240607
CSV_QUESTION = "How do I read the rows of a CSV file?"
PATH_QUESTION = "What does Path.exists() tell?"
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed")

pipe = module_pipeline(limits={"default_m": 0})


def reference(p: RunningPipeline, prompt_ids: Sequence[int], **sampling: Any) -> list[int]:
    """Plain sampling (one token per forward, no drafts, alone) of ``prompt_ids`` by the stock model;
    ``sampling`` are DecodingConfig's field names, with the values the request carried."""
    config = DecodingConfig(max_new_tokens=N, **sampling)
    return list(generate_sampled(p.model, p.tokenizer, list(prompt_ids), config))


def expected(p: RunningPipeline, got: Answered, gen: dict[str, Any]) -> list[int]:
    """What ``got`` must be for the request params ``gen``: plain greedy or plain sampling."""
    assert got.final is not None
    if not gen.get("temperature"):
        return greedy(p.model, got.final.prompt_ids, N)
    return reference(p, got.final.prompt_ids, **{k: v for k, v in gen.items() if k in SAMPLING_KEYS})


@pytest.mark.parametrize("mode", ["hierarchical", "none"])
async def test_seeded_answer_is_plain_sampling_with_that_seed(pipe: RunningPipeline, tenant: str, mode: str) -> None:
    gen = {"temperature": 0.7, "top_p": 0.9, "seed": SEED, "max_new_tokens": N, "mode": mode}
    first = await pipe.answer(tenant, **gen)
    final = first.final
    assert final is not None and final.answer_text.strip()
    assert first.text == final.answer_text
    # what streamed is exactly plain sampling of the same prompt with the same config and seed
    assert first.streamed_ids == list(final.output_ids) == reference(pipe, final.prompt_ids, temperature=0.7,
                                                                      top_p=0.9, seed=SEED)
    assert final.stats.sampled and final.stats.seed == SEED  # the stats say how it was made
    await pipe.drain()
    (event,) = pipe.events.for_tenant(tenant)  # the published event carries the same stats
    assert event.stats.sampled and event.stats.seed == SEED
    assert list(event.output_ids) == list(final.output_ids)
    # the same request again (its first answer now in the tenant's drafts, unless mode none): same text
    again = await pipe.answer(tenant, **gen)
    assert again.final is not None
    assert list(again.final.prompt_ids) == list(final.prompt_ids)
    assert again.streamed_ids == list(final.output_ids) and again.text == first.text
    if mode != "none":  # drafted from the first answer, and still not one token different
        assert again.final.stats.draft_tokens_from_cache > 0


async def test_unseeded_answer_reports_the_seed_that_reproduces_it(pipe: RunningPipeline, tenant: str) -> None:
    gen = {"temperature": 0.9, "top_k": 50, "max_new_tokens": N}
    first = await pipe.answer(tenant, **gen)
    assert first.final is not None
    stats = first.final.stats
    assert stats.sampled  # no seed asked: the server drew one and says which
    seed = stats.seed
    assert list(first.final.output_ids) == reference(pipe, first.final.prompt_ids, temperature=0.9, top_k=50,
                                                     seed=seed)
    # asking again with that seed gives the same text
    again = await pipe.answer(tenant, seed=seed, **gen)
    assert again.final is not None and again.final.stats.seed == seed
    assert again.text == first.text and list(again.final.output_ids) == list(first.final.output_ids)
    # another unseeded request draws another seed (a fixed default seed would make every answer alike)
    other = await pipe.answer(tenant, **gen)
    assert other.final is not None and other.final.stats.sampled and other.final.stats.seed != seed


async def test_temperature_zero_is_plain_greedy(pipe: RunningPipeline, tenant: str) -> None:
    # temperature 0 is greedy whatever else is set (filters never drop the most likely token; no draws)
    got = await pipe.answer(tenant, temperature=0.0, top_p=0.5, top_k=3, min_p=0.2, seed=SEED, max_new_tokens=N)
    assert got.final is not None
    assert got.streamed_ids == list(got.final.output_ids) == greedy(pipe.model, got.final.prompt_ids, N)
    assert not got.final.stats.sampled


BURST: list[tuple[str, dict[str, Any]]] = [
    # (question, params): greedy and sampled, with and without drafts, different filters and seeds
    ("How do I pretty-print JSON with json.dumps?", {"temperature": 0.7, "top_p": 0.9, "seed": 1}),
    (CSV_QUESTION, {}),
    (PATH_QUESTION, {"temperature": 1.0, "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.2, "seed": 2,
                     "mode": "none"}),
    ("How do I pretty-print JSON with json.dumps?", {"mode": "none"}),
    (CSV_QUESTION, {"temperature": 0.7, "top_p": 0.9, "seed": 3}),
]


async def test_burst_of_greedy_and_sampled_requests_each_get_their_own_output(pipe: RunningPipeline,
                                                                              tenant: str) -> None:
    # all in flight at once, so they share batched forwards: each still gets exactly its plain
    # reference (greedy ones plain greedy, sampled ones plain sampling with their own config and seed)
    scheduler = pipe.generator.scheduler
    with SubmitSpy(scheduler) as spy, ForwardGate(scheduler.backend.kernels, block_at=1) as gate:
        calls = [asyncio.ensure_future(collect(pipe.stub.Answer(
            pipe.answer_request(tenant, question, max_new_tokens=N, **gen), timeout=CALL_TIMEOUT_S)))
            for question, gen in BURST]
        assert await gate.wait_reached()  # the first prefill is held: the others queue behind it
        assert await wait_until(lambda: len(spy.requests) == len(BURST))  # all in the scheduler
        gate.release()
        results = await asyncio.gather(*calls)
    for (question, gen), got in zip(BURST, results, strict=True):
        assert got.final is not None
        assert got.streamed_ids == list(got.final.output_ids) == expected(pipe, got, gen), (question, gen)
        assert got.final.stats.sampled == bool(gen.get("temperature"))
        if "seed" in gen:
            assert got.final.stats.seed == gen["seed"]
    assert all(got.final is not None and got.final.stats.max_batch_size > 1 for got in results)  # shared forwards
    assert await pipe.wait_idle() == 0
