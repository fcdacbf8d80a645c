"""Which kernels run a forward of n tokens, chosen by measurement on the machine at hand.

A kernel is a *twin* of the model: the same parameters (shared, not copied) under other module
objects, so its Linear layers may be split into per-thread row blocks (``split``: the stock result
bit for bit), with q/k/v and gate/up as one product each over one joined storage (``fused``: bit
for bit too), run by oneDNN on the model's own weights (``onednn``) or on a packed copy (``packed``),
fused with every product weight-major (``wmajor``: the weight as the GEMM's left operand), by a
kernel that reads every weight row once for all of a tree's rows (``rows``: AVX2 or AVX-512, compiled at first use),
and its attention implementation swapped while the
original model keeps the stock kernels (the greedy baseline). Which twin is faster depends on
the machine and on the forward size (packed weights were slower than stock at 1-2 tokens and faster
from ~8 on one 2-core CPU, the other way round elsewhere), so ``KernelSet.calibrate`` times every
twin at a few sizes, keeps the curve and drops the twins that win nowhere. The packed twin is the
one that holds a second copy of every Linear weight (2.0 GB on Qwen2.5-0.5B fp32): it is only built
when asked for (``kernels=KERNELS``; the default is ``SHARING``) and kept only where it is
``COPY_MIN_GAIN`` faster than every twin that shares the weights.

    kernels = KernelSet(model, attn_implementation=RAGGED_ATTENTION)  # "stock"; on CPU "split", "fused", "onednn"
    kernels.calibrate(probe, token_counts=(1, 2, 4, 8, 16, 32, 64), repeats=3)
    kernels.runner(1)(input_ids=...)                            # the twin that wins at 1 token
    kernels.curve.cost(9), kernels.curve.marginal(9)            # seconds: for draft budgets
"""

from __future__ import annotations

import bisect
import copy
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from torch import nn

from .fused import fuse_linears, fuse_weights
from .gemv import gemv_ok, gemv_product
from .lean import LeanTwin, lean_ok, lean_ops
from .memory import release_freed
from .packed import onednn_linears, onednn_product, pack_linears, packable
from .placement import model_ok
from .quant.lean import blocks_lean_ok, quant_lean_twin
from .quant.load import is_quantized
from .ragged import RAGGED_ATTENTION
from .rows import rows_linears, rows_ok, rows_product
from .split import split_linears, split_parts, splittable
from .wmajor import weight_major_ok

STOCK = "stock"  # the model's own Linear kernels
SPLIT = "split"  # the stock product over per-thread row blocks of each weight (CPU, same result bit for bit)
FUSED = "fused"  # split, with q/k/v and gate/up as one product each over one joined weight storage
GEMV = "gemv"  # fused, every one-row product by an AVX2 GEMV summing in MKL's order (checked bit for bit per model)
LEAN = "lean"  # fused, one row by gemv, more by rows, every ragged forward one lean layer loop (Llama/Qwen2; checked)
LEAN_DNN = "lean-onednn"  # lean with oneDNN's product past one row (the bigger trees and prefill chunks)
ONEDNN = "onednn"  # oneDNN's Linear on the model's own weights (fp32 CPU only; no copy)
WMAJOR = "wmajor"  # fused, every product computed as (W x^T)^T: one pass over a weight for a few rows (CPU)
ROWS = "rows"  # every weight row read once for all rows (AVX2 or AVX-512, compiled at first use; fp32 CPU)
PACKED = "packed"  # oneDNN pre-packed Linear weights (fp32 CPU only): a second copy of every Linear weight
LEAN_BLOCKS = "lean-blocks"  # a model on the block kernel (quant/): its layers as the lean loop (checked bit for bit)
KERNELS = (STOCK, SPLIT, FUSED, GEMV, LEAN, LEAN_DNN, ONEDNN, WMAJOR, ROWS, PACKED, LEAN_BLOCKS)  # what a set may hold
COPIES = frozenset({PACKED})  # kernels whose twin holds its own copy of the weights (kept only where it pays)
SHARING = (STOCK, FUSED, LEAN, LEAN_DNN, WMAJOR, LEAN_BLOCKS)  # the default: no second copy of a weight
SUPERSEDED = {LEAN: (GEMV, ROWS), LEAN_DNN: (ONEDNN,)}  # a lean twin makes these products with less around them:
# a set asked for it holds them only where its loop is refused
EXACT = frozenset({STOCK, SPLIT, FUSED, GEMV, LEAN, LEAN_DNN, LEAN_BLOCKS})  # one token: the stock bits
COPY_MIN_GAIN = 0.10  # a copying twin is kept only where it is this much faster than every sharing twin
CLEAR_LOSS = 1.5  # calibration: a kernel this many times slower than the best at a size is not timed there again
LONG_FORWARD_S = 1.0  # calibration: a size whose best forward takes this long is timed once (noise is a small share)


