"""Hybrid search (BM25 beside FAISS, fused by RRF): what BM25 adds, and that it follows every change of a
tenant's documents (Ingest, Delete, replicated changes, a restart) and never crosses tenants."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from lookahead_rag.services.retriever.core import RetrieverCore
from lookahead_rag.services.retriever.doc_events import delete_change, upsert_change
from lookahead_rag.services.retriever.documents import Document, make_chunks
from lookahead_rag.services.retriever.embeddings import Embedder
from lookahead_rag.services.retriever.forget import ForgetWriter
from lookahead_rag.services.retriever.fusion import RRF_K
from lookahead_rag.services.retriever.hybrid import HybridConfig, hybrid_search
from lookahead_rag.services.retriever.index import IndexConfig, TenantIndex
from lookahead_rag.services.retriever.lexical import LexicalIndex, LexicalIndexes
from tests.builders import completed
from tests.services.retriever_helpers import settings

MAX_K = 16  # [limits] max_k: every chunk of these small tenants
DIM = 4
# a made-up part number: no embedding model has seen it, BM25 matches it exactly
CODE = "zq7741x"
DOCS = [
    Document("json.dumps", "json.dumps(obj, ...)", "Serialize obj to a JSON formatted str."),
    Document("csv.reader", "csv.reader(f)", "Return a reader object that iterates over lines in a CSV file."),
    Document("os.path.splitext", "os.path.splitext(p)", "Split the extension from a pathname."),
    Document("heapq.nlargest", "heapq.nlargest(n, iterable)", "Find the n largest elements in a dataset."),
    Document("parts", "Spare parts", f"The pump gasket is sold as part {CODE} in the spare parts list."),
]


def make_core(embedder: Embedder, tok: Any, data_dir: Path | None = None, **overrides: Any) -> RetrieverCore:
    return RetrieverCore(settings(data_dir, hybrid=True, **overrides), embedder=embedder, tokenizer=tok)


def doc_ids(core: RetrieverCore, tenant: str, question: str, k: int = MAX_K) -> list[str]:
    return [hit.chunk.doc_id for hit in core.search(tenant, question, k)]


def small_index(texts: list[str]) -> TenantIndex:
    index = TenantIndex("t", DIM, IndexConfig.from_settings(settings()))
    docs = [Document(f"d{n}", "", text) for n, text in enumerate(texts)]
    chunks = [c for d in docs for c in make_chunks(d, 800, 0)]
    index.add(chunks, np.eye(len(chunks), DIM, dtype=np.float32), {d.id: d.digest() for d in docs})
    return index


def test_bm25_ranks_the_rows_holding_the_query_words_and_leaves_out_the_others() -> None:
    lexical = LexicalIndex(["the cat sat on the mat", "a dog barked", "cat and dog and cat"], k1=1.5, b=0.75)
    assert lexical.search("cat", 3) == [2, 0]  # row 2 says cat twice; row 1 has no cat
    assert lexical.search("zebra", 3) == []
    assert lexical.search("the and a", 3) == []  # stop words only
    assert LexicalIndex([], k1=1.5, b=0.75).search("cat", 3) == []


def test_the_lexical_index_is_rebuilt_once_after_each_change_and_only_on_search() -> None:
    index = small_index(["alpha beta", "gamma delta"])
    lexical = LexicalIndexes(k1=1.5, b=0.75)
    assert lexical.search(index, "gamma", 2) == [1]
    assert lexical.search(index, "gamma", 2) == [1]
    assert lexical.rebuilds == 1  # unchanged: built once
    index.remove_documents(["d0"])
    assert lexical.rebuilds == 1  # lazily: not until the next search
    assert lexical.search(index, "gamma", 2) == [0]  # the rows moved up: row 0 is now gamma
    assert lexical.search(index, "alpha", 2) == []
    assert lexical.rebuilds == 2


def test_fusion_lifts_the_chunk_bm25_ranks_first_over_the_dense_top() -> None:
    index = small_index(["alpha beta", "gamma delta", "epsilon zeta"])  # row i's vector: unit vector i
    query = np.array([[1.0, 0.5, 0.25, 0.0]], dtype=np.float32)  # dense order: rows 0, 1, 2
    config = HybridConfig(depth=3, rrf_k=RRF_K)
    assert [h.chunk.doc_id for h in index.search(query, 3)] == ["d0", "d1", "d2"]
    hits = hybrid_search(index, LexicalIndexes(k1=1.5, b=0.75), "zeta", query, 2, config)
    # d2: 1/(k+3) dense + 1/(k+1) lexical beats d0's 1/(k+1); d1 (1/(k+2)) is left out at k=2
    assert [h.chunk.doc_id for h in hits] == ["d2", "d0"]
    assert [h.score for h in hits] == [0.25, 1.0]  # each the dense inner product, not the fused score


def test_hybrid_finds_an_exact_code(embedder: Embedder, tok: Any) -> None:
    core = make_core(embedder, tok)
    core.ingest("t", DOCS)
    assert doc_ids(core, "t", f"what is {CODE}?", 1) == ["parts"]
    dense = RetrieverCore(settings(None), embedder=embedder, tokenizer=tok)
    dense.ingest("t", DOCS)
    dense_scores = {h.chunk.chunk_id: h.score for h in dense.search("t", CODE, MAX_K)}
    hits = core.search("t", CODE, 3)
    assert len(hits) == 3
    for hit in hits:  # scores stay the dense inner products
        assert np.isclose(hit.score, dense_scores[hit.chunk.chunk_id], atol=1e-5)


def test_a_deleted_document_is_never_returned(embedder: Embedder, tok: Any) -> None:
    core = make_core(embedder, tok)
    core.ingest("t", DOCS)
    assert "parts" in doc_ids(core, "t", CODE)  # the lexical index is built now
    core.delete("t", ["parts"])
    assert "parts" not in doc_ids(core, "t", CODE)
    assert "parts" not in doc_ids(core, "t", "spare parts pump gasket")
    assert "parts" not in core.retrieve("t", f"what is {CODE}?", k=MAX_K).prompt


def test_a_replaced_document_is_found_by_its_new_words_only(embedder: Embedder, tok: Any) -> None:
    core = make_core(embedder, tok)
    core.ingest("t", DOCS)
    assert "parts" in doc_ids(core, "t", CODE)
    core.ingest("t", [Document("parts", "Spare parts", "The pump gasket is now sold as part yy9001w.")])
    hits = [h for h in core.search("t", CODE, MAX_K) if h.chunk.doc_id == "parts"]
    assert all(CODE not in h.chunk.text for h in hits)
    assert doc_ids(core, "t", "yy9001w", 1) == ["parts"]


def test_a_replicated_delete_is_followed(embedder: Embedder, tok: Any) -> None:
    core = make_core(embedder, tok)
    core.ingest("t", DOCS)
    assert "parts" in doc_ids(core, "t", CODE)
    core.documents.apply("t", [delete_change("parts")], persist=False)  # another replica's Delete
    assert "parts" not in doc_ids(core, "t", CODE)
    core.documents.apply("t", [upsert_change(DOCS[-1])], persist=False)  # and its Ingest again
    assert doc_ids(core, "t", CODE, 1) == ["parts"]


def test_tenants_never_see_each_others_chunks(embedder: Embedder, tok: Any) -> None:
    core = make_core(embedder, tok)
    core.ingest("acme", DOCS)
    core.ingest("other", DOCS[:2])
    assert "parts" not in doc_ids(core, "other", CODE)
    assert set(doc_ids(core, "other", f"{CODE} spare parts pump gasket heapq splitext")) <= {"json.dumps",
                                                                                            "csv.reader"}
    assert doc_ids(core, "nobody", CODE) == []
    core.delete("other", ["json.dumps"])  # one tenant's delete leaves the other's index alone
    assert "json.dumps" in doc_ids(core, "acme", "json.dumps serialize")


def test_a_forget_leaves_documents_and_hides_the_forgotten_answers(embedder: Embedder, tok: Any) -> None:
    core = make_core(embedder, tok, past_answers_in_prompt=True)
    core.ingest("t", DOCS)
    event = completed("t", question=f"what is {CODE}?", answer="the pump gasket")
    event.doc_ids.append("parts")
    event.citations.add(doc_id="parts", chunk_id="parts#0", start=4, end=19, quote="pump gasket")
    core.sessions.apply(event)
    assert core.retrieve("t", f"what is {CODE}?", m=2).sessions
    ForgetWriter(core).forget("t", "parts")
    result = core.retrieve("t", f"what is {CODE}?", m=2)
    assert result.sessions == []  # the answer grounded on it is forgotten
    assert "parts" in {c.chunk.doc_id for c in result.chunks}  # the document stays until deleted


def test_hybrid_search_survives_a_restart(tmp_path: Path, embedder: Embedder, tok: Any) -> None:
    core = make_core(embedder, tok, tmp_path)
    core.ingest("t", DOCS)
    core.delete("t", ["csv.reader"])
    core.close()
    again = make_core(embedder, tok, tmp_path)
    assert doc_ids(again, "t", CODE, 1) == ["parts"]
    assert "csv.reader" not in doc_ids(again, "t", "csv reader lines file")
