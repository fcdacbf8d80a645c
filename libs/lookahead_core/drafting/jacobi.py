"""The Jacobi lookahead window and its n-gram pool (LMSYS lookahead decoding, paper 001).

The window keeps a 2D grid of guesses: ``levels`` rows of ``W`` tokens, row ``l`` shifted one
position right of row ``l-1``. Token ``(l, j)`` sits at position ``l + j + 1`` after the current
input token and attends to the committed context, to row 0 up to its column (``(0, 0..j)``) and to
its own column above it (``(1..l-1, j)``): a contiguous sequence of guesses ending at itself. One
forward gives every window token's next-token prediction; the last row's predictions become the new
last row, row 0 is dropped, and each column read top to bottom plus its new token is an N-gram the
model itself produced by Jacobi iteration. Those N-grams go to a per-request pool keyed by their first
token; a step drafts the pool's N-grams that start with the last emitted token (at most ``G``).

Worked example (W=2, N=3): the window ``[[5, 6], [7, 8]]`` (rows 0 and 1) and the last row's
predictions ``[9, 4]`` give the N-grams ``(5, 7, 9)`` and ``(6, 8, 4)`` and the next window
``[[7, 8], [9, 4]]``. Until the window has ``N - 1`` rows (the first ``N - 2`` steps) the new row is
appended and nothing is harvested.

The window only guesses: its tokens' KV is never kept and every drafted N-gram is verified by the
target like any other draft, so decoding stays exactly plain greedy.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

Window = tuple[tuple[int, ...], ...]  # rows of W tokens, oldest first

MAX_JACOBI_WINDOW = 8  # the widest window choose_window considers (LMSYS's widest for 7B models on a GPU: 15)
# What a wider forward may cost, as a fraction of the forward without the window: about the pool's measured
# gain in tokens per step over the trie's alone, 0.9% on squad-dev (bench/README.md, "More draft
# sources"), rounded up to 2% so the window opens where extra tokens are free (a GPU) but not on a CPU.
JACOBI_MAX_OVERHEAD = 0.02


def choose_window(cost: Callable[[int], float], base_tokens: int, ngram: int,
                  max_window: int = MAX_JACOBI_WINDOW, max_overhead: float = JACOBI_MAX_OVERHEAD) -> int:
    """The widest window W (0..max_window) whose ``W * (N - 1)`` window tokens keep a forward of
    ``base_tokens`` (the root and the tree) within ``(1 + max_overhead)`` times its cost; 0: no window.

    ``cost(n)``: seconds of a forward of n tokens on this machine (the calibrated kernels' curve).
    Example (N=3, base 9, overhead 0.1): with cost(n) = 1 + n / 100 (extra tokens nearly free, as on a
    GPU) the limit is 1.1 * 1.09 = 1.199; W=5 adds 10 tokens, cost(19) = 1.19 fits, W=6 (cost(21) = 1.21)
    does not: W = 5. With cost(n) = n (every token costs, as on a loaded CPU) W = 0.
    """
    if base_tokens < 1 or ngram < 2:
        raise ValueError(f"choose_window needs base_tokens >= 1 and ngram >= 2, got {base_tokens}, {ngram}")
    limit = (1 + max_overhead) * cost(base_tokens)
    best = 0
    for w in range(1, max_window + 1):
        if cost(base_tokens + w * (ngram - 1)) <= limit:
            best = w
    return best


@dataclass(frozen=True)
class JacobiConfig:
    """The lookahead window's shape."""

    window: int  # W: future positions guessed per row (0: no window)
    ngram: int  # N: tokens per harvested n-gram (rows = N - 1)
    guesses: int  # G: pool n-grams drafted per step at most, and kept per first token

    def __post_init__(self) -> None:
        if self.window < 0 or self.ngram < 2 or self.guesses < 1:
            raise ValueError(f"jacobi window >= 0, ngram >= 2, guesses >= 1; got {self}")

    @property
    def rows(self) -> int:
        return self.ngram - 1


def initial_window(context: Sequence[int], config: JacobiConfig) -> Window:
    """Row 0 of a fresh window: the last ``W`` context tokens (repeated when the context is shorter).

    >>> initial_window([1, 2, 3], JacobiConfig(window=2, ngram=3, guesses=1))
    ((2, 3),)
    """
    if not context:
        raise ValueError("the lookahead window needs a non-empty context to seed its window")
    w = config.window
    seed = list(context[-w:])
    while len(seed) < w:
        seed = (seed + seed)[:w]
    return (tuple(seed),)


def positions(window: Window) -> list[int]:
    """Each window token's position after the current input token, row by row: ``l + j + 1``."""
    return [level + j + 1 for level, row in enumerate(window) for j in range(len(row))]


def window_mask(window: Window) -> list[list[bool]]:
    """Which window tokens each window token sees (row-major, ``[L, L]``, L = rows x W).

    ``(l, j)`` sees ``(0, 0..j)`` and ``(1..l, j)``, itself included; the committed context (and the
    current input token) is seen by all, which the caller's mask adds.
    """
    flat = [(level, j) for level, row in enumerate(window) for j in range(len(row))]
    return [[(k == 0 and c <= j) or (1 <= k <= level and c == j) for k, c in flat] for level, j in flat]


def advance(window: Window, predictions: Sequence[int], config: JacobiConfig) -> tuple[Window, list[tuple[int, ...]]]:
    """The next window and the N-grams harvested from one forward's predictions for the last row.

    ``predictions[j]`` is the target's next token after window token ``(last row, j)``.
    """
    if len(predictions) != config.window or any(len(row) != config.window for row in window):
        raise ValueError(f"{len(predictions)} predictions for a window of width {config.window}")
    new_row = tuple(predictions)
    if len(window) < config.rows:  # still filling: no column is N tokens long yet
        return (*window, new_row), []
    grams = [(*(row[j] for row in window), new_row[j]) for j in range(config.window)]
    return (*window[1:], new_row), grams


class NgramPool:
    """Per-request n-grams by first token, the ``guesses`` most recently produced kept for each.

    >>> pool = NgramPool(guesses=2)
    >>> pool.put([(5, 7, 9), (5, 8, 1), (5, 7, 9), (6, 8, 4)])
    >>> pool.get(5)
    [(7, 9), (8, 1)]
    """

    def __init__(self, guesses: int) -> None:
        self.guesses = guesses
        self._by_first: dict[int, OrderedDict[tuple[int, ...], None]] = {}

    def put(self, grams: Sequence[tuple[int, ...]]) -> None:
        for gram in grams:
            if len(gram) < 2:
                continue
            tails = self._by_first.setdefault(gram[0], OrderedDict())
            tails[gram[1:]] = None
            tails.move_to_end(gram[1:], last=False)  # newest first
            while len(tails) > self.guesses:
                tails.popitem(last=True)

    def get(self, first: int) -> list[tuple[int, ...]]:
        """The continuations of n-grams starting with ``first``, newest first (at most ``guesses``)."""
        return list(self._by_first.get(first, ()))

    def __len__(self) -> int:
        return sum(len(t) for t in self._by_first.values())
