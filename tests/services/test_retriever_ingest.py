"""Reading documents (JSONL, text, markdown), the ingest CLI over gRPC, and the bundled corpus."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lookahead_rag.services.common.errors import InvalidArgument
from lookahead_rag.services.retriever import ingest_cli
from lookahead_rag.services.retriever.build import retriever_service
from lookahead_rag.services.retriever.core import RetrieverCore
from lookahead_rag.services.retriever.corpus import bundled_corpus_path, bundled_vectors_path, sample_questions_path
from lookahead_rag.services.retriever.documents import Document
from lookahead_rag.services.retriever.ingest import read_documents, read_jsonl
from lookahead_rag.services.retriever.stdlib_corpus import chunk_texts, module_entries
from lookahead_rag.services.retriever.vector_cache import VectorCache
from tests.services.retriever_helpers import settings, shared_embedder, shared_tokenizer

MAX_CORPUS_BYTES = 3_000_000
SAMPLE_K = 4


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_jsonl_text_and_markdown(tmp_path: Path) -> None:
    rows = [{"id": "a", "title": "Alpha", "text": "first"}, {"id": "b", "text": "second", "source": "web"}]
    write(tmp_path / "docs" / "1.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n\n")
    write(tmp_path / "docs" / "2.md", "Intro line\n\n## Install guide ##\n\nRun make.\n")
    write(tmp_path / "docs" / "3.txt", "# not a heading in a text file\nplain")
    write(tmp_path / "docs" / "skip.bin", "ignored in directories")
    docs = list(read_documents([tmp_path / "docs"]))
    assert [(d.id, d.title, d.text, d.source) for d in docs] == [
        ("a", "Alpha", "first", str(tmp_path / "docs" / "1.jsonl")),
        ("b", "b", "second", "web"),
        (
            str(tmp_path / "docs" / "2.md"),
            "Install guide",
            "Intro line\n\n## Install guide ##\n\nRun make.\n",
            str(tmp_path / "docs" / "2.md"),
        ),
        (
            str(tmp_path / "docs" / "3.txt"),
            "3.txt",
            "# not a heading in a text file\nplain",
            str(tmp_path / "docs" / "3.txt"),
        ),
    ]


def test_markdown_without_heading_is_titled_by_file_name(tmp_path: Path) -> None:
    path = write(tmp_path / "notes.md", "no heading here")
    assert next(read_documents([path])).title == "notes.md"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "1.jsonl:2: not JSON"),
        ('{"id": "x"}', "1.jsonl:2: field 'text' is missing or empty"),
        ('{"id": 3, "text": "t"}', "1.jsonl:2: field 'id' must be a string"),
        ('["a"]', "1.jsonl:2: expected a JSON object"),
    ],
)
def test_bad_jsonl_line_names_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = write(tmp_path / "1.jsonl", '{"id": "ok", "text": "fine"}\n' + line + "\n")
    with pytest.raises(InvalidArgument, match=message):
        list(read_jsonl(path))


def test_unsupported_or_missing_paths_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="unsupported file type"):
        list(read_documents([write(tmp_path / "x.pdf", "%PDF")]))
    with pytest.raises(InvalidArgument, match="no such file"):
        list(read_documents([tmp_path / "missing.txt"]))


# ---- the ingest CLI against a real server ------------------------------------------------------------


@pytest.fixture(scope="module")
def core() -> RetrieverCore:
    return RetrieverCore(settings(), embedder=shared_embedder(), tokenizer=shared_tokenizer())


@pytest.fixture
def target(core: RetrieverCore) -> Iterator[str]:
    """A retriever served on a background event loop (the CLI runs its own asyncio.run)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    service = retriever_service(core)
    port = asyncio.run_coroutine_threadsafe(service.serve(port=0), loop).result()
    yield f"127.0.0.1:{port}"
    asyncio.run_coroutine_threadsafe(service.stop_serving(grace_s=1.0), loop).result()
    loop.call_soon_threadsafe(loop.stop)
    thread.join()


