"""PrefixKVCache forgetting: ``forget_tenant`` drops one tenant's entries and advances its epoch, and a
``put`` carrying an epoch read before the forget stores nothing (a prefill that overlapped a forget
never brings the forgotten KV back)."""

from __future__ import annotations

import random

import pytest
from lookahead_core.config import DecodingConfig
from lookahead_core.engine.request import ServeRequest
from lookahead_core.engine.scheduler import SchedulerConfig

from tests.core.helpers import Client, random_prompt, run_all, tiny_model
from tests.core.test_core_prefix_cache import cache, check_view, make_kv

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = [1, 2, 3, 4, 5]
MAX_NEW, DECODING_LENGTH = 4, 4  # a short answer: only the prefill matters here
OTHER = [1, 2, 3, 9, 9]


def test_forget_tenant_drops_only_that_tenant_and_advances_its_epoch() -> None:
    c = cache()
    c.put("a", PROMPT, make_kv(PROMPT))
    c.put("a", [7, 8, 9], make_kv([7, 8, 9]))
    c.put("b", PROMPT, make_kv(PROMPT, mark=1))
    assert c.epoch("a") == 0 and c.epoch("b") == 0
    # both of a's entries go, and a is one forget further
    assert c.forget_tenant("a") == 2
    assert c.sequences("a") == [] and c.lookup("a", PROMPT) == (0, None)
    assert c.epoch("a") == 1
    # b keeps its entry and its epoch
    n, kv = c.lookup("b", PROMPT)
    assert n == len(PROMPT)
    check_view(kv, PROMPT, mark=1)
    assert c.epoch("b") == 0
    # the bytes of a's entries were given back
    assert c.stats().entries == 1


def test_forgetting_twice_drops_nothing_more_but_advances_the_epoch() -> None:
    c = cache()
    c.put("a", PROMPT, make_kv(PROMPT))
    assert c.forget_tenant("a") == 1
    # nothing left to drop; a second forget still makes older epochs stale
    assert c.forget_tenant("a") == 0
    assert c.epoch("a") == 2


def test_put_with_a_stale_epoch_stores_nothing() -> None:
    c = cache()
    before = c.epoch("a")  # the prompt is built ...
    c.forget_tenant("a")  # ... a forget comes while it prefills ...
    c.put("a", PROMPT, make_kv(PROMPT), epoch=before)  # ... and its KV must not come back
    assert c.sequences("a") == []
    # a prompt built after the forget is kept
    c.put("a", OTHER, make_kv(OTHER), epoch=c.epoch("a"))
    assert c.sequences("a") == [tuple(OTHER)]
    # without an epoch nothing is checked (callers that do not forget)
    c.put("a", PROMPT, make_kv(PROMPT))
    assert tuple(PROMPT) in c.sequences("a")


def test_another_tenants_forget_does_not_make_an_epoch_stale() -> None:
    c = cache()
    before = c.epoch("a")
    c.forget_tenant("b")
    c.put("a", PROMPT, make_kv(PROMPT), epoch=before)
    assert c.sequences("a") == [tuple(PROMPT)]


def test_the_scheduler_keeps_no_prefix_of_a_prompt_built_before_a_forget(scheduler_of) -> None:
    model = tiny_model("llama")
    prompt = random_prompt(random.Random(5))
    sched = scheduler_of(model, SchedulerConfig(calibrate=False, prefix_min_tokens=4))
    prefixes = sched.prefix_cache

    def serve(epoch: int | None) -> ServeRequest:
        client = Client()
        req = ServeRequest(prompt, DecodingConfig(max_new_tokens=MAX_NEW, decoding_length=DECODING_LENGTH),
                           tenant="t", on_tokens=client.on_tokens, on_done=client.on_done, prefix_epoch=epoch)
        run_all(sched, [req], [client])
        return req

    stale = prefixes.epoch("t")  # the engine reads it before it builds the prompt ...
    prefixes.forget_tenant("t")  # ... a forget of the tenant comes meanwhile
    # the prefill finishes after the forget: its KV is not kept
    serve(stale)
    assert prefixes.sequences("t") == []
    # a prompt built after the forget is kept, and the next request reuses it
    serve(prefixes.epoch("t"))
    assert prefixes.sequences("t") == [tuple(prompt)]
    assert serve(prefixes.epoch("t")).stats.prefix_hit_tokens == len(prompt) - 1
