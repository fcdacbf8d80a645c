"""The side-channel-safe stream on the real model over gRPC and HTTP, and the observer it must defeat.

Functional cases: the tokens and text are exactly the normal stream's (decoding is unchanged: the
safe stream re-cuts the engine's stream), every delta has one serialized size and holds
``safe_stream_chunk_tokens`` tokens (the last fewer), deltas keep the cadence, the final stats say only
that the answer is complete, the per-tenant setting turns it on, and the HTTP endpoint passes it on.

The observer (Wei et al., arXiv 2411.01076; Carlini & Nasr, arXiv 2410.17175): a tenant's past answers
are in its draft cache, so asking one of its past questions again (a hit) decodes in fewer, larger
steps than a fresh question (a miss). An observer that sees only each message's serialized size and
arrival time learns a one-feature threshold on half the trials and classifies the other half (2-fold
cross-validation, so every trial is classified once by a rule that never saw it). With the mode off it
must beat chance clearly; with it on it must be no better than chance: accuracy at most
0.5 + 3 * sqrt(0.25 / trials) (three standard deviations of a fair coin). The cadence is set from the
measured decoding time (the mode's premise: a tick is longer than decoding a chunk), so the test holds on
a slow or loaded machine. No past sessions go in the prompt (``default_m = 0``): a repeat is drafted from
the tenant's cache and reuses its prompt's prefix KV, a fresh question does neither.
``test_observer_small`` (24 trials per mode, ~2.5 min) always runs; the 200-trial one is ``slow``.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from lookahead_rag.v1 import events_pb2, generator_pb2

from tests.http.helpers import TENANT_HEADER, ask, raw_client
from tests.pipeline.helpers import (
    CALL_TIMEOUT_S,
    Answered,
    RunningPipeline,
    collect,
    greedy,
    module_loop,
    module_pipeline,
    params,
    unique_tenant,
)

INTERVAL_MS = 150.0  # the functional cases' cadence
CHUNK = 4  # safe_stream_chunk_tokens
N = 16  # max_new_tokens of the functional cases
EPS_S = 0.01  # timers may fire up to the loop's clock resolution early
ALWAYS_SAFE = unique_tenant("always-safe")
SAFE = {"safe_stream": True}

pipe = module_pipeline(generator={"safe_stream_interval_ms": INTERVAL_MS, "safe_stream_chunk_tokens": CHUNK,
                                  "safe_stream_tenants": [ALWAYS_SAFE]})


async def timed_answer(p: RunningPipeline, request: generator_pb2.AnswerRequest) -> tuple[Answered, list[float]]:
    """The answer and each delta's arrival (seconds after the call was made)."""
    got, arrivals = Answered(), []
    start = time.perf_counter()
    async for chunk in p.stub.Answer(request, timeout=CALL_TIMEOUT_S):
        if chunk.HasField("final"):
            got.final = chunk.final
        else:
            got.deltas.append(chunk.delta)
            arrivals.append(time.perf_counter() - start)
    return got, arrivals


def assert_safe_shape(got: Answered, new_tokens: int) -> None:
    """One serialized size for every delta; CHUNK ids each, the last fewer; the final says only 'complete'."""
    assert got.final is not None
    assert len({generator_pb2.AnswerChunk(delta=d).ByteSize() for d in got.deltas}) == 1
    assert all(d.padding for d in got.deltas)
    counts = [len(d.token_ids) for d in got.deltas if d.token_ids]
    assert all(c == CHUNK for c in counts[:-1]) and 0 < counts[-1] <= CHUNK, counts
    assert got.final.stats == events_pb2.GenerationStats(new_tokens=new_tokens,
                                                         finish_reason=got.final.stats.finish_reason)
    assert got.final.stats.finish_reason in ("length", "eos", "stop")
    assert not (got.final.answer_text or got.final.prompt_ids or got.final.output_ids or got.final.documents)


