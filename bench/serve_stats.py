"""bench-serve's measurements: one record per request, and their summary per (level, way).

Definitions (client-side, ``time.perf_counter``):

- TTFT: request sent -> first delta that carries token ids.
- inter-token latency (ITL), per token: a delta of n tokens that arrives g seconds after the
  previous delta counts n samples of g / n; the first delta's tokens are covered by TTFT.
- goodput: tokens of completed requests / wall time of the level (first send -> last reply).
- mean accepted per step: completed requests' new tokens / their forward steps (token-weighted).
- mean tokens per forward: the engine's per-request ``mean_tokens_per_forward``, weighted by each
  request's forward steps (None while the engine does not fill it).
- exact match: fraction of completed requests whose output ids equal the serial baseline's answer to
  their own prompt ids: batch-1 greedy, or with --temperature > 0 the reference sampler for the same
  seed (serial_hf is that reference, so its own figure is 1.0 by construction).
- serial_hf: steps and forwards count one token each; its TTFT is re-timed by ``serial_queue``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

PromptKey = tuple[int, ...]  # prompt ids, as a dict key
SERVER_FIELDS = ("time_to_first_token_s", "prefill_s", "wall_s", "queue_wait_s", "finish_reason",
                 "mean_batch_size", "max_batch_size", "mean_tokens_per_forward", "documents_available",
                 "drafts_available", "kernel")  # GenerationStats fields kept per answer (--record)


@dataclass
class EngineStats:
    """The parts of FinalInfo.stats the benchmark reports."""

    new_tokens: int = 0  # tokens emitted
    forward_steps: int = 0  # forwards after prefill
    tokens_per_forward: float = 0.0  # engine's mean tokens per forward over this request's forwards
    prefix_hit_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    queue_wait_s: float = 0.0  # admitted -> first scheduled
    mean_batch_size: float = 0.0  # requests per forward this request rode in
    server: dict[str, Any] = field(default_factory=dict)  # SERVER_FIELDS as the server sent them


@dataclass
class RequestRecord:
    """One request as the client saw it."""

    index: int  # position in the request sequence
    sent_s: float  # when it was sent
    deltas: list[tuple[float, int]] = field(default_factory=list)  # (arrival, tokens) of deltas with tokens
    end_s: float | None = None  # when the stream ended
    error: str | None = None  # gRPC status name (or exception type) when it failed
    prompt_ids: list[int] = field(default_factory=list)  # FinalInfo.prompt_ids
    output_ids: list[int] = field(default_factory=list)  # FinalInfo.output_ids
    stats: EngineStats | None = None  # None: no FinalInfo
    client: int | None = None  # which closed-loop client sent it (0-based)
    client_order: int | None = None  # its place among that client's requests (0-based)
    retries: int = 0  # times it was sent again after failing before its first token (behind a proxy)
    request_id: str = ""  # the x-request-id it was sent with (every attempt's): its event's request_id

    @property
    def completed(self) -> bool:
        return self.error is None and self.stats is not None

    @property
    def ttft_s(self) -> float | None:
        return self.deltas[0][0] - self.sent_s if self.deltas else None

    def itl_samples(self) -> list[float]:
        out: list[float] = []
        for (prev, _), (now, n) in zip(self.deltas, self.deltas[1:], strict=False):
            out += [(now - prev) / n] * n
        return out


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between closest ranks (numpy's default); None if empty."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def serial_queue(records: list[RequestRecord], concurrency: int) -> list[RequestRecord]:
    """Records of a one-at-a-time server re-timed as if ``concurrency`` closed-loop clients fed it.

    The serial runs went back to back in sequence order, so request i starts when i-1 ends. With c
    clients, request i is sent at the start (i < c) or when request i-c ended; its TTFT then
    includes the time it waited behind the others. Client i % c sent it, as its (i // c)-th request.
    """
    ordered = sorted(records, key=lambda r: r.index)
    if not ordered:
        return []
    start = ordered[0].sent_s
    out = []
    for i, r in enumerate(ordered):
        earlier = ordered[i - concurrency] if i >= concurrency else None
        sent = start if earlier is None else (earlier.end_s if earlier.end_s is not None else earlier.sent_s)
        out.append(RequestRecord(r.index, sent, list(r.deltas), r.end_s, r.error, r.prompt_ids, r.output_ids,
                                 r.stats, i % concurrency, i // concurrency))
    return out


def _rounded(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(x, digits)


def summarize(records: Sequence[RequestRecord], wall_s: float,
              references: Mapping[PromptKey, list[int]]) -> dict[str, Any]:
    """One way at one level: the W object of the JSON (plus tokens, wall_s and queue wait)."""
    done = [r for r in records if r.completed]
    errors = Counter(r.error or "NO_FINAL" for r in records if not r.completed)
    tokens = sum(len(r.output_ids) for r in done)
    stats = [r.stats for r in done if r.stats is not None]
    steps = sum(s.forward_steps for s in stats)
    tpf = [(s.tokens_per_forward, s.forward_steps) for s in stats if s.tokens_per_forward]
    tpf_steps = sum(n for _, n in tpf)
    ttft = [t for r in done if (t := r.ttft_s) is not None]
    itl = [x for r in done for x in r.itl_samples()]
    checked = [r for r in done if tuple(r.prompt_ids) in references]
    exact = sum(r.output_ids == references[tuple(r.prompt_ids)] for r in checked)
    return {
        "completed": len(done),
        "errors": dict(sorted(errors.items())),
        "goodput_tokens_per_s": _rounded(tokens / wall_s if wall_s > 0 else None, 3),
        "ttft_p50_s": _rounded(percentile(ttft, 50)),
        "ttft_p99_s": _rounded(percentile(ttft, 99)),
        "itl_p50_s": _rounded(percentile(itl, 50), 5),
        "itl_p99_s": _rounded(percentile(itl, 99), 5),
        "mean_accepted_per_step": _rounded(sum(s.new_tokens for s in stats) / steps if steps else None, 3),
        "mean_tokens_per_forward": _rounded(sum(v * n for v, n in tpf) / tpf_steps if tpf_steps else None, 3),
        "prefix_hit_tokens": sum(s.prefix_hit_tokens for s in stats),
        "exact_match": _rounded(exact / len(checked) if checked else None),
        "tokens": tokens,
        "wall_s": round(wall_s, 3),
        "queue_wait_p50_s": _rounded(percentile([s.queue_wait_s for s in stats], 50)),
        "mean_batch_size": _rounded(_weighted([(s.mean_batch_size, s.forward_steps) for s in stats]), 3),
    }


def _weighted(pairs: Sequence[tuple[float, int]]) -> float | None:
    total = sum(n for v, n in pairs if v)
    return sum(v * n for v, n in pairs if v) / total if total else None


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, rounded; None when either is missing or b is zero."""
    return round(a / b, 3) if a is not None and b else None
