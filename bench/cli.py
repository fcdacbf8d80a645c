"""The ``lookahead-rag-bench`` command: the benchmarks, each in its own module (see bench/README.md)."""

from __future__ import annotations

import sys

from services.cli import dispatch

# subcommand -> (module exposing main(argv: list[str]) -> int, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "decoding": ("bench.decoding_args", "decoding benchmark: greedy vs prompt-lookup vs lookahead modes"),
    "serve": ("bench.serve_args", "serving benchmark: closed-loop clients, speculation on vs off vs serial HF"),
    "events": ("bench.events", "Kafka feedback-loop benchmark: lag, lost and double-applied events"),
    "retrieval": ("bench.retrieval_args", "retrieval latency: p50/p99 of embedding a question + a flat-index search"),
    "draft-agreement": ("bench.draft_agreement_args", "early-exit self-draft: top-1 agreement and cost per exit layer"),
    "prompt-order": ("bench.prompt_order_args",
                     "passage order: prefix-cache hits and SQuAD EM/F1, canonical vs score order"),
    "exactness": ("bench.exactness_args",
                  "exactness: engine answers vs HF greedy, batched and from the prefix cache, with logit margins"),
    "plot": ("bench.plot", "redraw a benchmark's PNG from its JSON (no benchmark is run)"),
}


def main(argv: list[str] | None = None) -> int:
    return dispatch("lookahead-rag-bench", COMMANDS, argv)


if __name__ == "__main__":
    sys.exit(main())
