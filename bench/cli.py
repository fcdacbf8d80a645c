"""The ``lookahead-rag-bench`` command: the benchmarks, each in its own module (see bench/README.md)."""

from __future__ import annotations

import sys

from services.cli import dispatch

# subcommand -> (module exposing main(argv: list[str]) -> int, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "decoding": ("bench.decoding", "decoding benchmark: greedy vs prompt-lookup vs lookahead modes"),
    "serve": ("bench.serve", "serving benchmark: closed-loop clients, speculation on vs off vs serial HF"),
    "events": ("bench.events", "Kafka feedback-loop benchmark: lag, lost and double-applied events"),
    "retrieval": ("bench.retrieval", "retrieval latency: p50/p99 of embedding a question + searching a flat index"),
}


def main(argv: list[str] | None = None) -> int:
    return dispatch("lookahead-rag-bench", COMMANDS, argv)


if __name__ == "__main__":
    sys.exit(main())
