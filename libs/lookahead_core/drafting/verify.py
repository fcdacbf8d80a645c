"""Accept the longest draft path the model agrees with (pure; greedy verification)."""

from __future__ import annotations

from collections.abc import Sequence


def accept_longest(tokens: Sequence[int], parents: Sequence[int], predicted: Sequence[int]) -> list[int]:
    """Flattened node indices of the longest accepted path, root (0) first.

    ``tokens[k]`` / ``parents[k]`` describe node k+1 (node 0 is the root); ``predicted[i]`` is the
    model's greedy choice after node i. Node c is accepted when its parent is accepted and
    ``tokens[c-1] == predicted[parent]``. Several children may hold the same token (parallel
    chains), so every matching child is explored and the deepest path wins (first on ties).
    The bonus token emitted after the path is ``predicted[path[-1]]``.
    """
    children: dict[int, list[int]] = {}
    for k, parent in enumerate(parents, start=1):
        children.setdefault(parent, []).append(k)

    best: list[int] = [0]
    stack: list[list[int]] = [[0]]
    while stack:
        path = stack.pop()
        if len(path) > len(best):
            best = path
        node = path[-1]
        want = predicted[node]
        # reversed so that, on ties, the earlier child (pushed last) is explored first
        for child in reversed(children.get(node, [])):
            if tokens[child - 1] == want:
                stack.append([*path, child])
    return best