def available(model: nn.Module, kernel: str, threads: int | None = None,
              attn_implementation: str | None = RAGGED_ATTENTION) -> bool:
    """Whether ``kernel`` can run ``model`` here (stock always; split and fused on fp32 CPU with 2+ threads,
    ``threads`` being the forwards' intra-op threads (None: this thread's), fused being split where no
    q/k/v or gate/up group joins; onednn and packed on fp32 CPU with oneDNN; wmajor on fp32 CPU; rows on fp32 CPU
    with AVX2 where its kernel builds; gemv as fused, where its kernel builds and gives the stock bits for
    every Linear of ``model``; lean as gemv, for Llama-shaped layers, where its loop gives the gemv twin's bits).
    Every kernel but stock asks ``placement.model_ok`` first: a CUDA or half-precision model runs stock only."""
    if is_quantized(model):  # on the block kernel: its stock modules, or their lean loop where it gives their bits
        return kernel == STOCK or (kernel == LEAN_BLOCKS and blocks_lean_ok(
            model, functools.partial(_modules, model, STOCK, attn_implementation, None)))
    if kernel != STOCK and not model_ok(model):
        return False
    checks: dict[str, Callable[[], bool]] = {
        STOCK: lambda: True, SPLIT: lambda: splittable(model, threads), FUSED: lambda: splittable(model, threads),
        GEMV: lambda: splittable(model, threads) and gemv_ok(model),
        LEAN: lambda: lean_here(model, LEAN, threads),
        LEAN_DNN: lambda: packable(model) and lean_here(model, LEAN_DNN, threads),
        ONEDNN: lambda: packable(model),
        WMAJOR: lambda: weight_major_ok(model), ROWS: lambda: rows_ok(model), PACKED: lambda: packable(model),
        LEAN_BLOCKS: lambda: False}
    return checks[kernel]()


def lean_here(model: nn.Module, kernel: str, threads: int | None) -> bool:
    """Whether the ``kernel`` lean twin runs ``model``: fp32 CPU, 2+ threads, the GEMV's bits, and its loop's
    (``lean.lean_ok``, on the twin's own modules)."""
    return splittable(model, threads) and gemv_ok(model) and lean_ok(
        model, functools.partial(_modules, model, kernel, RAGGED_ATTENTION, threads), kernel)


def make_twin(model: nn.Module, kernel: str, attn_implementation: str | None, threads: int | None = None) -> nn.Module:
    """A copy of ``model``'s modules sharing every parameter and buffer with it.

    ``model`` keeps its kernels; for "fused" its q/k/v and gate/up parameters become row views of one
    joined storage each (``fused.fuse_weights``: the same values, and no second copy).

    ``kernel``: which Linear kernels the twin runs (``KERNELS``; ValueError where it cannot run);
    ``attn_implementation``: the twin's attention (e.g. ``ragged.RAGGED_ATTENTION``); None keeps the model's;
    ``threads``: the intra-op threads its forwards will run with (split and fused cut weights in as many
    row blocks; None: this thread's count).
    """
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; known: {KERNELS}")
    if not available(model, kernel, threads, attn_implementation):
        raise ValueError(f"the {kernel} kernel cannot run this model here (every kernel but stock: fp32 on the CPU, "
                         "placement.py; packed: with oneDNN; split: with 2+ intra-op threads)")
    twin = _modules(model, kernel, attn_implementation, threads)
    if kernel in (LEAN, LEAN_DNN):  # its loop over the twin's modules, with the steps lean_ok checked
        return LeanTwin.of(twin, lean_ops(model, lambda: twin, kernel)).eval()  # type: ignore[arg-type]
    if kernel == LEAN_BLOCKS:
        lean = quant_lean_twin(twin)
        if lean is None:
            raise ValueError("the block-kernel lean loop does not give this model's bits")
        return lean
    return twin


