"""Read documents from files: JSONL (``{"id", "title", "text"}`` per line), plain text and markdown.

A text or markdown file is one document: id = its path as given, title = its first markdown
heading (``# ...``) or else its file name. Directories are walked for these extensions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from lookahead_rag.services.common.errors import InvalidArgument
from lookahead_rag.services.retriever.documents import Document

JSONL_SUFFIXES = frozenset({".jsonl"})
TEXT_SUFFIXES = frozenset({".txt", ".text"})
MARKDOWN_SUFFIXES = frozenset({".md", ".markdown"})
SUPPORTED_SUFFIXES = JSONL_SUFFIXES | TEXT_SUFFIXES | MARKDOWN_SUFFIXES
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def markdown_title(text: str) -> str | None:
    """The first ATX heading's text, or None."""
    match = _HEADING.search(text)
    return match.group(1).strip() if match else None


def _field(row: dict[str, object], name: str, where: str, required: bool) -> str:
    value = row.get(name, "")
    if not isinstance(value, str):
        raise InvalidArgument(f"{where}: field {name!r} must be a string, got {type(value).__name__}")
    if required and not value.strip():
        raise InvalidArgument(f"{where}: field {name!r} is missing or empty")
    return value


def read_jsonl(path: Path) -> Iterator[Document]:
    """One document per non-blank line; a bad line raises InvalidArgument naming file and line."""
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InvalidArgument(f"{where}: not JSON ({exc.msg})") from exc
            if not isinstance(row, dict):
                raise InvalidArgument(f"{where}: expected a JSON object")
            doc_id = _field(row, "id", where, required=True)
            text = _field(row, "text", where, required=True)
            title = _field(row, "title", where, required=False) or doc_id
            source = _field(row, "source", where, required=False) or str(path)
            yield Document(id=doc_id, title=title, text=text, source=source)


def read_text_file(path: Path) -> Document:
    """A .txt/.md file as one document."""
    text = path.read_text(encoding="utf-8")
    title = markdown_title(text) if path.suffix.lower() in MARKDOWN_SUFFIXES else None
    return Document(id=str(path), title=title or path.name, text=text, source=str(path))


def _files(path: Path) -> Iterator[Path]:
    if path.is_dir():
        for child in sorted(path.rglob("*")):
            if child.is_file() and child.suffix.lower() in SUPPORTED_SUFFIXES:
                yield child
    elif path.is_file():
        if path.suffix.lower() not in SUPPORTED_SUFFIXES:
            supported = ", ".join(sorted(SUPPORTED_SUFFIXES))
            raise InvalidArgument(f"{path}: unsupported file type (use {supported})")
        yield path
    else:
        raise InvalidArgument(f"{path}: no such file or directory")


def read_documents(paths: Iterable[Path]) -> Iterator[Document]:
    """Documents from files and directories, in order."""
    for root in paths:
        for path in _files(Path(root)):
            if path.suffix.lower() in JSONL_SUFFIXES:
                yield from read_jsonl(path)
            else:
                yield read_text_file(path)
