"""How many of the retrieved passages a prompt gets: a rule instead of a fixed k.

The search returns up to k passages best first; ``passages_to_keep`` keeps the first ``min_passages``
and then each next one while its score is at least ``min_ratio`` of the best score (the passages are
ranked by the search, so the first one below the ratio ends the list). The prompt's token budget
then cuts what does not fit, as before (prompt.build_prompt). ``min_ratio`` 0 keeps all k.
"""

from __future__ import annotations

from collections.abc import Sequence


def passages_to_keep(scores: Sequence[float], min_ratio: float, min_passages: int) -> int:
    """The count of leading passages to keep, given their scores in search order (best first)."""
    if not 0.0 <= min_ratio <= 1.0:
        raise ValueError(f"min_ratio must be within [0, 1], got {min_ratio}")
    if min_passages < 1:
        raise ValueError(f"min_passages must be at least 1, got {min_passages}")
    if not scores or min_ratio == 0.0 or scores[0] <= 0.0:  # no positive best score to measure against
        return len(scores)
    floor = min_ratio * scores[0]
    for n, score in enumerate(scores):
        if n >= min_passages and score < floor:
            return n
    return len(scores)