def _modules(model: nn.Module, kernel: str, attn_implementation: str | None, threads: int | None) -> nn.Module:
    """``make_twin``'s module copy with ``kernel``'s Linear layers (for "lean": the modules its loop runs)."""
    if kernel in (FUSED, GEMV, LEAN, LEAN_DNN, WMAJOR):
        fuse_weights(model)
    memo: dict[int, Any] = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    twin = copy.deepcopy(model, memo)  # only module objects (and the config) are duplicated
    if kernel == PACKED:
        pack_linears(twin)
    elif kernel == ONEDNN:
        onednn_linears(twin)
    elif kernel == SPLIT:
        split_linears(twin, split_parts(threads))
    elif kernel == FUSED:
        fuse_linears(twin, split_parts(threads))
    elif kernel == GEMV:
        fuse_linears(twin, split_parts(threads), one_row=gemv_product)
    elif kernel in (LEAN, LEAN_DNN):  # past one row: oneDNN, or the rows kernel where it is built
        many = onednn_product if kernel == LEAN_DNN else rows_product if rows_ok(model) else None
        fuse_linears(twin, split_parts(threads), one_row=gemv_product, many_rows=many)
    elif kernel == WMAJOR:
        fuse_linears(twin, weight_major=True)
    elif kernel == ROWS:
        rows_linears(twin)
    if attn_implementation is not None:
        twin.set_attn_implementation(attn_implementation)
    return twin.eval()


def interpolate(xs: Sequence[int], ys: Sequence[float], x: float) -> float:
    """y at ``x`` on the polyline through (xs, ys), xs ascending.

    Flat before xs[0]; past xs[-1] the last segment goes on (its slope floored at 0, so noise
    never makes a bigger forward cheaper). Example, xs = (1, 4, 8), ys = (1.0, 1.6, 3.0):
    x = 2 -> 1.2 (between 1 and 4); x = 12 -> 4.4 (slope 0.35 of 4..8 continued); x = 0 -> 1.0.
    """
    i = bisect.bisect_left(xs, x)
    if i < len(xs) and xs[i] == x:
        return ys[i]
    if i == 0:
        return ys[0]
    if i == len(xs):
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if len(xs) > 1 else 0.0
        return ys[-1] + max(slope, 0.0) * (x - xs[-1])
    lo = i - 1
    return ys[lo] + (ys[i] - ys[lo]) * (x - xs[lo]) / (xs[i] - xs[lo])


