"""Build the bundled corpus: docstrings of common standard-library modules, from this interpreter.

``python -m lookahead_rag.services.retriever.stdlib_corpus --out services/data/stdlib_corpus.jsonl`` writes one
JSONL line ``{"id", "title", "text", "source"}`` per documented public module, class, function and
method: id ``json.dumps``, title ``json.dumps(obj, *, skipkeys=False, ...)``, text its docstring.
Every Python installation carries these texts, so the corpus needs no download; the committed
file is what the embedded default ingests.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from lookahead_rag.services.retriever.documents import make_chunks
from lookahead_rag.services.retriever.embeddings import Embedder
from lookahead_rag.services.retriever.ingest import read_jsonl
from lookahead_rag.services.retriever.settings import RetrieverSettings
from lookahead_rag.services.retriever.vector_cache import VectorCache

# Curated, commonly used modules; dotted names are imported as such.
MODULES: tuple[str, ...] = (
    "abc",
    "argparse",
    "array",
    "base64",
    "bisect",
    "calendar",
    "collections",
    "configparser",
    "contextlib",
    "copy",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "difflib",
    "enum",
    "fnmatch",
    "fractions",
    "functools",
    "glob",
    "gzip",
    "hashlib",
    "heapq",
    "hmac",
    "html",
    "io",
    "itertools",
    "json",
    "logging",
    "math",
    "operator",
    "os",
    "os.path",
    "pathlib",
    "pickle",
    "platform",
    "pprint",
    "queue",
    "random",
    "re",
    "secrets",
    "shlex",
    "shutil",
    "sqlite3",
    "statistics",
    "string",
    "struct",
    "subprocess",
    "tempfile",
    "textwrap",
    "threading",
    "time",
    "timeit",
    "traceback",
    "urllib.parse",
    "uuid",
    "warnings",
    "zipfile",
    "zlib",
)
MIN_DOC_CHARS = 40  # shorter docstrings ("Return self.") carry nothing worth retrieving
MAX_DOC_CHARS = 6000  # a few huge docstrings (module overviews) are cut here
MAX_TITLE_CHARS = 90  # longer signatures end in ", ...)"
SOURCE_PREFIX = "python-stdlib"


def _signature(obj: object, *, drop_self: bool) -> str:
    try:
        sig = inspect.signature(obj)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return "(...)" if callable(obj) else ""
    params = list(sig.parameters.values())
    if drop_self and params and params[0].name in ("self", "cls"):
        params = params[1:]
    return str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))


def _title(name: str, signature: str) -> str:
    """``name(sig)``, shortened to MAX_TITLE_CHARS by cutting whole parameters."""
    full = f"{name}{signature}"
    if len(full) <= MAX_TITLE_CHARS or not signature:
        return full
    kept: list[str] = []
    for part in signature[1:-1].split(", "):
        if len(name) + len(", ".join([*kept, part])) + len(", ...)") + 1 > MAX_TITLE_CHARS:
            break
        kept.append(part)
    return f"{name}({', '.join([*kept, '...'])})"


def _doc(obj: object) -> str | None:
    doc = inspect.getdoc(obj)
    if not doc or len(doc) < MIN_DOC_CHARS:
        return None
    return doc[:MAX_DOC_CHARS]


def _entry(name: str, title: str, text: str, module: str) -> dict[str, str]:
    return {"id": name, "title": title, "text": text, "source": f"{SOURCE_PREFIX}:{module}"}


def _public_names(module: ModuleType) -> list[str]:
    """Public names, an object's own name (``array``) before its aliases (``ArrayType``)."""
    names = getattr(module, "__all__", None) or [n for n in vars(module) if not n.startswith("_")]

    def is_alias(name: str) -> bool:
        return getattr(getattr(module, name, None), "__name__", name) != name

    return sorted(set(names), key=lambda n: (is_alias(n), n))


def _defined_here(obj: object, module: ModuleType) -> bool:
    """Skip re-exports (``os.path`` is ``posixpath``: accept the implementing module too)."""
    owner = getattr(obj, "__module__", None)
    return owner in (module.__name__, getattr(module, "__spec__", None) and module.__spec__.name)


def _class_entries(qual: str, cls: type, module_name: str) -> Iterator[dict[str, str]]:
    doc = _doc(cls)
    if doc:
        yield _entry(qual, _title(qual, _signature(cls, drop_self=True)), doc, module_name)
    for attr in sorted(vars(cls)):
        if attr.startswith("_"):
            continue
        member = vars(cls)[attr]
        func = member.__func__ if isinstance(member, classmethod | staticmethod) else member
        if not callable(func):
            continue
        doc = _doc(func)
        if doc:
            name = f"{qual}.{attr}"
            yield _entry(name, _title(name, _signature(func, drop_self=True)), doc, module_name)


def module_entries(module_name: str) -> Iterator[dict[str, str]]:
    """The module's own docstring, then its public functions, classes and their methods."""
    module = importlib.import_module(module_name)
    doc = _doc(module)
    if doc:
        yield _entry(module_name, f"{module_name} module", doc, module_name)
    seen: set[int] = set()  # aliases (array.ArrayType is array.array) are documented once
    for name in _public_names(module):
        obj = getattr(module, name, None)
        if obj is None or not _defined_here(obj, module) or id(obj) in seen:
            continue
        seen.add(id(obj))
        qual = f"{module_name}.{name}"
        if inspect.isclass(obj):
            yield from _class_entries(qual, obj, module_name)
        elif callable(obj):
            doc = _doc(obj)
            if doc:
                yield _entry(qual, _title(qual, _signature(obj, drop_self=False)), doc, module_name)


def build(modules: tuple[str, ...] = MODULES) -> list[dict[str, str]]:
    """All entries, first occurrence of an id wins (some classes are reachable twice)."""
    seen: set[str] = set()
    out: list[dict[str, str]] = []
    for module_name in modules:
        for entry in module_entries(module_name):
            if entry["id"] not in seen:
                seen.add(entry["id"])
                out.append(entry)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSONL file to write")
    parser.add_argument("--vectors", type=Path, help="also embed its chunks into this vector cache (.npz)")
    args = parser.parse_args(argv)
    entries = build()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as fh:
        for entry in entries:
            fh.write(json.dumps(entry, ensure_ascii=False) + "\n")
    size = args.out.stat().st_size
    print(f"wrote {len(entries)} documents from {len(MODULES)} modules ({size / 1e6:.2f} MB) to {args.out}")
    if args.vectors is not None:
        write_vectors(args.out, args.vectors)
    return 0


def chunk_texts(corpus: Path) -> list[str]:
    """The embedding texts of the corpus's chunks under the default chunking settings."""
    s = RetrieverSettings(data_dir=None)
    return [c.embedding_text() for doc in read_jsonl(corpus) for c in make_chunks(doc, s.chunk_chars, s.chunk_overlap)]


def write_vectors(corpus: Path, out: Path) -> None:
    """Embed every chunk of ``corpus`` (default settings) into a VectorCache file."""
    texts = chunk_texts(corpus)
    embedder = Embedder()
    cache = VectorCache.build(embedder.name, texts, embedder.encode(texts))
    out.write_bytes(cache.to_bytes())
    print(f"wrote {len(cache)} chunk vectors ({out.stat().st_size / 1e6:.2f} MB) to {out}")


if __name__ == "__main__":
    sys.exit(main())
