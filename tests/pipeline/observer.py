"""An observer of encrypted streams (Wei et al., arXiv 2411.01076; Carlini & Nasr, arXiv 2410.17175).

A tenant's past answers are in its draft cache, so asking one of its past questions again (a hit)
decodes in fewer, larger steps than a fresh question (a miss). The observer sees only each stream
message's serialized size and arrival time. It learns a one-feature threshold on half the trials and
classifies the other half (2-fold cross-validation: every trial is classified once by a rule that never
saw it). Chance is 0.5 (half hits, half misses).

The set-up makes the leak plain when the mode is off, as a real tenant's history would:
- every question has a subject of its own (a standard-library module or a built-in), so a hit's cached
  answer is the only one that continues its subject, and is drafted whole once the subject is written;
- one tenant per mode, each with the same history and asked the same questions, in one seeded order;
- no past sessions in the prompt (``default_m = 0``): a repeat is drafted from the tenant's cache and
  reuses its prompt's prefix KV, a fresh question does neither.

The cadence is set from the measured decoding time (the mode's premise: a tick is longer than decoding a
chunk), so the result holds on a slow or loaded machine.
"""

from __future__ import annotations

import builtins
import itertools
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lookahead_rag.v1 import generator_pb2
from tests.pipeline.helpers import CALL_TIMEOUT_S, RunningPipeline, collect

NEW_TOKENS = 24  # answers long enough that a hit drafts most of its answer from the tenant's cache...
CHUNK = NEW_TOKENS  # ...and one safe chunk each: one tick per trial (test_generator_safe_stream covers several)
TICK_MARGIN = 1.5  # the cadence's tick over the slowest (90th percentile) whole fresh answer measured
SEED = 20241102
NOT_SUBJECTS = frozenset({"antigravity", "this", "copyright", "credits", "exit", "quit", "license", "help"})
# a small tenant's whole history in every Fetch: hits and misses get the same drafts, and a hit's own past
# answer is among them even when it shares no n-gram with the question (the model may spell a subject its way)
WHOLE_HISTORY = {"max_whole_outputs": 200, "min_shared_ngrams": 1, "similarity_ngram": 1}
Trace = list[tuple[int, float]]  # (serialized size, seconds since the previous message) per message


def subjects() -> list[str]:
    """~280 distinct names: the standard library's public modules and the built-in functions and types."""
    modules = [f"the Python {m} module" for m in sorted(sys.stdlib_module_names)
               if not m.startswith("_") and m not in NOT_SUBJECTS]
    functions = [f"Python's built-in {b}()" for b in sorted(dir(builtins))
                 if b[0].islower() and b not in NOT_SUBJECTS]
    return modules + functions


def questions(count: int, seed: int = SEED) -> list[str]:
    """``count`` questions, each about a subject of its own, in a seeded order."""
    names = subjects()
    assert count <= len(names), f"{count} questions asked, {len(names)} subjects"
    random.Random(seed).shuffle(names)
    return [f"What is {name} used for?" for name in names[:count]]


def deltas(trace: Trace) -> Trace:
    """The token messages: all but the final one (the final's size is the stats')."""
    return trace[:-1] or trace


FEATURES: dict[str, Callable[[Trace], float]] = {
    "messages": len,
    "mean_delta_size": lambda t: statistics.fmean(s for s, _ in deltas(t)),
    "max_delta_size": lambda t: max(s for s, _ in deltas(t)),
    "final_size": lambda t: t[-1][0],
    "first_s": lambda t: t[0][1],
    "total_s": lambda t: sum(g for _, g in t),
    "mean_gap_s": lambda t: statistics.fmean(g for _, g in t),
    "max_gap_s": lambda t: max(g for _, g in t),
}


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
    steps_hit: float  # mean forward steps, hits (mode off)
    steps_miss: float  # ... misses


async def run_observer(p: RunningPipeline, trials: int) -> ObserverRun:
    """``trials`` per mode, half hits and half misses in one seeded order, one tenant per mode."""
    started = time.perf_counter()
    half = trials // 2
    asked = questions(2 * half)
    past, fresh = asked[:half], asked[half:]
    tenants = {safe: p.new_tenant(f"observed-{'on' if safe else 'off'}") for safe in (False, True)}

    def request(question: str, mode: bool, safe: bool) -> generator_pb2.AnswerRequest:
        """A question to the tenant of ``mode``'s trials, streamed safely or not."""
        return p.answer_request(tenants[mode], question, max_new_tokens=NEW_TOKENS, safe_stream=safe)

    walls = []  # a fresh question's whole answer, as the client sees it: sets the cadence
    for question, mode in itertools.product(past, (False, True)):  # each tenant's history: its draft cache
        t0 = time.perf_counter()
        await collect(p.stub.Answer(request(question, mode, False), timeout=CALL_TIMEOUT_S))
        walls.append(time.perf_counter() - t0)
    await p.drain()
    interval_s = TICK_MARGIN * statistics.quantiles(walls, n=10)[-1]
    p.generator.settings.safe_stream_interval_ms = interval_s * 1000

    order = [(q, True) for q in past] + [(q, False) for q in fresh]
    random.Random(SEED).shuffle(order)
    accuracy, cache, steps = {}, {True: [], False: []}, {True: [], False: []}
    for safe in (False, True):
        traces = []
        for question, hit in order:
            trace, final = await observe(p, request(question, safe, safe))
            traces.append(trace)
            if not safe:
                cache[hit].append(final.stats.draft_tokens_from_cache)
                steps[hit].append(final.stats.forward_steps)
        accuracy[safe], rules = cross_validated_accuracy(traces, [hit for _, hit in order])
        print(f"safe_stream={safe}: accuracy {accuracy[safe]:.3f} over {len(traces)} trials; rules {rules}")
    return ObserverRun(accuracy[False], accuracy[True], 2 * half, interval_s * 1000, time.perf_counter() - started,
                       statistics.fmean(cache[True]), statistics.fmean(cache[False]),
                       statistics.fmean(steps[True]), statistics.fmean(steps[False]))


def check_observer(run: ObserverRun) -> None:
    bound = chance_bound(run.trials)
    print(f"observer: {run.trials} trials per mode, tick {run.interval_ms:.0f} ms, {run.seconds:.0f} s; "
          f"off {run.accuracy_off:.3f}, on {run.accuracy_on:.3f}, chance bound {bound:.3f}; mode off, hits vs "
          f"misses: {run.cache_tokens_hit:.1f} vs {run.cache_tokens_miss:.1f} draft tokens from the cache, "
          f"{run.steps_hit:.1f} vs {run.steps_miss:.1f} forward steps")
    assert run.cache_tokens_hit > run.cache_tokens_miss  # the premise: hits draft from the tenant's cache
    assert run.accuracy_off > bound  # the normal stream tells hits from misses
    assert run.accuracy_on <= bound  # the safe stream does not
