"""Per-request costs measured by ``bench serve --replicas`` (the server's own stats of every answer), the
inputs of the replica simulation (bench/replica_sim.py):

- ``prefill_s_per_token``: prefill seconds per prompt token not found in the prefix cache;
- ``step_s_base`` + ``step_s_per_request`` x batch: one decode step's seconds by the requests in it
  (least squares over the answers' mean batch size and mean step time);
- ``tokens_per_step``: tokens each decode step emits (speculation), ``prompt_tokens`` and ``new_tokens``
  per request; ``warm_hit_fraction``: the share of a prompt the prefix cache held when it held any.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from lookahead_rag.bench.serve_stats import RequestRecord

MIN_STEP_S = 1e-4  # floor of a fitted step cost (a fit over near-equal batches can go negative)


@dataclass(frozen=True)
class Costs:
    """What one replica's work costs, measured."""

    prefill_s_per_token: float  # seconds per prompt token prefilled (a prefix-cache miss)
    step_s_base: float  # seconds of a decode step, whatever its batch
    step_s_per_request: float  # seconds a decode step adds per request in it
    tokens_per_step: float  # tokens a request gains per decode step
    prompt_tokens: float  # mean prompt length (tokens)
    new_tokens: float  # mean answer length (tokens)
    warm_hit_fraction: float  # prompt share served from the prefix cache on a replica that knows the tenant

    def step_s(self, batch: int) -> float:
        return max(MIN_STEP_S, self.step_s_base + self.step_s_per_request * batch)

    def to_json(self) -> dict[str, float]:
        return {k: round(v, 6) for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Costs:
        return cls(**{k: float(data[k]) for k in cls.__dataclass_fields__})


def _line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of y on x; a flat line at the mean when x does not vary."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return my, 0.0
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - slope * mx, slope


def measure(records: Sequence[RequestRecord]) -> Costs | None:
    """The costs of the completed answers among ``records`` (None when none has the server's stats)."""
    done = [r for r in records if r.completed and r.stats is not None and r.stats.forward_steps > 0
            and "prefill_s" in r.stats.server and "wall_s" in r.stats.server]
    if not done:
        return None
    missed = sum(max(1, len(r.prompt_ids) - r.stats.prefix_hit_tokens) for r in done if r.stats)
    prefill = sum(float(r.stats.server["prefill_s"]) for r in done if r.stats)
    steps = [(max(1.0, r.stats.mean_batch_size),
              (float(r.stats.server["wall_s"]) - float(r.stats.server["prefill_s"])) / r.stats.forward_steps)
             for r in done if r.stats]
    base, per_request = _line(steps)
    warm = [r.stats.prefix_hit_tokens / len(r.prompt_ids) for r in done
            if r.stats and r.stats.prefix_hit_tokens and r.prompt_ids]
    return Costs(
        prefill_s_per_token=prefill / missed, step_s_base=base, step_s_per_request=per_request,
        tokens_per_step=sum(r.stats.new_tokens for r in done if r.stats) / sum(r.stats.forward_steps
                                                                             for r in done if r.stats),
        prompt_tokens=sum(len(r.prompt_ids) for r in done) / len(done),
        new_tokens=sum(len(r.output_ids) for r in done) / len(done),
        warm_hit_fraction=sum(warm) / len(warm) if warm else 0.0,
    )