@module_loop
async def test_safe_stream_has_the_normal_streams_tokens_and_text(pipe: RunningPipeline) -> None:
    # two tenants with the same documents: the same prompt, one answer streamed each way
    normal = await pipe.answer(pipe.new_tenant("normal"), max_new_tokens=N)
    safe, _ = await timed_answer(pipe, pipe.answer_request(pipe.new_tenant("safe"), max_new_tokens=N, **SAFE))
    assert normal.final is not None and safe.final is not None
    assert safe.streamed_ids == normal.streamed_ids == list(normal.final.output_ids)
    assert safe.streamed_ids == greedy(pipe.model, normal.final.prompt_ids, N)
    assert safe.text == normal.text == normal.final.answer_text
    assert_safe_shape(safe, len(normal.streamed_ids))


GENERATE_CASES: dict[str, dict[str, Any]] = {
    # multi-byte characters: the chunk's text is its tokens' whole characters, none broken
    "accents and emoji": {"prompt": "Écris une phrase en français avec des accents et un emoji 😀 : ",
                          "params": {"max_new_tokens": 24}},
    "japanese": {"prompt": "日本語で自己紹介してください。", "params": {"max_new_tokens": 24}},
    # a stop string: the text is cut where the normal stream cuts it
    "stop string": {"prompt": "Count: one, two, three, four, five,", "params": {"max_new_tokens": 24, "stop": [","]}},
}


@module_loop
@pytest.mark.parametrize("case", list(GENERATE_CASES))
async def test_safe_generate_matches_the_normal_stream(pipe: RunningPipeline, case: str) -> None:
    fields = dict(GENERATE_CASES[case])
    gen = fields.pop("params")
    tenant = unique_tenant(case)
    normal = await pipe.generate(generator_pb2.GenerateRequest(tenant=tenant, params=params(**gen), **fields))
    safe = await pipe.generate(generator_pb2.GenerateRequest(tenant=tenant, params=params(**gen, **SAFE), **fields))
    assert normal.final is not None and safe.final is not None
    assert safe.streamed_ids == normal.streamed_ids
    assert safe.text == normal.text == normal.final.answer_text
    assert "\ufffd" not in safe.text or "\ufffd" in normal.text  # no character broken by the re-cut
    assert safe.final.stats.finish_reason == normal.final.stats.finish_reason
    assert_safe_shape(safe, normal.final.stats.new_tokens)


@module_loop
async def test_safe_deltas_keep_the_cadence(pipe: RunningPipeline) -> None:
    # one delta per tick at most: never before its tick, never two in one tick
    interval = INTERVAL_MS / 1000
    tenant = pipe.new_tenant("cadence")
    await pipe.answer(tenant, max_new_tokens=N)
    await pipe.drain()  # the repeat is a cache hit: all tokens verified at once, the cadence still holds
    got, arrivals = await timed_answer(pipe, pipe.answer_request(tenant, max_new_tokens=N, **SAFE))
    assert len(arrivals) == math.ceil(len(got.streamed_ids) / CHUNK)
    assert arrivals[0] >= interval - EPS_S
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert all(g >= interval - EPS_S for g in gaps)
    assert statistics.median(gaps) < 2 * interval  # once verified, chunks leave tick after tick, not later
    assert_safe_shape(got, len(got.streamed_ids))


@module_loop
async def test_tenant_setting_makes_every_stream_safe(pipe: RunningPipeline) -> None:
    pipe.ingest(ALWAYS_SAFE)
    got = await pipe.answer(ALWAYS_SAFE, max_new_tokens=N)  # the request does not ask for it
    assert_safe_shape(got, len(got.streamed_ids))
    other = await pipe.answer(pipe.new_tenant("not-listed"), max_new_tokens=N)
    assert other.final is not None and not any(d.padding for d in other.deltas)  # off by default
    assert other.final.stats.forward_steps > 0


