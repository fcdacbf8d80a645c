"""Hostile tenants against the retriever, fourth pass (issue 51, findings 1, 3 and 6): each fails without its fix.

1. A document title (or source) has no limit and every chunk repeats it: refused where documents enter,
   over gRPC (INVALID_ARGUMENT) and over HTTP (400), and so is a request that makes too many chunks.
3. One tenant's ingest must not hold another's retrieval: a slow encoder that runs one call at a time (as
   the real one does) embeds tenant A's 1,000 chunks while tenant B's Retrieve returns within the
   generator's retrieval deadline.
6. A BM25 rebuild must not hold every tenant's search: tenant A's rebuild is held mid-build while tenant
   B's hybrid search returns, and a change landing during the build is never searched stale.
"""

from __future__ import annotations

import asyncio
import threading
import time
import zlib
from collections.abc import Iterator, Sequence
from http import HTTPStatus
from typing import Any

import grpc
import httpx2
import numpy as np
import pytest

from lookahead_rag.services.common.errors import InvalidArgument
from lookahead_rag.services.common.rpc.grpcutil import open_channel
from lookahead_rag.services.common.rules.limits import RequestLimits
from lookahead_rag.services.generator.settings import GeneratorSettings
from lookahead_rag.services.http.ingest import DocumentIn, IngestCounts
from lookahead_rag.services.http.routes import Frontend, make_app
from lookahead_rag.services.http.settings import HttpSettings
from lookahead_rag.services.retriever import lexical
from lookahead_rag.services.retriever.build import retriever_service
from lookahead_rag.services.retriever.core import RetrieverCore
from lookahead_rag.services.retriever.documents import Document
from lookahead_rag.v1 import retriever_pb2, retriever_pb2_grpc
from tests.services.retriever_helpers import settings

DIM = 8
MIB = 1024 * 1024
HOSTILE_TITLE = "t" * (2 * MIB)  # issue 51: a 2 MiB title, repeated into every chunk before the fix
RETRIEVE_DEADLINE_S = GeneratorSettings().retrieve_timeout_s  # what the generator gives one Retrieve (2 s)
WAIT_S = 30.0  # an upper bound for a step that must happen at all (never a performance target)
INGEST_CHUNKS = 1000  # tenant A's one request (issue 51's sketch)
PER_TEXT_S = 0.01  # the slow encoder: 1,000 chunks hold it 10 s in one call, 80 ms in one slice of 8
A_MARK = "alpha-tenant"  # in tenant A's texts: the fakes recognize its work by it


def unit_vector(text: str) -> np.ndarray:
    """[DIM] float32 of unit length, the same for the same text."""
    vector = np.random.default_rng(zlib.crc32(text.encode())).normal(size=DIM).astype(np.float32)
    return vector / np.linalg.norm(vector)


class SlowEncoder:
    """A stand-in embedding model: one call at a time (as ``Embedder``'s lock), ``per_text_s`` a text."""

    dim = DIM

    def __init__(self, per_text_s: float = 0.0) -> None:
        self.per_text_s = per_text_s  # set to 0 to let a running call finish at once
        self.a_started = threading.Event()  # set when a call embeds tenant A's chunks
        self._lock = threading.Lock()

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        with self._lock:
            if any(A_MARK in text for text in texts):
                self.a_started.set()
            for _ in texts:
                time.sleep(self.per_text_s)
            return np.stack([unit_vector(text) for text in texts])

    def encode_one(self, text: str) -> np.ndarray:
        return self.encode([text])


def make_core(tok: Any, encoder: SlowEncoder | None = None, **overrides: Any) -> RetrieverCore:
    return RetrieverCore(settings(vector_cache=None, **overrides), embedder=encoder or SlowEncoder(), tokenizer=tok,
                         limits=RequestLimits(default_m=0))


def b_documents() -> list[Document]:
    return [Document("b-okapi", "Okapi", "The okapi is a giraffid with striped legs."),
            Document("b-tapir", "Tapir", "The tapir is a large herbivorous mammal with a short trunk.")]


