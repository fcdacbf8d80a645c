"""Forward cost against the number of tree tokens, the decoding length it calls for, and the forward
against the memory-bandwidth floor.

    python -m lookahead_rag.bench.forward_cost --model smollm2-135m-instruct --kernels stock,split,fused,packed

prints, per kernel, the forward's ms at each size (every kernel timed interleaved in one process, so
load on a shared box hits them alike), the one-token forward against its floor (weights + KV read /
the read bandwidth measured with the same threads before and after), and resident memory after the
kernels are built and calibrated (the packed kernel holds a second copy of the weights).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from lookahead_core.engine.budget import expected_tokens
from lookahead_core.forward.backend.kv_dtype import AUTO, KV_DTYPES, cache_dtype
from lookahead_core.forward.bandwidth import floor_seconds, kv_bytes_per_entry, read_bandwidth, weight_bytes
from lookahead_core.forward.kernels import SHARING, CostCurve, KernelSet
from lookahead_core.forward.memory import resident
from lookahead_core.forward.probe import RaggedProbe
from lookahead_core.forward.quant.load import weight_format
from lookahead_core.forward.ragged import RAGGED_ATTENTION
from lookahead_core.kv.kvstore import KVShape
from lookahead_core.models import load_model

from lookahead_rag.bench.common import MODEL_HELP, add_placement_args, placement, print_table

TREE_SIZES = (1, 2, 4, 8, 12, 16, 20, 24, 32, 40, 48, 64)  # tokens per verification forward measured
REPEATS = 7  # timed forwards per kernel and size; the fastest is kept (one untimed round first)
FLOOR_SIZES = (1, 8, 16)  # forward sizes the floor report times (the one-token step and typical trees)
FLOOR_PAST = 256  # cache entries behind the timed forwards (a RAG prompt)
MIB = 1 << 20  # bytes per MiB in the report


def measure_forward_cost(
    kernels: KernelSet, past_len: int, sizes: Sequence[int] = TREE_SIZES, repeats: int = REPEATS
) -> CostCurve:
    """Calibrate ``kernels`` on the engine's forwards of each size over a ``past_len``-token cache.

    Every kernel is timed (``kernels.measured``, seconds); the returned curve holds the kernels kept,
    the cheapest of which runs each forward.
    """
    shape = KVShape.of(next(iter(kernels.twins.values())))
    return kernels.calibrate(RaggedProbe(shape, past_len), sizes, repeats)


def choose_decoding_length(curve: CostCurve, paths: Sequence[Sequence[int]]) -> tuple[int, dict[int, Any]]:
    """The draft budget maximizing expected tokens per millisecond, from measured costs and acceptances.

    A tree of budget D runs D + 1 tokens (root included); ``paths`` are the accepted paths of a run
    with the widest budget (best-first trees: smaller budgets are prefixes, see budget.py).
    """
    max_budget = curve.token_counts[-1] - 1
    tokens = expected_tokens(paths, max_budget)
    table = {}
    for budget in range(max_budget + 1):
        ms = curve.cost(budget + 1) * 1000.0
        table[budget] = {"tokens_per_step": tokens[budget], "ms_per_step": ms, "tokens_per_ms": tokens[budget] / ms}
    best = max(table, key=lambda b: table[b]["tokens_per_ms"])
    return best, table


def floor_report(model: torch.nn.Module, kernels: Sequence[str], sizes: Sequence[int], repeats: int,
                 past: int, kv_dtype: str = AUTO) -> dict[str, Any]:
    """Time ``kernels`` (interleaved) at ``sizes`` over ``past`` cached entries of ``kv_dtype`` (the engine's
    choice: ``kv_dtype.cache_dtype``), beside the bandwidth floor of a one-token forward measured before and
    after, and resident memory once the kept twins are built."""
    before = read_bandwidth()
    ks = KernelSet(model, RAGGED_ATTENTION, kernels)
    built = resident()
    stock = KVShape.of(model)
    shape = replace(stock, dtype=cache_dtype(model, kv_dtype))  # the served engine's request caches
    curve = ks.calibrate(RaggedProbe(shape, past, stock.dtype), sizes, repeats)
    after = read_bandwidth()
    nbytes = weight_bytes(model) + (past + 1) * kv_bytes_per_entry(model)  # a one-token step's reads
    slow, fast = sorted((before, after), key=lambda b: b.bytes_per_s)
    measured = ks.measured or curve  # every kernel's times (the kept curve if nothing was dropped)
    return {
        "threads": torch.get_num_threads(), "sizes": list(sizes), "past": past,
        "read_gb_per_s": [before.gb_per_s, after.gb_per_s], "bytes_one_token": nbytes,
        "floor_ms": [1000.0 * floor_seconds(nbytes, fast), 1000.0 * floor_seconds(nbytes, slow)],
        "measured_ms": {k: [1000.0 * s for s in v] for k, v in measured.seconds.items()},
        "kept": ks.describe(), "best_one_token_ms": 1000.0 * curve.cost(1),
        "rss_mib": {"built": built.total / MIB, "calibrated": resident().total / MIB,
                    "calibrated_anon": resident().anon / MIB, "calibrated_file": resident().file / MIB},
    }


def print_floor(name: str, report: dict[str, Any]) -> None:
    """One row per kernel: ms at each size, and the one-token forward over the floor's range."""
    lo, hi = report["floor_ms"]
    print(f"\n{name}: {report['threads']} threads, one-token reads {report['bytes_one_token'] / 1e6:.0f} MB, "
          f"read bandwidth {report['read_gb_per_s'][0]:.1f} / {report['read_gb_per_s'][1]:.1f} GB/s (before / after), "
          f"floor {lo:.1f}-{hi:.1f} ms; kept {report['kept']}; RSS {report['rss_mib']['calibrated']:.0f} MiB "
          f"(anon {report['rss_mib']['calibrated_anon']:.0f}, file {report['rss_mib']['calibrated_file']:.0f})")
    rows = [{"kernel": k, **{f"ms{n}": ms[i] for i, n in enumerate(report["sizes"])},
             "x_floor": ms[0] / lo} for k, ms in report["measured_ms"].items()]
    print_table(rows, [("kernel", "kernel", "s"), *[(f"ms{n}", f"{n} tok ms", ".1f") for n in report["sizes"]],
                       ("x_floor", "1 tok / floor", ".2f")])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="forward_cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct", help=MODEL_HELP)
    p.add_argument("--kernels", default=",".join(SHARING), help="kernels to time, comma-separated (packed too: "
                   "its second copy of the weights shows in RSS)")
    p.add_argument("--sizes", default=",".join(map(str, FLOOR_SIZES)), help="tokens per forward, comma-separated")
    p.add_argument("--repeats", type=int, default=REPEATS, help="timed rounds (the fastest is kept)")
    p.add_argument("--past", type=int, default=FLOOR_PAST, help="cached entries behind each forward")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    p.add_argument("--json", default=None, help="write the report here")
    p.add_argument("--kv-dtype", default=AUTO, choices=KV_DTYPES, help="the caches' dtype, as [generator] kv_dtype "
                   "(auto: half on the block kernel)")
    add_placement_args(p)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, _ = load_model(args.model, **placement(args))
    report = {"model": args.model, "weights": weight_format(model), "rss_mib_loaded": resident().total / MIB,
              **floor_report(model, args.kernels.split(","), [int(n) for n in args.sizes.split(",")],
                             args.repeats, args.past, args.kv_dtype)}
    print_floor(f"{args.model} ({report['weights']})", report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


def print_cost(measured: CostCurve, curve: CostCurve) -> None:
    """ms per forward of every kernel timed, and the chosen one's cost relative to a 1-token forward."""
    rows = [{"q": q, **{k: measured.cost(q, k) * 1000.0 for k in measured.kernels},
             "best": curve.best(q), "rel": curve.cost(q) / curve.cost(1)} for q in measured.token_counts]
    print_table(rows, [("q", "tree tokens", "d"), *[(k, f"{k} ms", ".1f") for k in measured.kernels],
                       ("best", "runs", "s"), ("rel", "x 1-token", ".2f")])


if __name__ == "__main__":
    raise SystemExit(main())