def test_cli_ingests_in_batches_and_prints_counts(
    tmp_path: Path, target: str, core: RetrieverCore, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [
        {"id": f"d{i}", "title": f"Doc {i}", "text": f"Document number {i} about topic {i}."}
        for i in range(5)
    ]
    corpus = write(tmp_path / "c.jsonl", "\n".join(json.dumps(r) for r in rows))
    guide = write(tmp_path / "guide.md", "# Guide\n\nRead me.")
    argv = ["--tenant", "cli", "--target", target, "--batch-docs", "2", str(corpus), str(guide)]
    assert ingest_cli.main(argv) == 0
    assert "6 documents ingested (0 unchanged), 6 chunks added, 6 chunks in total" in capsys.readouterr().out
    assert ingest_cli.main(argv) == 0  # again: nothing changed
    assert "0 documents ingested (6 unchanged), 0 chunks added, 6 chunks in total" in capsys.readouterr().out
    assert core.stats("cli").chunks == 6


def test_cli_reports_bad_files_and_server_errors(
    tmp_path: Path, target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = write(tmp_path / "bad.jsonl", "{oops\n")
    assert ingest_cli.main(["--tenant", "t", "--target", target, str(bad)]) == ingest_cli.EXIT_BAD_INPUT
    assert "bad.jsonl:1: not JSON" in capsys.readouterr().err
    doc = write(tmp_path / "ok.txt", "text")
    assert ingest_cli.main(["--tenant", " ", "--target", target, str(doc)]) == ingest_cli.EXIT_RPC_FAILED
    assert "INVALID_ARGUMENT: tenant is empty" in capsys.readouterr().err


def test_batches_respect_count_and_size() -> None:
    docs = [Document(f"d{i}", "", "x" * 10) for i in range(5)]
    assert [len(b) for b in ingest_cli.batches(docs, max_docs=2, max_bytes=10_000)] == [2, 2, 1]
    assert [len(b) for b in ingest_cli.batches(docs, max_docs=10, max_bytes=25)] == [2, 2, 1]


# ---- the bundled corpus ------------------------------------------------------------------------------


def test_bundled_corpus_is_small_and_answers_its_sample_questions() -> None:
    assert bundled_corpus_path().stat().st_size < MAX_CORPUS_BYTES
    ids = {d.id for d in read_jsonl(bundled_corpus_path())}
    questions = [
        json.loads(line) for line in sample_questions_path().read_text().splitlines() if line.strip()
    ]
    assert len(questions) >= 12
    assert {"json.dumps", "collections.Counter", "os.path.splitext"} <= ids
    assert all(q["doc_id"] in ids for q in questions)


def test_shipped_vectors_cover_every_chunk_of_the_corpus() -> None:
    """Fails when the corpus or the default chunking changed without regenerating the vectors."""
    cache = VectorCache.load(bundled_vectors_path())
    texts = chunk_texts(bundled_corpus_path())
    assert cache.model == shared_embedder().name and cache.dim == shared_embedder().dim
    assert [t for t in texts if cache.get(t) is None] == []


def test_sample_questions_retrieve_their_document(core: RetrieverCore) -> None:
    core.ingest("stdlib", list(read_jsonl(bundled_corpus_path())))
    questions = [
        json.loads(line) for line in sample_questions_path().read_text().splitlines() if line.strip()
    ]
    misses: list[Any] = []
    for q in questions:
        found = [hit.chunk.doc_id for hit in core.search("stdlib", q["question"], SAMPLE_K)]
        if q["doc_id"] not in found:
            misses.append((q["question"], found))
    assert misses == []


def test_generator_documents_functions_with_signatures() -> None:
    entries = {e["id"]: e for e in module_entries("json")}
    assert entries["json.dumps"]["title"].startswith("json.dumps(obj, *, skipkeys=False")
    assert entries["json.dumps"]["text"].startswith("Serialize ``obj`` to a JSON formatted ``str``.")
    assert entries["json"]["title"] == "json module"
