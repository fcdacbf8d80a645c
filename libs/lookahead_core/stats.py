"""What one generation did, in counts: tokens, forwards, drafted and accepted tokens, why it ended.

Counts only: wall-clock timers stay with the caller that wants them (a benchmark times its own
calls), and per-step details go to an optional ``observer.StepObserver``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DecodeStats:
    """Counts of one generation (the batch-1 loop's; the serving engine's ``ServeStats`` extends them)."""

    new_tokens: int = 0  # tokens emitted (the first token from prefill included)
    forward_steps: int = 0  # verification forwards after prefill
    accepted_per_step: list[int] = field(default_factory=list)  # tokens emitted by each forward
    draft_tokens: int = 0  # draft tokens sent through the model
    finish_reason: str = ""  # "eos" | "stop" | "length" | "cancelled"
    sampled: bool = False  # tokens were drawn (temperature > 0), not taken greedily
    unverified: bool = False  # lossy mode (mjsd): the output may differ from plain decoding
    seed: int | None = None  # the sampling key used (the request's or a random one); None when greedy

    @property
    def mean_accepted_per_step(self) -> float:
        """Tokens per verification forward (1.0 for plain greedy)."""
        steps = self.forward_steps
        return (sum(self.accepted_per_step) / steps) if steps else 0.0
