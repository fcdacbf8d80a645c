"""A step's layout, neutral to every backend: where each request's tokens sit in one packed forward and what
each of them sees. The engine builds it (``engine.pack``); a backend builds its own attention metadata from it
(the CPU backend ``ragged.RaggedPlan``'s masks, the generic one ``backend.layout``'s pool indices).

    layout = StepLayout([Segment(kv, start=0, past=5, visible=causal_visible(3))])

A segment's ``kv`` is whatever cache the backend granted the request (``Backend.kv_for``); the layout never
reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

PLAN_KWARG = "lookahead_plan"  # forward keyword that carries a backend's attention metadata down to attention


@dataclass
class Segment:
    """One request's tokens in the packed row."""

    kv: Any  # the request's cache (the backend's own); the segment's entries go to [past, past + q)
    start: int  # first token of the segment in the packed row
    past: int  # valid cache entries before this segment
    visible: np.ndarray  # [q, q] bool: token i sees segment token j (tree ancestors, or causal)

    @property
    def q(self) -> int:
        return self.visible.shape[0]


@dataclass
class StepLayout:
    """The segments of one forward, in packed-row order, and its attention's clock (the step profile reads it)."""

    segments: list[Segment] = field(default_factory=list)
    timed: bool = False  # add every attention call's seconds to ``attention_s`` (a step profile reads it)
    attention_s: float = 0.0  # seconds spent in attention over this layout's forward (when ``timed``)


def causal_visible(q: int) -> np.ndarray:
    """[q, q] lower-triangular visibility of a prefill chunk."""
    return np.tril(np.ones((q, q), dtype=bool))
