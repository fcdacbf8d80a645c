"""The engine on an accelerator (or any device) beside plain transformers, in one process, same prompts.

    lookahead-rag-bench device --model smol.gguf --device cuda --dtypes float32,bfloat16 \\
        --requests recorded.json --single 16 --serve 48 --running 16 --max-new 128 --budget-s 540 \\
        --json results/device_h200.json

For each dtype: the step cost by width (the engine's measured curve beside HF's own forward over a 512-entry
cache); a single stream over ``--single`` distinct prompts (HF generate, HF prompt lookup, the engine one token
a step and with speculation, then a repeat pass over a trie the first filled); ``--serve`` prompts with
``--running`` at a time (the engine on and off against HF static batching of the same size); in half
precision the same single stream with ``[generator] exact_numerics`` (own one-token equality, and its cost).
Equality is against batch-1 HF greedy on the same device and dtype. Sections past ``--budget-s`` are skipped
(recorded as such) so a run fits a lent machine's time. Prompts: a ``bench serve --record`` file's prompt ids,
else the bundled questions grounded on their own paragraph. Writes JSON and a PNG (``device_plot.py``).

The command line (the benchmark itself: bench/device.py, imported only to run: ``--help`` loads no torch).
"""

from __future__ import annotations

import argparse

from lookahead_rag.bench.common import MODEL_HELP, add_placement_args

WIDTHS = "1,2,4,8,16,32,64,128,256"  # forward widths whose cost is measured (--widths)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lookahead-rag-bench device", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct", help=MODEL_HELP)
    add_placement_args(p, device="auto")
    p.add_argument("--dtypes", default="", help="comma-separated dtypes to run in turn (default: --dtype)")
    p.add_argument("--backend", default="auto", choices=("auto", "cpu", "generic"), help="the engine's backend")
    p.add_argument("--requests", default="", help="a bench serve --record file whose prompt ids are replayed")
    p.add_argument("--single", type=int, default=16, help="distinct prompts of the single-stream runs")
    p.add_argument("--serve", type=int, default=48, help="prompts of the batched runs")
    p.add_argument("--running", type=int, default=16, help="requests at a time (the engine and HF's batches)")
    p.add_argument("--widths", default=WIDTHS, help="forward widths whose cost is measured, comma-separated")
    p.add_argument("--max-new", type=int, default=128, help="new tokens per answer")
    p.add_argument("--tile-rows", type=int, default=32, help="exact_numerics: rows of a forward tile")
    p.add_argument("--slot-tokens", type=int, default=2048, help="generic backend: KV entries of a pool slot")
    p.add_argument("--budget-s", type=float, default=540.0, help="sections starting past this are skipped")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--json", default="bench/results/device.json", help="write results here")
    p.add_argument("--png", default=None, help="plot here (default: next to --json)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from lookahead_rag.bench.device import run  # torch and the engine: only once a run starts

    return run(args)
