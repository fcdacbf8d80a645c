"""A step's plan laid out in one packed row: the one place that knows where each request's rows are.

Every decode's root and tree (then its proposers' extra rows, the Jacobi window) and every prefill
chunk become a ``Segment`` of the step's layout (``step_layout.StepLayout``: each request's tokens attend
to its own KV only). Logits are kept for every tree row, for the extra rows a proposer reads, and for
a prompt's last row (its first output token); ``DecodeRows`` / ``first_rows`` say where they are among
the kept rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..drafting.draft import ancestor_matrix
from ..forward.step_layout import Segment, StepLayout, causal_visible
from ..kv.kvstore import RequestKV
from .plan import StepPlan


@dataclass(frozen=True)
class DecodeRows:
    """Where one decode's kept rows are among the step's kept logits."""

    tree: slice  # the root and every tree node, root first: the choice after each
    extra: slice  # the extra rows its proposer reads (empty without a window)


@dataclass
class PackedStep:
    """One step's forward: ids, positions, kept rows and the attention plan, in the plan's order."""

    ids: list[int] = field(default_factory=list)  # [T] token ids of the packed row
    positions: list[int] = field(default_factory=list)  # [T] each token's position in its own request
    keep: list[int] = field(default_factory=list)  # [K] packed positions whose logits the step needs
    attention: StepLayout = field(default_factory=StepLayout)  # where each request's tokens sit, what they see
    decodes: list[DecodeRows] = field(default_factory=list)  # per plan.decodes
    first_rows: list[int | None] = field(default_factory=list)  # per plan.chunks: kept row of the first token

    def __len__(self) -> int:
        return len(self.ids)


def pack_step(plan: StepPlan, caches: Mapping[str, RequestKV]) -> PackedStep:
    """Lay ``plan`` out in one row (decodes first, then chunks): each request's segment (``caches``: each
    request's KV by id, where it reads and writes); the backend builds its attention metadata from them."""
    step = PackedStep()
    for d in plan.decodes:
        tree, past, extra = d.tree, d.past, d.extra
        start, kept = len(step.ids), len(step.keep)
        step.ids += [d.root, *tree.tokens]
        step.positions += [past + depth for depth in (0, *tree.depths)]
        step.keep += range(start, len(step.ids))
        tree_rows = slice(kept, len(step.keep))
        if extra is None:
            visible = ancestor_matrix(tree.parents)  # [q, q]: each row sees its ancestors and itself
            extra_rows = slice(len(step.keep), len(step.keep))
        else:
            visible = extra.visible  # [q+L, q+L]
            q = len(tree) + 1
            step.ids += extra.ids
            step.positions += extra.positions
            at = len(step.keep)
            step.keep += range(start + q + extra.keep.start, start + q + extra.keep.stop)
            extra_rows = slice(at, len(step.keep))
        step.attention.segments.append(Segment(caches[d.id], start, past, visible))
        step.decodes.append(DecodeRows(tree_rows, extra_rows))
    for c in plan.chunks:
        start = len(step.ids)
        step.ids += c.tokens
        step.positions += range(c.first, c.end)
        step.attention.segments.append(Segment(caches[c.id], start, c.first, causal_visible(c.end - c.first)))
        if c.last:
            step.keep.append(len(step.ids) - 1)  # the last prompt token's logits give the first output token
            step.first_rows.append(len(step.keep) - 1)
        else:
            step.first_rows.append(None)
    return step