@module_loop
async def test_cancelled_safe_stream_frees_the_engine(pipe: RunningPipeline) -> None:
    call = pipe.stub.Answer(pipe.answer_request(pipe.new_tenant("cancel"), max_new_tokens=64, **SAFE),
                            timeout=CALL_TIMEOUT_S)
    assert (await call.read()).HasField("delta")
    call.cancel()
    assert await pipe.wait_idle() == 0
    assert await call.code() == grpc.StatusCode.CANCELLED


def sse_events(body: bytes) -> list[bytes]:
    events = body.split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""]
    return events[:-2]


@module_loop
async def test_http_safe_stream_events_have_one_size(pipe: RunningPipeline) -> None:
    tenant = pipe.new_tenant("http-safe")
    normal = await pipe.answer(tenant, max_new_tokens=N)
    assert normal.final is not None
    body = {"messages": ask("How do I pretty-print JSON with json.dumps?"), "max_tokens": N, "safe_stream": True}
    headers = {TENANT_HEADER: pipe.new_tenant("http-safe-2")}  # the same prompt as ``normal``'s
    async with raw_client(pipe) as http:
        streamed = await http.post("/v1/chat/completions", json={**body, "stream": True}, headers=headers)
        whole = await http.post("/v1/chat/completions", json=body, headers={TENANT_HEADER: pipe.new_tenant("h3")})
    assert streamed.status_code == 200 and whole.status_code == 200, (streamed.text, whole.text)
    events = sse_events(streamed.content)
    objects = [json.loads(e.removeprefix(b"data: ")) for e in events]
    deltas = [(e, o) for e, o in zip(events, objects, strict=True) if o["choices"][0]["finish_reason"] is None]
    assert len(deltas) == math.ceil(normal.final.stats.new_tokens / CHUNK)
    assert len({len(e) for e, _ in deltas}) == 1  # every delta event has one size, padded
    assert "".join(o["choices"][0]["delta"]["content"] for _, o in deltas) == normal.final.answer_text
    assert whole.json()["choices"][0]["message"]["content"] == normal.final.answer_text  # not streamed: whole


# ---- the observer -------------------------------------------------------------------------------------------
SUBJECTS = ["json.dumps", "json.loads", "csv.reader", "csv.writer", "pathlib.Path", "Path.read_text",
            "Path.exists", "sort_keys", "indent=2", "os.path.join", "open()", "str.split", "dict.get",
            "list.sort", "sorted()", "enumerate()", "zip()", "range()", "print()", "len()"]
TEMPLATES = ["What does {} do?", "How do I use {}?", "Explain {} in one sentence.", "Give an example of {}.",
             "When should I use {}?", "What does {} return?", "Is {} slow?", "Why would I call {}?",
             "What arguments does {} take?", "Can {} fail?", "What is a common mistake with {}?",
             "How is {} different from its alternatives?", "Where is {} documented?", "Summarize {}.",
             "Show {} in a short snippet."]
OBSERVED_NEW_TOKENS = 8  # short answers...
OBSERVED_CHUNK = 8  # ...one safe chunk each: one tick per trial (the functional cases cover several chunks)
TICK_MARGIN = 1.5  # the cadence's tick over the slowest (90th percentile) whole fresh answer measured
SEED = 20241102
Trace = list[tuple[int, float]]  # (serialized size, seconds since the previous message) per message

FEATURES: dict[str, Callable[[Trace], float]] = {
    "messages": len,
    "mean_size": lambda t: statistics.fmean(s for s, _ in t),
    "max_size": lambda t: max(s for s, _ in t),
    "first_s": lambda t: t[0][1],
    "total_s": lambda t: sum(g for _, g in t),
    "mean_gap_s": lambda t: statistics.fmean(g for _, g in t),
    "max_gap_s": lambda t: max(g for _, g in t),
}

