"""Issue 22, item 6c: one tenant's prompts cannot flush another tenant's cached prefixes.

The generator's settings give each tenant a share of the prefix cache (``prefix_cache_tenant_share``);
tenant A filling far more than its share (more than the whole cache) evicts only its own entries,
and B's next request still reuses B's cached prefix in the real engine.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator

import pytest
import torch
from lookahead_core.config import DecodingConfig
from lookahead_core.engine.request import ServeRequest
from lookahead_core.engine.scheduler import StepScheduler
from lookahead_core.kv.prefix_cache import KV

from lookahead_rag.services.generator.engine_config import scheduler_config
from lookahead_rag.services.generator.settings import MIB, GeneratorSettings
from tests.core.helpers import Client, StubTokenizer, random_prompt, run_all, tiny_model

CACHE_MB = 1  # the whole prefix cache
SHARE = 0.25  # one tenant's part of it
FLOOD_TOKENS, FLOOD_DIM = 64, 256  # A's hand-made entries: [1, 1, 64, 256] fp32 keys and values, 128 KiB
FLOOD_ENTRIES = 40  # 5 MiB asked for: 20 times A's share, 5 times the whole cache
MAX_NEW, DECODING_LENGTH = 4, 4  # short answers: only the prefill matters here


@pytest.fixture
def scheduler() -> Iterator[StepScheduler]:
    """The engine as the generator's settings configure it (no start-up measurement, one thread)."""
    settings = GeneratorSettings(prefix_cache_mb=CACHE_MB, prefix_cache_tenant_share=SHARE)
    config = dataclasses.replace(scheduler_config(settings), calibrate=False, threads=1)
    sched = StepScheduler(tiny_model("llama"), StubTokenizer(), config).start()  # type: ignore[arg-type]
    yield sched
    sched.close()


def flood_kv() -> KV:
    keys = torch.ones(1, 1, FLOOD_TOKENS, FLOOD_DIM)  # [1, kv_heads, n, head_dim]
    return [(keys, keys.clone())]


def serve(sched: StepScheduler, tenant: str, prompt: list[int]) -> ServeRequest:
    client = Client()
    req = ServeRequest(prompt, DecodingConfig(max_new_tokens=MAX_NEW, decoding_length=DECODING_LENGTH),
                       tenant=tenant, on_tokens=client.on_tokens, on_done=client.on_done,
                       prefix_epoch=sched.prefix_cache.epoch(tenant))
    run_all(sched, [req], [client])
    assert client.error is None
    return req


def test_a_tenant_filling_past_its_share_leaves_others_prefixes(scheduler: StepScheduler) -> None:
    cache = scheduler.prefix_cache
    prompt = random_prompt(random.Random(22))
    serve(scheduler, "b", prompt)  # B's prompt is cached (B's only entry, the least recent of all)
    assert cache.sequences("b") == [tuple(prompt)]
    # A stores far more than its share, and more than the whole cache
    for first in range(FLOOD_ENTRIES):
        cache.put("a", [first] * FLOOD_TOKENS, flood_kv(), epoch=cache.epoch("a"))
    held_by_a = len(cache.sequences("a")) * FLOOD_TOKENS * FLOOD_DIM * 4 * 2  # fp32 keys and values
    assert 0 < held_by_a <= SHARE * CACHE_MB * MIB
    # B's entry is still there, and B's next request reuses it (all but the token it must prefill)
    assert cache.sequences("b") == [tuple(prompt)]
    assert serve(scheduler, "b", prompt).stats.prefix_hit_tokens == len(prompt) - 1
    assert cache.stats().bytes <= CACHE_MB * MIB
