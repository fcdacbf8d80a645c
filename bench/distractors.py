"""Distractor documents for retrieval benchmarks: real text already on every machine, the docstrings of
the whole standard library (the bundled corpus covers a curated few modules), then of installed
packages the project depends on (numpy by default), up to a chunk count.

    python -m lookahead_rag.bench.distractors --out distractors.jsonl [--chunks 10000] [--packages numpy]

bench quality's ``--distractors`` adds them to every tenant, so the index grows with text that is
neither the questions' articles nor noise vectors (which BM25 could not read).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pkgutil
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

from lookahead_rag.services.retriever.documents import Document, make_chunks
from lookahead_rag.services.retriever.settings import RetrieverSettings
from lookahead_rag.services.retriever.stdlib_corpus import module_entries

DEFAULT_CHUNKS = 10_000  # the size of bench retrieval's larger index
DEFAULT_PACKAGES = "numpy"  # a dependency of the project: installed wherever the benchmark runs
# modules that act when imported (a browser, a printout), or that are tests, tooling or GUI
SKIPPED_PREFIXES = ("_", "antigravity", "this", "test", "idlelib", "tkinter", "turtle", "lib2to3", "pydoc_data",
                    "ensurepip", "venv", "__")


def _kept(name: str) -> bool:
    return not any(part.startswith(SKIPPED_PREFIXES) for part in name.split("."))


def with_submodules(tops: list[str]) -> list[str]:
    """These modules and every submodule of the packages among them, minus the skipped ones, in name order."""
    names = {m for m in tops if _kept(m)}
    for top in sorted(names):
        spec = importlib.util.find_spec(top) if top not in sys.builtin_module_names else None
        if spec is not None and spec.submodule_search_locations:
            names |= {info.name for info in pkgutil.walk_packages(spec.submodule_search_locations, f"{top}.",
                                                                  onerror=lambda _: None) if _kept(info.name)}
    return sorted(names)


def modules(packages: list[str]) -> list[str]:
    """The standard library's modules, then the packages' (each in name order)."""
    return with_submodules(sorted(sys.stdlib_module_names)) + with_submodules(packages)


def entries(modules: list[str]) -> Iterator[dict[str, str]]:
    """Every module's docstring entries (as the bundled corpus's), each id once; unimportable modules skipped."""
    seen: set[str] = set()
    for name in modules:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # deprecated modules warn on import
                found = list(module_entries(name))
        except Exception:  # a module this platform lacks (winreg, msvcrt, ...), or one that fails to import
            continue
        for entry in found:
            if entry["id"] not in seen:
                seen.add(entry["id"])
                yield entry


def build(max_chunks: int, packages: list[str]) -> tuple[list[dict[str, str]], int]:
    """Documents in module order until their chunks (default chunking) reach ``max_chunks``; and the count."""
    s = RetrieverSettings(data_dir=None)
    out, chunks = [], 0
    for entry in entries(modules(packages)):
        if chunks >= max_chunks:
            break
        chunks += len(make_chunks(Document(entry["id"], entry["title"], entry["text"]), s.chunk_chars,
                                  s.chunk_overlap))
        out.append(entry)
    return out, chunks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSONL file to write ({id, title, text, source})")
    parser.add_argument("--chunks", type=int, default=DEFAULT_CHUNKS, help="stop once this many chunks are written")
    parser.add_argument("--packages", default=DEFAULT_PACKAGES, help="installed packages read after the standard "
                        "library, comma-separated")
    args = parser.parse_args(argv)
    docs, chunks = build(args.chunks, [p for p in args.packages.split(",") if p.strip()])
    with args.out.open("w", encoding="utf-8") as fh:
        for entry in docs:
            fh.write(json.dumps(entry, ensure_ascii=False) + "\n")
    print(f"wrote {len(docs)} documents, {chunks} chunks, to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
