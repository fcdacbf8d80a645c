"""The ``lookahead-rag`` command: a thin dispatcher; each subcommand lives in its own module.

Modules are imported only when their command runs, so ``lookahead-rag broker`` does not pay for
importing torch, and each module owns its own argument parser (``main(argv) -> int``). The
benchmarks have their own command, ``lookahead-rag-bench`` (``lookahead_rag.bench.cli``), built on ``dispatch``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "lookahead-rag"  # the installed distribution whose version --version prints

# subcommand -> (module exposing main(argv: list[str]) -> int, one-line help)
PKG = "lookahead_rag.services"  # where the command modules live
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": (f"{PKG}.demo", "all services in one process: ask the bundled questions, watch answers stream"),
    "serve": (f"{PKG}.serve", "run retriever | draftcache | generator | all as gRPC services"),
    "ingest": (f"{PKG}.retriever.ingest_cli", "ingest JSONL / text / markdown files for a tenant"),
    "ask": (f"{PKG}.generator.ask", "ask a running generator; the answer streams to the terminal"),
    "broker": (f"{PKG}.events.kafka.broker", "start the bundled tansu Kafka-compatible broker (memory storage)"),
    "config": (f"{PKG}.config_cli", "show the effective configuration"),
    "keys": (f"{PKG}.keys_cli", "add, list or revoke the API keys that bind callers to tenants"),
    "models": (f"{PKG}.models_cli", "list the built-in models; fetch (download, check, convert) one"),
    "kernels": (f"{PKG}.kernels_cli", "compile the C++ kernels once per machine (make setup runs it)"),
}


def _usage(prog: str, commands: Mapping[str, tuple[str, str]]) -> str:
    width = max(map(len, commands))
    lines = [f"usage: {prog} COMMAND [ARGS...] | --version", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {help_}" for name, (_, help_) in commands.items()]
    return "\n".join(lines)


def distribution_version() -> str:
    """The installed lookahead-rag version, or "unknown" when run from a tree that was never installed."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown"


def dispatch(prog: str, commands: Mapping[str, tuple[str, str]], argv: list[str] | None = None) -> int:
    """Run ``commands[argv[0]]``'s module ``main(argv[1:])``; usage on -h, exit 2 on an unknown command."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(_usage(prog, commands))
        return 0 if args else 2
    if args[0] == "--version":
        print(f"{prog} {distribution_version()}")
        return 0
    name, rest = args[0], args[1:]
    if name not in commands:
        print(f"{prog}: unknown command {name!r}\n\n{_usage(prog, commands)}", file=sys.stderr)
        return 2
    module = importlib.import_module(commands[name][0])
    return int(module.main(rest) or 0)


def main(argv: list[str] | None = None) -> int:
    return dispatch("lookahead-rag", COMMANDS, argv)


if __name__ == "__main__":
    sys.exit(main())