# no past sessions in the prompt (default_m 0): a repeat is drafted from the tenant's cache of past answers,
# not copied from its own earlier session in the prompt (which any question may cite)
observed = module_pipeline(generator={"safe_stream_chunk_tokens": OBSERVED_CHUNK}, limits={"default_m": 0})


def chance_bound(trials: int) -> float:
    """Accuracy a coin stays under with probability ~0.9987 over ``trials`` (mean + 3 standard deviations)."""
    return 0.5 + 3 * math.sqrt(0.25 / trials)


@dataclass(frozen=True)
class Rule:
    """Classify 'hit' when ``sign * (feature - threshold) > 0``."""

    feature: str
    threshold: float
    sign: int

    def __call__(self, trace: Trace) -> bool:
        return self.sign * (FEATURES[self.feature](trace) - self.threshold) > 0


def fit(traces: Sequence[Trace], hits: Sequence[bool]) -> Rule:
    """The single-feature threshold rule most accurate on these trials."""
    best: tuple[float, Rule] | None = None
    for name, feature in FEATURES.items():
        values = sorted({feature(t) for t in traces})
        cuts = [values[0] - 1] + [(a + b) / 2 for a, b in itertools.pairwise(values)]
        for threshold, sign in itertools.product(cuts, (1, -1)):
            rule = Rule(name, threshold, sign)
            accuracy = statistics.fmean(rule(t) == h for t, h in zip(traces, hits, strict=True))
            if best is None or accuracy > best[0]:
                best = (accuracy, rule)
    assert best is not None
    return best[1]


def cross_validated_accuracy(traces: Sequence[Trace], hits: Sequence[bool]) -> tuple[float, list[Rule]]:
    """2-fold: a rule fit on the even trials classifies the odd ones and the other way round."""
    correct, rules = 0, []
    for train in (0, 1):
        fit_idx = [i for i in range(len(traces)) if i % 2 == train]
        test_idx = [i for i in range(len(traces)) if i % 2 != train]
        rule = fit([traces[i] for i in fit_idx], [hits[i] for i in fit_idx])
        rules.append(rule)
        correct += sum(rule(traces[i]) == hits[i] for i in test_idx)
    return correct / len(traces), rules


async def observe(p: RunningPipeline, request: generator_pb2.AnswerRequest) -> tuple[Trace, generator_pb2.FinalInfo]:
    """What the observer sees of one gRPC stream: each message's serialized size and inter-arrival time."""
    trace: Trace = []
    final = None
    last = time.perf_counter()
    async for chunk in p.stub.Answer(request, timeout=CALL_TIMEOUT_S):
        now = time.perf_counter()
        trace.append((chunk.ByteSize(), now - last))
        last = now
        if chunk.HasField("final"):
            final = chunk.final
    assert final is not None
    return trace, final


@dataclass
class ObserverRun:
    accuracy_off: float
    accuracy_on: float
    trials: int
    interval_ms: float
    seconds: float
    cache_tokens_hit: float  # mean draft tokens from the tenant cache, hits (mode off)
    cache_tokens_miss: float  # ... misses


