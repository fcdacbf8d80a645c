"""An optional per-step observer: what benchmarks need from every step, kept out of the stats.

    recorder = PathRecorder()
    decoder.generate(prompt_ids, observer=recorder)      # or ServeRequest(..., observer=recorder)
    length, table = choose_decoding_length(curve, recorder.paths)

Best-first trees are prefixes of bigger ones, so the accepted paths of a run with a wide budget tell
what every smaller budget would have accepted (budget.py): a benchmark sizes the tree from one run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from .drafting.draft import DraftTree


class StepObserver(Protocol):
    """Sees every verification step of a run. Called on the decoding thread (the scheduler's thread in
    the serving engine): it must not block."""

    def on_step(self, tree: DraftTree, accepted: tuple[int, ...]) -> None:
        """``tree`` was verified below the root; ``accepted``: its accepted node indices, root excluded
        (1-based in the flattened order, increasing along the path)."""


@dataclass
class PathRecorder:
    """A StepObserver that keeps every step's accepted path."""

    paths: list[tuple[int, ...]] = field(default_factory=list)  # per step: accepted node indices, root excluded

    def on_step(self, tree: DraftTree, accepted: tuple[int, ...]) -> None:
        self.paths.append(accepted)
