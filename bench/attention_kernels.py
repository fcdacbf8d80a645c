"""The attention of a step's segments side by side: sdpa (segment by segment, as a one-token forward runs it)
against the multi-row kernel's builds (every segment of the layer in one call), interleaved in one process.

    python -m lookahead_rag.bench.attention_kernels --model smollm2-135m-instruct --threads 2 \
        --json results/attention_kernels.json

Each case is what one forward's attention does in every layer of the model: a draft tree over a RAG prompt's
cache, a prompt chunk, or 16 requests' trees beside each other (each layer its own keys and values, as a
request's cache is, so the 16-request cases read theirs from memory). The model gives the heads, kv heads,
head_dim and layers; no weights are read. Each round times every way once at a case, so a shared host's load
hits them alike; the fastest round is kept. Prints a table, writes JSON and a PNG (bars with value labels;
baseline: sdpa).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from lookahead_core.forward.attend import EXTENSION, EXTENSION_512, Attend, builds, sdpa_segments
from lookahead_core.models import resolve_model_path
from transformers import AutoConfig

from lookahead_rag.bench.attention_kernels_plot import BASELINE
from lookahead_rag.bench.common import cpu_name, kernel_parser, machine, parse_kernel_args, print_table
from lookahead_rag.bench.plot import write_outputs

REPEATS = 5  # timed rounds per case; the fastest is kept (one untimed round first)
BUILD_NAMES = {EXTENSION: "avx2", EXTENSION_512: "avx512"}  # the kernel's builds by their extension module names


@dataclass(frozen=True)
class Case:
    """One forward's segments: ``requests`` requests of ``rows`` new rows each over ``past`` cached entries."""

    name: str
    rows: int  # new rows of each request (a tree's tokens, a chunk's)
    past: int  # entries each request has cached before them
    requests: int = 1  # requests in the forward
    causal: bool = False  # a prompt chunk (lower-triangular) rather than a chain-shaped tree


CASES = (
    Case("tree 4 over 600", 4, 600), Case("tree 8 over 600", 8, 600), Case("tree 16 over 600", 16, 600),
    Case("tree 32 over 600", 32, 600), Case("chunk 64 over 256", 64, 256, causal=True),
    Case("chunk 183 over 400", 183, 400, causal=True), Case("chunk 256 over 300", 256, 300, causal=True),
    Case("16 x 1 row over 600", 1, 600, 16), Case("16 x tree 5 over 600", 5, 600, 16),
)

# a layer's segments, each (q, keys, values, past, visible, out)
Segments = list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor, torch.Tensor]]
Way = Callable[[Segments, float], None]


def in_one_call(attend: Attend) -> Way:
    """A layer's segments by ``attend`` (``attend_segments``' contract: sdpa's loops over them, a build's kernel
    takes them in one call)."""
    def run(segs: Segments, scale: float) -> None:
        qs, keys, values, pasts, seen, outs = map(list, zip(*segs, strict=True))
        attend(qs, keys, values, pasts, seen, scale, outs)
    return run


def ways() -> dict[str, Way]:
    """The ways to time, by name: sdpa segment by segment, and each build of the kernel this CPU makes."""
    found: dict[str, Way] = {BASELINE: in_one_call(sdpa_segments)}
    for ext in builds():
        found[BUILD_NAMES[ext.__name__]] = in_one_call(ext.attend_segments)
    return found


def visible(case: Case) -> torch.Tensor:
    """[rows, rows] bool: a chunk sees its earlier rows; a tree here is two chains under its root (node i's
    parent is i - 2, the first two hang from the root), each node seeing itself and its ancestors."""
    seen = torch.eye(case.rows, dtype=torch.bool)
    for i in range(1, case.rows):
        parent = i - 1 if case.causal else max(i - 2, 0)
        seen[i] |= seen[parent]
    return seen


def layer_segments(case: Case, heads: int, kv_heads: int, head_dim: int, layers: int) -> list[Segments]:
    """Each layer's segments for ``case`` (random queries and caches; every layer and request its own)."""
    gen = torch.Generator().manual_seed(0)
    seen = visible(case)
    return [[(torch.randn(1, heads, case.rows, head_dim, generator=gen),
              *(torch.randn(1, kv_heads, case.past + case.rows, head_dim, generator=gen) for _ in range(2)),
              case.past, seen, torch.empty(case.rows, heads * head_dim)) for _ in range(case.requests)]
            for _ in range(layers)]


def time_cases(timed: dict[str, Way], cases: Sequence[Case], heads: int, kv_heads: int, head_dim: int, layers: int,
               repeats: int) -> dict[str, dict[str, float]]:
    """ms of one forward's attention (every layer) for each way at each case (the fastest of ``repeats`` rounds)."""
    scale = 1.0 / math.sqrt(head_dim)
    best: dict[str, dict[str, float]] = {name: {} for name in timed}
    with torch.inference_mode():
        for case in cases:
            segs = layer_segments(case, heads, kv_heads, head_dim, layers)
            for rnd in range(repeats + 1):
                for name, way in timed.items():
                    started = time.perf_counter()
                    for layer in segs:
                        way(layer, scale)
                    ms = (time.perf_counter() - started) * 1000.0
                    if rnd:  # round 0 warms caches and builds
                        best[name][case.name] = min(best[name].get(case.name, ms), ms)
    return best


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_kernel_args(kernel_parser("attention_kernels", __doc__, REPEATS), argv)
    cfg = AutoConfig.from_pretrained(resolve_model_path(args.model))
    heads, layers = cfg.num_attention_heads, cfg.num_hidden_layers
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    ms = time_cases(ways(), CASES, heads, kv_heads, head_dim, layers, args.repeats)
    rows = [{"case": c.name, **{name: ms[name][c.name] for name in ms}} for c in CASES]
    for row in rows:
        kernels = [row[name] for name in ms if name != BASELINE]
        if kernels:
            row["speedup"] = row[BASELINE] / min(kernels)
    print_table(rows, [("case", "case", "s"), *((name, f"{name} ms", ".2f") for name in ms),
                       ("speedup", f"{BASELINE} / best kernel", ".2f")])
    data = {"kind": "attention_kernels", "model": args.model, "threads": torch.get_num_threads(), "cpu": cpu_name(),
            "machine": machine(), "capability": torch.backends.cpu.get_cpu_capability(),
            "shape": {"heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "layers": layers},
            "cases": [c.name for c in CASES],
            "ms": {name: {k: round(v, 3) for k, v in by.items()} for name, by in ms.items()}}
    if args.json:
        write_outputs(data, args.json, args.png)  # says what it wrote
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