async def run_observer(p: RunningPipeline, trials: int) -> ObserverRun:
    """``trials`` per mode (half hits, half misses, in a seeded random order) on one tenant."""
    started = time.perf_counter()
    half = trials // 2
    rng = random.Random(SEED)
    questions = [t.format(s) for t, s in itertools.product(TEMPLATES, SUBJECTS)]
    rng.shuffle(questions)
    assert len(questions) >= 3 * half
    past, fresh_off, fresh_on = questions[:half], questions[half:2 * half], questions[2 * half:3 * half]
    tenant = p.new_tenant("observed")

    def request(question: str, safe: bool) -> generator_pb2.AnswerRequest:
        return p.answer_request(tenant, question, max_new_tokens=OBSERVED_NEW_TOKENS, safe_stream=safe)

    walls = []  # a fresh question's whole answer, as the client sees it: sets the cadence
    for question in past:  # the tenant's history: these answers go to its draft cache
        t0 = time.perf_counter()
        await collect(p.stub.Answer(request(question, False), timeout=CALL_TIMEOUT_S))
        walls.append(time.perf_counter() - t0)
    await p.drain()
    interval_s = TICK_MARGIN * statistics.quantiles(walls, n=10)[-1]
    p.engine.settings.safe_stream_interval_ms = interval_s * 1000

    accuracy, cache = {}, {}
    for safe, fresh in ((False, fresh_off), (True, fresh_on)):
        order = [(q, True) for q in past] + [(q, False) for q in fresh]
        rng.shuffle(order)
        traces, hits = [], []
        for question, hit in order:
            trace, final = await observe(p, request(question, safe))
            traces.append(trace)
            hits.append(hit)
            if not safe:
                cache.setdefault(hit, []).append(final.stats.draft_tokens_from_cache)
        accuracy[safe], rules = cross_validated_accuracy(traces, hits)
        print(f"safe_stream={safe}: accuracy {accuracy[safe]:.3f} over {len(traces)} trials; rules {rules}")
    return ObserverRun(accuracy[False], accuracy[True], trials, interval_s * 1000, time.perf_counter() - started,
                       statistics.fmean(cache[True]), statistics.fmean(cache[False]))


def check_observer(run: ObserverRun) -> None:
    bound = chance_bound(run.trials)
    print(f"observer: {run.trials} trials per mode, tick {run.interval_ms:.0f} ms, {run.seconds:.0f} s; "
          f"off {run.accuracy_off:.3f}, on {run.accuracy_on:.3f}, chance bound {bound:.3f}; draft tokens from "
          f"the cache: hits {run.cache_tokens_hit:.1f}, misses {run.cache_tokens_miss:.1f}")
    assert run.cache_tokens_hit > run.cache_tokens_miss  # the premise: hits draft from the tenant's cache
    assert run.accuracy_off > bound  # the normal stream tells hits from misses
    assert run.accuracy_on <= bound  # the safe stream does not


SMALL_TRIALS = 24  # the always-run version: its chance bound is 0.806


@module_loop
async def test_observer_small(observed: RunningPipeline) -> None:
    check_observer(await run_observer(observed, SMALL_TRIALS))


LONG_OBSERVER_ENV = "LAR_TEST_OBSERVER_200"  # set to 1 to run the 200-trial observer (~12 min on 2 cores)


@module_loop
@pytest.mark.slow
@pytest.mark.skipif(os.environ.get(LONG_OBSERVER_ENV) != "1", reason=f"opt-in: {LONG_OBSERVER_ENV}=1 (~12 min); "
                    "its first full run had the off-mode observer at chance (0.500), see docs/SECURITY.md")
@pytest.mark.timeout(3600)  # one tick (1.5 x a slow fresh answer) per safe trial
async def test_observer_200_trials(observed: RunningPipeline) -> None:
    # the figure for the note: 100 hits and 100 misses per mode (a tenant of its own)
    check_observer(await run_observer(observed, 200))


def test_chance_bound_is_three_sigma() -> None:
    assert chance_bound(200) == pytest.approx(0.606, abs=1e-3)


def test_fit_finds_a_separating_threshold_and_cv_scores_it() -> None:
    # hits: few, large messages; misses: many small ones (the normal stream's signal)
    hits = [[(300, 0.1)] * 2 for _ in range(10)]
    misses = [[(60, 0.05)] * 8 for _ in range(10)]
    traces = [t for h, m in zip(hits[::2], misses[::2], strict=True) for t in (h, h, m, m)]  # both folds get both
    labels = [(i // 2) % 2 == 0 for i in range(len(traces))]
    accuracy, _ = cross_validated_accuracy(traces, labels)
    assert accuracy == 1.0
    same = [[(200, 0.15)] * 3 for _ in range(20)]  # identical traces: no rule can beat chance
    assert cross_validated_accuracy(same, labels)[0] == 0.5
