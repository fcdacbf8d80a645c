"""The ``lookahead-rag`` command: a thin dispatcher; each subcommand lives in its own module.

Modules are imported only when their command runs, so ``lookahead-rag broker`` does not pay for
importing torch, and each module owns its own argument parser (``main(argv) -> int``).
"""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module exposing main(argv: list[str]) -> int, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("services.demo", "all services in one process: ask the bundled questions, watch answers stream"),
    "bench": ("bench.decoding", "decoding benchmark: greedy vs prompt-lookup vs lookahead modes"),
    "serve": ("services.serve", "run retriever | draftcache | generator | all as gRPC services"),
    "ingest": ("services.retriever.ingest_cli", "ingest JSONL / text / markdown files for a tenant"),
    "ask": ("services.generator.ask", "ask a running generator; the answer streams to the terminal"),
    "broker": ("services.common.broker", "start the bundled tansu Kafka-compatible broker (memory storage)"),
    "bench-serve": ("bench.serve", "serving benchmark: closed-loop clients, speculation on vs off vs serial HF"),
    "bench-events": ("bench.events", "Kafka feedback-loop benchmark: lag, lost and double-applied events"),
    "config": ("services.common.config_cli", "show the effective configuration"),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: lookahead-rag COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"lookahead-rag: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
