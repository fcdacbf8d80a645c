"""bench hostile without a model: the attackers' payloads and counters, the victim's document count, the
attacker process's spec, and how the targets are judged."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from lookahead_rag.bench.hostile_attack import AttackSpec, counts_json
from lookahead_rag.bench.hostile_mix import (
    MIB,
    Doors,
    HoldCounts,
    UploadCounts,
    UploadPlan,
    accepted_document,
    filler_text,
    http_body,
    http_refused_body,
    oversized_title_document,
)
from lookahead_rag.bench.hostile_targets import MISS, PASS, targets, titles_refused, uploads_accepted
from lookahead_rag.bench.hostile_victim import KeyedStub, documents_kept
from lookahead_rag.bench.serve_stats import RequestRecord
from lookahead_rag.services.common.telemetry.logs import REQUEST_ID_HEADER

PASSAGES = ["The Normans were the people who gave their name to Normandy.", "Rollo agreed to swear fealty."]
DOORS = Doors("127.0.0.1:1", "http://127.0.0.1:2", "127.0.0.1:3", "direct")


def test_filler_is_exactly_as_long_as_asked_and_made_of_the_passages() -> None:
    for chars in (1, 50, 10_000, MIB):
        text = filler_text(PASSAGES, chars)
        assert len(text) == chars
    base = " ".join(PASSAGES)
    assert filler_text(PASSAGES, 10_000).startswith(f"{base} {base} {base[:10]}")
    with pytest.raises(ValueError):
        filler_text(["", ""], 10)


def test_the_refused_upload_carries_the_long_title_and_the_accepted_ones_fresh_ids() -> None:
    doc = oversized_title_document("big", "text", 2 * MIB)
    assert len(doc.title) == 2 * MIB and doc.text == "text"
    first, second = accepted_document(0, "x"), accepted_document(1, "x")
    assert first.id != second.id and first.title != second.title and len(first.title) < 64
    body = json.loads(http_body([doc]))
    assert body["documents"][0]["title"] == doc.title and body["documents"][0]["id"] == "big"


def test_the_http_refused_body_keeps_the_title_whole_and_fits_the_door() -> None:
    limit = 3 * MIB
    text = filler_text([*PASSAGES, "Caf\u00e9 \"quoted\" \u00e9l\u00e8ve"], 4 * MIB)  # escapes take bytes
    body = http_refused_body(UploadPlan("uploader", text, 2 * MIB, limit))
    assert limit - len("\\u00e9") < len(body) <= limit  # as much text as fits: one more character would not
    doc = json.loads(body)["documents"][0]
    assert len(doc["title"]) == 2 * MIB and text.startswith(doc["text"])
    with pytest.raises(ValueError):  # a title alone over the limit cannot be a 400 on the title
        http_refused_body(UploadPlan("uploader", text, 2 * MIB, MIB))


def test_upload_counts_keep_one_message_per_outcome_and_cut_it() -> None:
    counts = UploadCounts()
    counts.note("grpc:INVALID_ARGUMENT", "documents[0]: title is 2097152 characters" + "!" * 500)
    counts.note("grpc:INVALID_ARGUMENT", "another message")
    counts.note("http:400", "title")
    out = counts.as_json()
    assert out["outcomes"] == {"grpc:INVALID_ARGUMENT": 2, "http:400": 1}
    assert out["messages"]["grpc:INVALID_ARGUMENT"].startswith("documents[0]: title")  # the first one kept
    assert len(out["messages"]["grpc:INVALID_ARGUMENT"]) < 200


def test_hold_counts_sum_connections_and_summarize_samples() -> None:
    holds = HoldCounts(opened=7, answered=3)
    holds.held_now = {0: 2, 1: 2}
    assert holds.held() == 4
    assert holds.as_json()["held_peak"] == 0 and holds.as_json()["held_mean"] is None
    holds.samples = [4, 2, 0]
    assert holds.as_json() == {"opened": 7, "answered": 3, "connections": 0, "held_peak": 4, "held_mean": 2.0}


def test_the_attack_spec_travels_as_json() -> None:
    spec = AttackSpec(DOORS, "uploader", "lar_k", PASSAGES, 0.01, 0.005, MIB, "bench", 2, 10, ["refuse", "hold"])
    again = AttackSpec.from_json(spec.to_json())
    assert again == spec and isinstance(again.doors, Doors)
    plan = again.plan()
    assert len(plan.text) == int(0.01 * MIB) and plan.title_chars == int(0.005 * MIB)
    assert set(counts_json(UploadCounts(), UploadCounts(), HoldCounts())) == {"refused", "accepted", "holder"}


class FakeStub:
    """Answer yields two deltas and a final with ``documents`` documents; records the metadata it got."""

    def __init__(self, documents: int) -> None:
        self.n = documents
        self.metadata: tuple[tuple[str, str], ...] = ()

    def Answer(self, request: Any, timeout: float, metadata: tuple[tuple[str, str], ...]) -> AsyncIterator[Any]:
        self.metadata = metadata
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[Any]:
        for kind in ("delta", "delta", "final"):
            final = SimpleNamespace(documents=[object()] * self.n)
            yield SimpleNamespace(HasField=lambda f, k=kind: f == k, final=final)


def answered(stub: KeyedStub, rid: str) -> list[Any]:
    async def go() -> list[Any]:
        return [c async for c in stub.Answer(None, 1.0, ((REQUEST_ID_HEADER, rid), ("x-tenant", "bench")))]
    return asyncio.run(go())


def record(rid: str, completed: bool = True) -> RequestRecord:
    rec = RequestRecord(0, 0.0, request_id=rid)
    if completed:
        rec.stats = SimpleNamespace()  # type: ignore[assignment]
    else:
        rec.error = "RESOURCE_EXHAUSTED"
    return rec


def test_the_keyed_stub_sends_the_key_and_counts_each_answers_documents() -> None:
    inner = FakeStub(documents=3)
    stub = KeyedStub(inner, "lar_victim")
    assert len(answered(stub, "r1")) == 3  # every chunk passed on
    assert ("authorization", "Bearer lar_victim") in inner.metadata and ("x-tenant", "bench") in inner.metadata
    inner.n = 0  # the no-documents fallback
    answered(stub, "r2")
    assert stub.documents == {"r1": 3, "r2": 0}
    recs = [record("r1"), record("r2"), record("r3", completed=False)]
    assert all(r.completed for r in recs[:2]) and not recs[2].completed
    assert documents_kept(recs, stub.documents) == {"kept": 1, "lost": 1}


def run(ttft: tuple[float, float], kept: int = 4, errors: dict[str, int] | None = None, **extra: Any) -> dict[str, Any]:
    done = 4 - sum((errors or {}).values())
    return {"ttft_p50_s": ttft[0], "ttft_p99_s": ttft[1], "completed": done, "errors": errors or {},
            "documents": {"kept": kept, "lost": done - kept}} | extra


def test_the_target_is_both_quantiles_within_the_rise_and_every_answer_on_its_documents() -> None:
    attackers = {"refused": {"outcomes": {"grpc:INVALID_ARGUMENT": 5, "http:400": 5},
                             "messages": {"grpc:INVALID_ARGUMENT": "documents[0]: title is 2097152 characters",
                                          "http:400": '{"error": {"message": "documents[0]: title is ..."}}'}},
                 "accepted": {"outcomes": {"grpc:OK": 1}, "chunks_embedded": 6000}, "holder": {"held_peak": 400}}
    alone = run((0.5, 1.0))
    good = targets({"alone": alone, "hostile": run((1.9, 2.5), **attackers)}, 4, 1.5)
    assert good["verdict"] == PASS and good["ttft_p50_rise_s"] == 1.4 and good["ttft_p99_rise_s"] == 1.5
    assert good["titles_refused"] and good["uploads_accepted"] and good["streams_held"]
    late = targets({"alone": alone, "hostile": run((0.6, 2.6), **attackers)}, 4, 1.5)  # p99 past the rise
    assert late["verdict"] == MISS and not late["ttft_within"]
    lost = targets({"alone": alone, "hostile": run((0.5, 1.0), kept=3)}, 4, 1.5)  # one answer without documents
    assert lost["verdict"] == MISS and not lost["documents_kept"]
    refused = targets({"alone": alone, "hostile": run((0.5, 1.0), kept=3, errors={"RESOURCE_EXHAUSTED": 1})}, 4, 1.5)
    assert refused["verdict"] == MISS
    assert targets({"alone": alone, "hostile": run((None, None))}, 4, 1.5)["verdict"] == MISS  # type: ignore[arg-type]


def test_a_title_met_by_anything_but_a_400_naming_it_is_not_refused_as_it_should_be() -> None:
    assert not titles_refused({})
    assert not titles_refused({"outcomes": {"http:413": 1}, "messages": {"http:413": "request body over"}})
    assert not titles_refused({"outcomes": {"http:400": 1}, "messages": {"http:400": "bad json"}})
    assert titles_refused({"outcomes": {"http:400": 1}, "messages": {"http:400": "title is 9 characters"}})
    assert not uploads_accepted({"outcomes": {"grpc:OK": 1, "grpc:INVALID_ARGUMENT": 1}, "chunks_embedded": 9})
    assert not uploads_accepted({"outcomes": {}, "chunks_embedded": 0})
