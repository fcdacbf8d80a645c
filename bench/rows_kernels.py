"""The tree kernels side by side: every product of a model by the AVX2 rows kernel, the AVX-512 one and
stock ``F.linear``, at each number of rows, interleaved in one process.

    python -m lookahead_rag.bench.rows_kernels --model smollm2-135m-instruct --sizes 1,2,4,8,16,32,64 \
        --threads 2 --json results/rows_kernels.json

A tree forward multiplies every weight of the model by its rows; this times exactly those products (each
``nn.Linear`` of the model once, the lm_head included) with nothing around them, so the kernels compare
alone. Each round times every kernel once at a size, so a shared host's load hits them alike; the fastest
round is kept. The AVX-512 kernel is timed where torch reports an AVX-512 CPU. Prints a table, writes JSON
and a PNG (bars with value labels; baseline: the AVX2 kernel).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from lookahead_core.forward.rows import avx2_extension, avx512_extension
from lookahead_core.models import load_model
from torch import nn

from lookahead_rag.bench.common import cpu_name, kernel_parser, machine, parse_kernel_args, print_table
from lookahead_rag.bench.plot import write_outputs
from lookahead_rag.bench.rows_kernels_plot import BASELINE

SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 64)  # rows per product timed
REPEATS = 5  # timed rounds per size; the fastest is kept (one untimed round first)
Product = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


def kernels() -> dict[str, Product]:
    """The products to time, by name: the rows kernels this CPU builds, and stock ``F.linear``."""
    found: dict[str, Product] = {"stock": F.linear}
    for name, build in (("avx2", avx2_extension), ("avx512", avx512_extension)):
        ext = build()
        if ext is not None:
            found[name] = ext.rows_linear
    return found


def weights(model: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """Every Linear layer's (weight [out, in], bias [out] or None), in module order."""
    return [(m.weight.detach(), None if m.bias is None else m.bias.detach())
            for m in model.modules() if isinstance(m, nn.Linear)]


def time_sizes(products: dict[str, Product], layers: list[tuple[torch.Tensor, torch.Tensor | None]],
               sizes: Sequence[int], repeats: int) -> dict[str, dict[int, float]]:
    """ms for one pass over ``layers`` by each product at each size (the fastest of ``repeats`` rounds)."""
    widths = sorted({w.shape[1] for w, _ in layers})
    best: dict[str, dict[int, float]] = {name: {} for name in products}
    with torch.inference_mode():
        for m in sizes:
            xs = {k: torch.randn(m, k) for k in widths}  # [m, in] for every in_features
            for rnd in range(repeats + 1):
                for name, product in products.items():
                    started = time.perf_counter()
                    for w, b in layers:
                        product(xs[w.shape[1]], w, b)
                    ms = (time.perf_counter() - started) * 1000.0
                    if rnd:  # round 0 warms caches and builds
                        best[name][m] = min(best[name].get(m, ms), ms)
    return best


def main(argv: Sequence[str] | None = None) -> int:
    p = kernel_parser("rows_kernels", __doc__, REPEATS)
    p.add_argument("--sizes", default=",".join(map(str, SIZES)), help="rows per product, comma-separated")
    args = parse_kernel_args(p, argv)
    model, _ = load_model(args.model)
    sizes = [int(n) for n in args.sizes.split(",")]
    ms = time_sizes(kernels(), weights(model), sizes, args.repeats)
    rows = [{"rows": m, **{name: ms[name][m] for name in ms}} for m in sizes]
    for row in rows:
        if "avx512" in row and BASELINE in row:
            row["speedup"] = row[BASELINE] / row["avx512"]
    print_table(rows, [("rows", "rows", "d"), *((name, f"{name} ms", ".1f") for name in ms),
                       ("speedup", f"{BASELINE} / avx512", ".2f")])
    data = {"kind": "rows_kernels", "model": args.model, "threads": torch.get_num_threads(), "cpu": cpu_name(),
            "machine": machine(), "capability": torch.backends.cpu.get_cpu_capability(), "sizes": sizes,
            "ms": {name: {str(m): round(v, 3) for m, v in by.items()} for name, by in ms.items()}}
    if args.json:
        write_outputs(data, args.json, args.png)  # says what it wrote
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
