"""bench hostile's attackers: the uploader (oversized titles refused at both doors, 4 MiB documents embedded)
and the holder (headers-only HTTP/2 streams naming the victim's tenant, no key, no DATA).

    refused, accepted = UploadCounts(), UploadCounts()
    await uploader(doors, key, UploadPlan(...), refused, accepted)      # until cancelled
    holds = HoldCounts()
    await holder(doors.grpc, VICTIM, connections=4, per_connection=100, counts=holds)

The payload builders are pure (tests/bench/test_bench_hostile.py): the same bytes go out on every refused
call (built once, so the client's own JSON encoding costs the shared event loop nothing per call).
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc

from lookahead_rag.bench.hostile_h2 import HeadersOnly
from lookahead_rag.services.retriever.documents import Document
from lookahead_rag.services.retriever.ingest_cli import send

MIB = 1024 * 1024
ANSWER_PATH = "/lookahead_rag.v1.Generator/Answer"  # the victim's door the holder's streams name
DOCUMENTS_ROUTE = "/v1/documents"  # the OpenAI door's upload route
INGEST_TIMEOUT_S = 600.0  # one Ingest call of a 4 MiB document: minutes of embedding on a small CPU
HTTP_TIMEOUT_S = 60.0  # one refused POST: its body sent and its status read
MESSAGE_CHARS = 160  # how much of a refusal's message the JSON keeps (one per outcome)
HOLD_POLL_S = 0.1  # how often the holder looks for answered streams and opens new ones in their place
MAX_STREAM_ID = 2**31 - 1  # HTTP/2: a connection's stream ids end here (a new connection then)
OK = "OK"  # an accepted call's outcome


def filler_text(passages: Sequence[str], chars: int) -> str:
    """``chars`` characters of real prose: the passages joined and repeated (the embedding model's usual input)."""
    if chars <= 0 or not any(passages):
        raise ValueError("filler needs a positive length and some text")
    base = " ".join(p for p in passages if p)
    return (base + " ") * (chars // (len(base) + 1)) + base[: chars % (len(base) + 1)]


def oversized_title_document(doc_id: str, text: str, title_chars: int) -> Document:
    """The refused upload: ``text`` under a title of ``title_chars`` characters (finding 1: repeated per chunk)."""
    return Document(doc_id, "T" * title_chars, text, f"{doc_id}.md")


def accepted_document(n: int, text: str) -> Document:
    """The ``n``-th accepted upload: a fresh id and title (so every chunk is embedded anew), a short title."""
    return Document(f"upload-{n}", f"Upload {n}", text, f"upload-{n}.md")


def http_body(docs: Sequence[Document]) -> bytes:
    """``POST /v1/documents``'s JSON body for ``docs``."""
    return json.dumps({"documents": [{"id": d.id, "title": d.title, "text": d.text, "source": d.source}
                                     for d in docs]}).encode()


@dataclass
class Doors:
    """Where the attackers and the victim knock, and what stands there."""

    grpc: str  # the generator's gRPC door: HOST:PORT (the proxy's when it runs)
    http: str  # the OpenAI door's base URL (the proxy's when it runs)
    retriever: str  # the retriever's gRPC door (Ingest): HOST:PORT (no proxy fronts it)
    via: str  # "haproxy (deploy/haproxy/haproxy.cfg)" or "direct"


@dataclass
class UploadCounts:
    """The uploader's calls: outcome ("door:code") -> calls, a message per outcome, chunks embedded."""

    outcomes: Counter[str] = field(default_factory=Counter)
    messages: dict[str, str] = field(default_factory=dict)
    chunks_embedded: int = 0  # chunks of accepted uploads, as the retriever replied
    in_flight: int = 0  # accepted uploads sent and not yet answered (embedding) when the run ended

    def note(self, outcome: str, message: str = "") -> None:
        self.outcomes[outcome] += 1
        self.messages.setdefault(outcome, message[:MESSAGE_CHARS])

    def as_json(self) -> dict[str, object]:
        return {"outcomes": dict(sorted(self.outcomes.items())), "messages": self.messages,
                "chunks_embedded": self.chunks_embedded, "accepted_in_flight": self.in_flight}


@dataclass(frozen=True)
class UploadPlan:
    """What the uploader sends."""

    tenant: str  # its own tenant (its key has write scope)
    text: str  # every upload's text (4 MiB)
    title_chars: int  # the refused uploads' title length (2 MiB)
    http_body_bytes: int  # the OpenAI door's body limit ([http] max_body_bytes): its refused upload fits under it


def http_refused_body(plan: UploadPlan) -> bytes:
    """The refused ``POST /v1/documents`` body: the oversized title and as much of the text as keeps the body
    under the door's limit (a larger body is a 413 before its title is read, not the title's 400)."""
    def body(chars: int) -> bytes:
        return http_body([oversized_title_document("big-title", plan.text[:chars], plan.title_chars)])

    if len(body(0)) > plan.http_body_bytes:
        raise ValueError(f"a {plan.title_chars}-character title alone does not fit a {plan.http_body_bytes}-byte body")
    fits, over = 0, len(plan.text) + 1  # the longest prefix of the text that fits (escapes take several bytes)
    while over - fits > 1:
        mid = (fits + over) // 2
        fits, over = (mid, over) if len(body(mid)) <= plan.http_body_bytes else (fits, mid)
    return body(fits)


def post_documents(base: str, tenant: str, key: str, body: bytes) -> tuple[str, str]:
    """One ``POST /v1/documents``: ("http:<status>", the reply's text) or ("http:<error>", why)."""
    request = urllib.request.Request(base + DOCUMENTS_ROUTE, data=body, method="POST", headers={
        "content-type": "application/json", "authorization": f"Bearer {key}", "x-tenant": tenant})
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as reply:
            return f"http:{reply.status}", reply.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return f"http:{exc.code}", exc.read().decode(errors="replace")
    except OSError as exc:  # the door closed on a body it would not read: a refusal too, without a status
        return f"http:{type(exc).__name__}", str(exc)


async def ingest(doors: Doors, tenant: str, key: str, doc: Document) -> tuple[str, str, int]:
    """One retriever Ingest of ``doc`` (``lookahead-rag ingest``'s client): (outcome, message, chunks)."""
    try:
        _, chunks, _ = await send(doors.retriever, tenant, [doc], 1, INGEST_TIMEOUT_S, progress=False, key=key)
    except grpc.aio.AioRpcError as exc:
        return f"grpc:{exc.code().name}", exc.details() or "", 0
    return f"grpc:{OK}", "", chunks


async def refuse_loop(doors: Doors, key: str, plan: UploadPlan, counts: UploadCounts) -> None:
    """Oversized titles back to back, alternately over Ingest (the whole text) and ``POST /v1/documents`` (the
    text the door's body limit leaves): each one refused."""
    doc = oversized_title_document("big-title", plan.text, plan.title_chars)
    body = http_refused_body(plan)  # built once: the same bytes every time
    while True:
        outcome, message, _ = await ingest(doors, plan.tenant, key, doc)
        counts.note(outcome, message)
        outcome, message = await asyncio.to_thread(post_documents, doors.http, plan.tenant, key, body)
        counts.note(outcome, message)


async def accept_loop(doors: Doors, key: str, plan: UploadPlan, counts: UploadCounts) -> None:
    """4 MiB documents with a short title back to back over Ingest: each one chunked and embedded."""
    n = 0
    while True:
        counts.in_flight = 1
        outcome, message, chunks = await ingest(doors, plan.tenant, key, accepted_document(n, plan.text))
        counts.in_flight = 0
        counts.note(outcome, message)
        counts.chunks_embedded += chunks
        n += 1


async def uploader(doors: Doors, key: str, plan: UploadPlan, refused: UploadCounts, accepted: UploadCounts) -> None:
    """Both loops at once, each counting its own calls, until cancelled."""
    await asyncio.gather(refuse_loop(doors, key, plan, refused), accept_loop(doors, key, plan, accepted))


@dataclass
class HoldCounts:
    """The holder's streams: opened, answered (a reply or a reset: the door's request timeout), held now."""

    opened: int = 0
    answered: int = 0
    connections: int = 0
    held_now: dict[int, int] = field(default_factory=dict)  # connection -> streams it holds unanswered now
    samples: list[int] = field(default_factory=list)  # streams held, at each look of the run's sampler

    def held(self) -> int:
        return sum(self.held_now.values())

    def as_json(self) -> dict[str, object]:
        mean = sum(self.samples) / len(self.samples) if self.samples else None
        return {"opened": self.opened, "answered": self.answered, "connections": self.connections,
                "held_peak": max(self.samples, default=0), "held_mean": None if mean is None else round(mean, 1)}


async def hold_connection(target: str, tenant: str, per_connection: int, slot: int, counts: HoldCounts) -> None:
    """One connection after another, each keeping ``per_connection`` headers-only streams open: a stream the
    door answers is replaced at once."""
    headers = [("x-tenant", tenant)]  # the victim's tenant, no key
    while True:
        async with HeadersOnly(target, ANSWER_PATH) as conn:
            counts.connections += 1
            seen = 0
            while not conn.closed_by_peer.is_set() and conn.next_stream + 2 * per_connection < MAX_STREAM_ID:
                held = len(conn.unanswered())
                if held < per_connection:
                    await conn.open(per_connection - held, headers)
                    counts.opened += per_connection - held
                counts.held_now[slot] = len(conn.unanswered())
                counts.answered += len(conn.answered) - seen
                seen = len(conn.answered)
                await asyncio.sleep(HOLD_POLL_S)
            counts.held_now[slot] = 0


async def holder(target: str, tenant: str, connections: int, per_connection: int, counts: HoldCounts) -> None:
    """``connections`` connections of ``per_connection`` held streams each, until cancelled."""
    await asyncio.gather(*(hold_connection(target, tenant, per_connection, slot, counts)
                           for slot in range(connections)))