@dataclass(frozen=True)
class CostCurve:
    """Seconds per forward against tokens per forward, for each kernel measured.

    Example: token_counts (1, 8), seconds {"stock": (0.030, 0.070), "packed": (0.040, 0.050)}:
    cost(1) = 0.030 (stock); cost(8) = 0.050 (packed); best(3) = "stock" (0.0414 vs 0.0429),
    best(4) = "packed" (0.0443 vs 0.0471); marginal(1) = cost(2) - cost(1) = 0.0357 - 0.030;
    describe(curve) = "stock<=3<packed".
    """

    token_counts: tuple[int, ...]  # tokens per forward measured, ascending
    seconds: Mapping[str, tuple[float, ...]]  # kernel name -> seconds per forward at each count

    def __post_init__(self) -> None:
        counts = tuple(int(n) for n in self.token_counts)
        if not counts or list(counts) != sorted(set(counts)):
            raise ValueError("token_counts must be non-empty, ascending and distinct")
        if not self.seconds:
            raise ValueError("a cost curve needs at least one kernel")
        seconds = {k: tuple(float(s) for s in v) for k, v in self.seconds.items()}
        if any(len(v) != len(counts) for v in seconds.values()):
            raise ValueError("every kernel needs one time per token count")
        object.__setattr__(self, "token_counts", counts)
        object.__setattr__(self, "seconds", MappingProxyType(seconds))

    @property
    def kernels(self) -> list[str]:
        """Kernel names, in the order they were measured (ties go to the first)."""
        return list(self.seconds)

    def cost(self, n: int, kernel: str | None = None) -> float:
        """Seconds of a forward of ``n`` tokens with ``kernel`` (None: the cheapest kernel at ``n``)."""
        if kernel is None:
            return min(self.cost(n, k) for k in self.seconds)
        return interpolate(self.token_counts, self.seconds[kernel], n)

    def best(self, n: int) -> str:
        """The kernel with the cheapest forward of ``n`` tokens (the first listed on a tie)."""
        return min(self.seconds, key=lambda k: self.cost(n, k))

    def marginal(self, n: int) -> float:
        """Seconds one more token adds to a forward of ``n``: cost(n + 1) - cost(n), cheapest kernel each."""
        return self.cost(n + 1) - self.cost(n)

    def only(self, kernels: Sequence[str]) -> CostCurve:
        """The same curve restricted to ``kernels``."""
        return CostCurve(self.token_counts, {k: self.seconds[k] for k in kernels})

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (``from_dict`` reads it back)."""
        return {"token_counts": list(self.token_counts), "seconds": {k: list(v) for k, v in self.seconds.items()}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CostCurve:
        return cls(tuple(data["token_counts"]), {k: tuple(v) for k, v in data["seconds"].items()})


def settled(samples: Mapping[str, Sequence[Sequence[float]]], clear_loss: float, long_s: float) -> set[tuple[str, int]]:
    """(kernel, count index) pairs whose first timing already decides: the kernel lost by over
    ``clear_loss`` x, or the count's best forward took ``long_s`` or more. Example: a (0.010, 2.0),
    b (0.030, 2.5) with clear_loss 1.5, long_s 1.0 -> {("b", 0), ("a", 1), ("b", 1)}."""
    out: set[tuple[str, int]] = set()
    for i in range(len(next(iter(samples.values())))):
        first = {k: s[i][0] for k, s in samples.items()}
        best = min(first.values())
        out |= {(k, i) for k, t in first.items() if best >= long_s or t > clear_loss * best}
    return out


def measure(
    probes: Mapping[str, Callable[[int], None]],
    token_counts: Sequence[int],
    repeats: int,
    warmup: int,
    clock: Callable[[], float] = time.perf_counter,
    clear_loss: float = CLEAR_LOSS,
    long_s: float = LONG_FORWARD_S,
) -> CostCurve:
    """Fastest seconds of ``probes[kernel](n)`` (one forward of n tokens) for every kernel and count.

    Each repetition runs every count with every kernel back to back (first kernel alternating), so
    machine noise hits all kernels alike; the first ``warmup`` repetitions are not timed. Example:
    probes {"a", "b"}, counts (1, 8), repeats 3, warmup 1 -> calls a1 b1 a8 b8 | b1 a1 b8 a8 | ...
    (4 repetitions), and seconds["a"][0] is the fastest of a1's three timed calls: on a shared machine
    other work only ever adds time, so the minimum is the least noisy estimate of a kernel's own cost.
    Repeats are spent only where they can change the choice: after the first timed repetition a kernel
    whose call took over ``clear_loss`` x the best at that count, and every kernel at a count whose best
    call took ``long_s`` or more, keep that one timing (a 1.5B model's 256-token forwards take seconds).
    """
    if not probes or repeats < 1 or warmup < 0:
        raise ValueError("need at least one probe, repeats >= 1 and warmup >= 0")
    counts = sorted(set(token_counts))
    names = list(probes)
    samples: dict[str, list[list[float]]] = {k: [[] for _ in counts] for k in names}
    timed_once: set[tuple[str, int]] = set()  # (kernel, count index) not timed again
    for rep in range(warmup + repeats):
        order = names if rep % 2 == 0 else names[::-1]
        for i, n in enumerate(counts):
            for name in order:
                if (name, i) in timed_once:
                    continue
                t0 = clock()
                probes[name](n)
                elapsed = clock() - t0
                if rep >= warmup:
                    samples[name][i].append(elapsed)
        if rep == warmup:
            timed_once = settled(samples, clear_loss, long_s)
    return CostCurve(tuple(counts), {k: tuple(min(s) for s in samples[k]) for k in names})


def keep(measured: CostCurve, copies: frozenset[str] = COPIES, min_gain: float = COPY_MIN_GAIN) -> list[str]:
    """The kernels that win at some measured count, a copying twin's (``copies``) seconds weighed
    (1 + ``min_gain``) times: its second copy of the weights is kept only where it saves that much.

    The one-token forward (every step of plain decoding) is always run by the fastest ``EXACT`` kernel
    held (``one_token``), so that one is kept too.
    Example: at (1, 8) stock (1.0, 5.0), packed (2.0, 4.7): packed's 4.7 weighs 5.17 > 5.0 -> ["stock"].
    """
    weighed = CostCurve(measured.token_counts, {k: tuple(s * (1.0 + min_gain) for s in v) if k in copies else v
                                                for k, v in measured.seconds.items()})
    winners = {weighed.best(n) for n in measured.token_counts if n > 1} | {one_token(measured)}
    return [k for k in measured.kernels if k in winners]


def one_token(curve: CostCurve) -> str:
    """The kernel for one-token forwards: the cheapest ``EXACT`` one (plain decoding's own arithmetic, so
    speculation off gives plain greedy's tokens bit for bit), or the cheapest of all where none is held."""
    exact = [k for k in curve.kernels if k in EXACT]
    return min(exact, key=lambda k: curve.cost(1, k)) if exact else curve.best(1)


def describe(curve: CostCurve) -> str:
    """Which kernel wins where, over 1..the last count measured.

    Example: stock cheapest at 1..3 tokens, packed from 4 on -> "stock<=3<packed".
    """
    names = [curve.best(n) for n in range(1, curve.token_counts[-1] + 1)]
    out = names[0]
    for n in range(1, len(names)):
        if names[n] != names[n - 1]:
            out += f"<={n}<{names[n]}"  # names[n] is the winner at n + 1 tokens
    return out


class KernelSet:
    """Twins of one model by kernel name, and the measured choice between them.

    "stock" is always there; "split" too on an fp32 CPU model with 2+ threads, "packed" on an fp32 CPU
    model with oneDNN (GPU and half-precision models: "stock" only). Before ``calibrate`` (or with one
    twin) ``runner`` gives "stock" (the only twin when there is one). Build and calibrate before sharing
    across threads; ``runner`` only reads.
    """

    def __init__(
        self, model: nn.Module, attn_implementation: str | None = None, kernels: Sequence[str] = SHARING,
        threads: int | None = None,
    ) -> None:
        unknown = set(kernels) - set(KERNELS)
        if unknown:
            raise ValueError(f"unknown kernels {sorted(unknown)}; known: {KERNELS}")
        # ``threads``: the forwards' intra-op threads. A serving process builds the set on a one-thread thread
        # for an engine thread that runs with more (lookahead_core.threads), and split/fused need the latter
        wanted = [k for k in KERNELS if k in kernels and available(model, k, threads, attn_implementation)] or [STOCK]
        for lean, products in SUPERSEDED.items():
            if lean in kernels and lean not in wanted:  # the loop is refused: the kernels it supersedes, where they run
                wanted = sorted({*wanted, *(k for k in products if available(model, k, threads))}, key=KERNELS.index)
        self.attn_implementation = attn_implementation
        self._twins = {k: make_twin(model, k, attn_implementation, threads) for k in wanted}
        self.measured: CostCurve | None = None  # every kernel's measurement (None until calibrated)
        self.curve: CostCurve | None = None  # the kept kernels' curve: what ``runner`` and budgets use

    @property
    def names(self) -> list[str]:
        """Kernels held (after ``calibrate``: those that won at some measured count)."""
        return list(self._twins)

    @property
    def twins(self) -> Mapping[str, nn.Module]:
        """Read-only view of the twins by kernel name."""
        return MappingProxyType(self._twins)

    def calibrate(
        self,
        probe: Callable[[nn.Module, int], None],
        token_counts: Sequence[int],
        repeats: int,
        warmup: int = 1,
        clock: Callable[[], float] = time.perf_counter,
    ) -> CostCurve:
        """Time ``probe(twin, n)`` for every twin, keep the curve, drop twins that win at no count.

        ``probe`` runs one forward of n tokens through the module it is given (the engine's is a
        ragged forward over a cache (``probe.RaggedProbe``)). Returns the kept curve.
        """
        probes = {k: functools.partial(probe, twin) for k, twin in self._twins.items()}
        self.measured = measure(probes, token_counts, repeats, warmup, clock)
        del probes  # they hold every twin: the dropped ones must be freed before ``release_freed``
        kept = keep(self.measured)
        self._twins = {k: t for k, t in self._twins.items() if k in kept}
        self.curve = self.measured.only(list(self._twins))
        release_freed()  # the dropped twins' packed weights go back to the system, not to malloc's free lists
        return self.curve

    def runner(self, n_tokens: int) -> nn.Module:
        """The twin to run a forward of ``n_tokens`` tokens with."""
        if len(self._twins) == 1:
            return next(iter(self._twins.values()))
        if self.curve is None:
            return self._twins[STOCK]
        return self._twins[one_token(self.curve) if n_tokens == 1 else self.curve.best(n_tokens)]

    def describe(self) -> str:
        """E.g. "stock<=3<packed" (calibrated), "packed" (one kernel), "stock|packed" (not calibrated);
        "onednn<=3<packed, 1 token: split" where the one-token kernel is not the cheapest at one token."""
        if self.curve is None:
            return "|".join(self._twins)
        single = one_token(self.curve)
        return describe(self.curve) + ("" if single == self.curve.best(1) else f", 1 token: {single}")