def a_documents(count: int) -> list[Document]:
    return [Document(f"a-{n}", f"{A_MARK} {n}", f"Part {n} of the {A_MARK} manual: gasket zq{n}.")
            for n in range(count)]


class InThread:
    """``call()`` in a daemon thread; ``result(timeout)`` is its return value, or None if not done by then."""

    def __init__(self, call: Any) -> None:
        self._out: list[Any] = []
        self._thread = threading.Thread(target=lambda: self._out.append(call()), daemon=True)
        self._thread.start()

    def result(self, timeout: float) -> Any:
        self._thread.join(timeout)
        return self._out[0] if self._out else None


# ---- 1: titles, sources and chunks a request are bounded where documents enter ---------------------------

def test_a_2_mib_title_or_a_long_source_is_refused_by_the_core_naming_the_field(tok: Any) -> None:
    core = make_core(tok)
    with pytest.raises(InvalidArgument, match=r"document 0 \('big'\): title is 2097152 characters; the limit is"):
        core.ingest("a", [Document("big", HOSTILE_TITLE, "Some text.")])
    source = "s" * (core.limits.max_doc_source_chars + 1)
    with pytest.raises(InvalidArgument, match=r"source is \d+ characters"):
        core.ingest("a", [Document("far", "Far", "Some text.", source)])
    assert core.stats().chunks == 0  # nothing was chunked, embedded or indexed


def test_a_request_making_too_many_chunks_is_refused(tok: Any) -> None:
    core = make_core(tok, chunk_chars=50, chunk_overlap=0, max_chunks_per_request=10)
    many = [Document(f"d{n}", "", f"Sentence {n} of a short document.") for n in range(11)]  # one chunk each
    with pytest.raises(InvalidArgument, match=r"11 documents make 11 chunks; the limit is 10"):
        core.ingest("a", many)
    assert core.ingest("a", many[:10]).chunks == 10  # at the limit: taken


def test_a_2_mib_title_is_invalid_argument_over_grpc(tok: Any) -> None:
    core = make_core(tok)

    async def ingest_hostile() -> None:
        service = retriever_service(core)
        port = await service.serve(port=0)
        try:
            async with open_channel(f"127.0.0.1:{port}") as channel:
                doc = retriever_pb2.Document(id="big", title=HOSTILE_TITLE, text="Some text.")
                await retriever_pb2_grpc.RetrieverStub(channel).Ingest(
                    retriever_pb2.IngestRequest(tenant="a", documents=[doc]))
        finally:
            await service.stop_serving(grace_s=1.0)

    with pytest.raises(grpc.aio.AioRpcError) as info:
        asyncio.run(ingest_hostile())
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "title is 2097152 characters" in (info.value.details() or "")


class _Generator:
    """A generator stand-in: the door reads only its name, limits and settings before it ingests."""

    model_name = "stand-in"
    limits = RequestLimits()
    settings = GeneratorSettings()


@pytest.mark.asyncio
async def test_a_2_mib_title_is_a_400_over_http_before_it_reaches_the_retriever() -> None:
    sent: list[Sequence[DocumentIn]] = []

    async def ingest(_tenant: str, documents: Sequence[DocumentIn], _key: str | None) -> IngestCounts:
        sent.append(documents)
        return IngestCounts(len(documents), len(documents), len(documents))

    front = Frontend(_Generator(), HttpSettings(default_tenant="public"), documents=ingest)  # type: ignore[arg-type]
    front.serving = True
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=make_app(front)), base_url="http://d") as http:
        doc = {"id": "big", "title": HOSTILE_TITLE, "text": "Some text."}
        reply = await http.post("/v1/documents", json={"documents": [doc]})
        assert reply.status_code == HTTPStatus.BAD_REQUEST, reply.text[:300]
        error = reply.json()["error"]
        assert "title is 2097152 characters" in error["message"] and error["param"] == "documents"
        ok = await http.post("/v1/documents", json={"documents": [{**doc, "title": "Fine"}]})
        assert ok.status_code == HTTPStatus.OK
    assert len(sent) == 1 and sent[0][0].title == "Fine"  # the hostile one never left the door


