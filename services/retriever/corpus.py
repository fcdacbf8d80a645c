"""The bundled corpus (stdlib docstrings), its sample questions and vectors, shipped in services/data."""

from __future__ import annotations

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
CORPUS_FILE = "stdlib_corpus.jsonl"  # made by services.retriever.stdlib_corpus
QUESTIONS_FILE = "sample_questions.jsonl"  # {"id", "question", "doc_id"}: doc_id answers it
VECTORS_FILE = "stdlib_corpus.vectors.npz"  # the corpus chunks' embeddings (services.retriever.vector_cache)


def bundled_corpus_path() -> Path:
    """JSONL documents ``{"id", "title", "text", "source"}`` of common stdlib modules."""
    return DATA_DIR / CORPUS_FILE


def sample_questions_path() -> Path:
    """JSONL questions written for the bundled corpus."""
    return DATA_DIR / QUESTIONS_FILE


def bundled_vectors_path() -> Path:
    """Precomputed embeddings of the bundled corpus's chunks (default chunking, all-MiniLM-L6-v2)."""
    return DATA_DIR / VECTORS_FILE