# ---- 3: one tenant's embedding work never holds another's retrieval ---------------------------------------

def test_tenant_b_retrieves_within_its_deadline_while_tenant_a_embeds_1000_chunks(tok: Any) -> None:
    encoder = SlowEncoder()
    core = make_core(tok, encoder)
    core.ingest("b", b_documents())
    encoder.per_text_s = PER_TEXT_S
    ingest_a = InThread(lambda: core.ingest("a", a_documents(INGEST_CHUNKS)))
    try:
        assert encoder.a_started.wait(WAIT_S)  # A's chunks are being embedded now
        retrieve_b = InThread(lambda: core.retrieve("b", "Which animal has striped legs?", k=1))
        answer = retrieve_b.result(RETRIEVE_DEADLINE_S)
        assert answer is not None, f"tenant B's Retrieve waited past {RETRIEVE_DEADLINE_S} s behind A's ingest"
        assert [c.chunk.doc_id for c in answer.chunks] and answer.chunks[0].chunk.doc_id.startswith("b-")
    finally:
        encoder.per_text_s = 0.0  # let A's ingest finish at once
    done = ingest_a.result(WAIT_S)
    assert done is not None and done.chunks == INGEST_CHUNKS  # every chunk embedded, slice by slice
    index = core.documents.indexes["a"]  # row i's vector is chunk i's, across the slices
    assert np.allclose(index.vectors, np.stack([unit_vector(c.embedding_text()) for c in index.chunks]))


# ---- 6: a BM25 rebuild never holds another tenant's search ------------------------------------------------

@pytest.fixture
def held_a_build(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[threading.Event, threading.Event]]:
    """(building, release): building is set once tenant A's BM25 build starts, which then waits for release."""
    building, release = threading.Event(), threading.Event()
    tokens = lexical.tokens

    def held(texts: Sequence[str]) -> list[list[str]]:
        if len(texts) > 1 and any(A_MARK in text for text in texts):  # A's index, not a query
            building.set()
            release.wait(WAIT_S)
        return tokens(texts)

    monkeypatch.setattr(lexical, "tokens", held)
    yield building, release
    release.set()


def test_tenant_b_searches_while_tenant_a_rebuilds_its_bm25_index(
        tok: Any, held_a_build: tuple[threading.Event, threading.Event]) -> None:
    building, release = held_a_build
    core = make_core(tok, hybrid=True)
    core.ingest("b", b_documents())
    assert core.search("b", "striped legs", 1)  # B's lexical index is built now
    core.ingest("a", a_documents(3))
    search_a = InThread(lambda: core.search("a", "zq2", 1))
    try:
        assert building.wait(WAIT_S)
        found = InThread(lambda: core.search("b", "tapir", 1)).result(RETRIEVE_DEADLINE_S)
        assert found is not None, "tenant B's search waited on tenant A's BM25 rebuild"
        assert [hit.chunk.doc_id for hit in found] == ["b-tapir"]
    finally:
        release.set()
    assert [hit.chunk.doc_id for hit in search_a.result(WAIT_S)] == ["a-2"]  # BM25 found A's exact code


def test_a_change_during_a_rebuild_is_never_searched_stale(
        tok: Any, held_a_build: tuple[threading.Event, threading.Event]) -> None:
    building, release = held_a_build
    core = make_core(tok, hybrid=True)
    core.ingest("a", a_documents(3))
    search_a = InThread(lambda: core.search("a", "zq2", 3))
    try:
        assert building.wait(WAIT_S)
        assert InThread(lambda: core.delete("a", ["a-2"])).result(WAIT_S) is not None  # lands mid-build
    finally:
        release.set()
    found = search_a.result(WAIT_S)
    assert found is not None and "a-2" not in [hit.chunk.doc_id for hit in found]
    assert [hit.chunk.doc_id for hit in core.search("a", "zq1", 1)] == ["a-1"]  # rebuilt: BM25 again
