"""The side-channel-safe stream's pure parts (services/generator/safe_stream.py), with a byte-level fake
tokenizer and fake engine streams: equal delta sizes, whole characters, text over the budget carried,
the zeroed final, the cadence, errors and cancellation. The real model: tests/pipeline/test_generator_safe_stream.py."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
from lookahead_core.detok import TextStreamer

from lookahead_rag.services.common.errors import InvalidArgument
from lookahead_rag.services.generator.convert import MIN_PADDING, chunk_to_proto, delta_to_proto, pad, padded_bytes
from lookahead_rag.services.generator.domain import AnswerChunk, DocumentChunk, FinalInfo, GenerationStats, TextDelta
from lookahead_rag.services.generator.safe_stream import (
    Chunker,
    SafeStreamConfig,
    max_token_bytes,
    safe_final,
    safe_stream,
    text_budget,
    utf8_prefix,
)
from lookahead_rag.v1 import generator_pb2

# id -> bytes: ASCII words, the two halves of "é", a 4-byte emoji, and a long token
VOCAB = [b"a", b"bc", b"\xc3", b"\xa9", "😀".encode(), b" hello", b"de", b"x" * 20]
A, BC, E1, E2, EMOJI, HELLO, DE, LONG = range(len(VOCAB))
EPS_S = 0.01  # the event loop may wake a timer up to its clock resolution early


class ByteTokenizer:
    """Each id is a byte string; decoding joins them (an incomplete character decodes as U+FFFD)."""

    def __len__(self) -> int:
        return len(VOCAB)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return b"".join(VOCAB[i] for i in ids).decode("utf-8", errors="replace")

    def get_vocab(self) -> dict[str, int]:
        return {piece.decode("latin-1"): i for i, piece in enumerate(VOCAB)}  # one character per byte


TOK = ByteTokenizer()


def chunker(chunk_tokens: int, text_bytes: int | None = None, stops: Sequence[str] = ()) -> Chunker:
    budget = text_bytes if text_bytes is not None else text_budget(chunk_tokens, max_token_bytes(TOK))
    return Chunker(TextStreamer(TOK, stops), SafeStreamConfig(0.01, chunk_tokens, budget))  # type: ignore[arg-type]


def drain(c: Chunker, ids: list[int]) -> list[TextDelta]:
    """All deltas of an answer of ``ids`` verified at once."""
    c.add(ids)
    out = []
    while c.ready(done=True):
        out.append(c.next(done=True))
    return out


def sizes(deltas: list[TextDelta]) -> set[int]:
    """The deltas' sizes on the wire (gRPC)."""
    return {chunk_to_proto(d).ByteSize() for d in deltas}


@pytest.mark.parametrize(("text", "limit", "head"), [
    ("héllo", 2, "h"),  # é (2 bytes) does not fit after h: it waits, never cut in two
    ("héllo", 3, "hé"),
    ("😀a", 3, ""),  # a 4-byte character over the limit stays whole in the rest
    ("abc", 10, "abc"),
])
def test_utf8_prefix_keeps_whole_characters(text: str, limit: int, head: str) -> None:
    got, rest = utf8_prefix(text, limit)
    assert (got, got + rest) == (head, text)
    assert len(got.encode()) <= limit


def test_pad_makes_every_delta_the_same_size() -> None:
    # the largest possible delta (budget text, max ids) and the smallest (empty) pad to one size
    config = SafeStreamConfig(0.1, 4, 40)
    deltas = [generator_pb2.TextDelta(text="x" * 40, token_ids=[2**32 - 1] * 4), generator_pb2.TextDelta(),
              generator_pb2.TextDelta(text="é😀", token_ids=[1]), generator_pb2.TextDelta(text="y" * 39, token_ids=[])]
    padded = [pad(d, padded_bytes(config.delta_bytes)) for d in deltas]
    assert {d.ByteSize() for d in padded} == {padded_bytes(config.delta_bytes)}
    assert len({generator_pb2.AnswerChunk(delta=d).ByteSize() for d in padded}) == 1
    assert min(len(d.padding) for d in padded) == MIN_PADDING


def test_a_safe_delta_is_padded_on_the_wire_and_a_normal_one_is_not() -> None:
    config = SafeStreamConfig(0.1, 4, 40)
    safe = delta_to_proto(TextDelta("ab", (1, 2), safe_bytes=config.delta_bytes))
    assert safe.ByteSize() == padded_bytes(config.delta_bytes) and len(safe.padding) >= MIN_PADDING
    assert (safe.text, list(safe.token_ids)) == ("ab", [1, 2])
    assert delta_to_proto(TextDelta("ab", (1, 2))) == generator_pb2.TextDelta(text="ab", token_ids=[1, 2])


def test_pad_refuses_a_delta_over_the_size() -> None:
    # the chunker never builds one; if it did, the stream must fail rather than leak its size
    with pytest.raises(ValueError, match="does not fit"):
        pad(generator_pb2.TextDelta(text="x" * 200), padded_bytes(SafeStreamConfig(0.1, 1, 10).delta_bytes))


def test_chunks_have_chunk_tokens_ids_and_the_last_fewer() -> None:
    deltas = drain(chunker(2), [A, BC, DE, A, HELLO])
    assert [list(d.token_ids) for d in deltas] == [[A, BC], [DE, A], [HELLO]]
    assert "".join(d.text for d in deltas) == "abcdea hello"
    assert len(sizes(deltas)) == 1


def test_a_character_split_over_chunks_comes_whole() -> None:
    # "é" is two tokens; with one token per chunk the first chunk holds nothing back to front
    deltas = drain(chunker(1), [A, E1, E2, EMOJI])
    assert [d.text for d in deltas] == ["a", "", "é", "😀"]
    assert len(sizes(deltas)) == 1


def test_text_over_the_budget_rides_in_later_chunks() -> None:
    # 20-byte tokens with a 5-byte budget: the text comes out in order, in extra chunks without ids
    deltas = drain(chunker(1, text_bytes=5), [LONG, A])
    assert "".join(d.text for d in deltas) == "x" * 20 + "a"
    assert [list(d.token_ids) for d in deltas][:2] == [[LONG], [A]]
    assert all(len(d.text.encode()) <= 5 for d in deltas)
    assert len(sizes(deltas)) == 1


def test_stop_strings_cut_the_text_as_the_engine_does() -> None:
    ids = [A, BC, DE, HELLO]
    expected = TextStreamer(TOK, ["cd"])  # type: ignore[arg-type]
    whole = expected.push(ids) + expected.finish()
    deltas = drain(chunker(1, stops=["cd"]), ids)
    assert "".join(d.text for d in deltas) == whole == "ab"


def test_not_ready_until_a_full_chunk_unless_done() -> None:
    c = chunker(3)
    c.add([A, BC])
    assert not c.ready(done=False)  # two of three: wait
    c.add([DE])
    assert c.ready(done=False)
    c.next(done=False)
    c.add([A])
    assert not c.ready(done=False) and c.ready(done=True)  # the last, partial chunk leaves once decoding ended


def test_safe_final_says_only_that_the_answer_is_complete() -> None:
    stats = GenerationStats(
        new_tokens=8, forward_steps=3, mean_accepted_per_step=2.7, prefill_s=0.1, wall_s=1.0, finish_reason="length",
        draft_tokens_from_cache=5, draft_tokens_from_prompt=1, kernel="sdpa", time_to_first_token_s=0.2,
        prefix_hit_tokens=30, documents_available=True, drafts_available=True, mean_batch_size=1.0, seed=7)
    final = FinalInfo(request_id="r1", answer_text="secret answer", stats=stats, prompt_ids=(1, 2),
                      output_ids=(3, 4), documents=(DocumentChunk("d", "d#0", "", "", "a document", 0.5),))
    expected = FinalInfo(request_id="r1", stats=GenerationStats(new_tokens=8, finish_reason="length"))
    assert safe_final(final) == expected
    on_the_wire = generator_pb2.FinalInfo(request_id="r1")
    on_the_wire.stats.new_tokens, on_the_wire.stats.finish_reason = 8, "length"
    assert chunk_to_proto(safe_final(final)).final == on_the_wire  # nothing else on the wire either


# ---- the cadence, with fake engine streams ------------------------------------------------------------
def final_chunk(n: int) -> FinalInfo:
    return FinalInfo(request_id="r", stats=GenerationStats(new_tokens=n, forward_steps=2, finish_reason="length"))


async def engine_stream(steps: list[list[int]], step_s: float = 0.0,
                        closed: asyncio.Event | None = None) -> AsyncIterator[AnswerChunk]:
    """An engine's stream: one delta per step, ``step_s`` apart, then the final."""
    try:
        for ids in steps:
            if step_s:
                await asyncio.sleep(step_s)
            yield TextDelta(text="ignored", token_ids=tuple(ids))
        yield final_chunk(sum(map(len, steps)))
    finally:
        if closed is not None:
            closed.set()


async def timed(stream: AsyncIterator[AnswerChunk]) -> list[tuple[float, AnswerChunk]]:
    loop = asyncio.get_running_loop()
    start = loop.time()
    return [(loop.time() - start, chunk) async for chunk in stream]


@pytest.mark.asyncio
async def test_fast_decoding_leaves_one_chunk_per_tick() -> None:
    # a whole answer verified at once (a cache hit) still leaves one chunk per tick
    interval = 0.05
    got = await timed(safe_stream(engine_stream([[A, BC, DE, A, HELLO, A]]), chunker(2), interval))
    deltas = [(t, c) for t, c in got if isinstance(c, TextDelta)]
    assert [list(d.token_ids) for _, d in deltas] == [[A, BC], [DE, A], [HELLO, A]]
    for k, (t, _) in enumerate(deltas, start=1):
        assert t >= k * interval - EPS_S  # never before its tick
    last = got[-1][1]
    assert isinstance(last, FinalInfo) and got[-1][0] - deltas[-1][0] < interval  # the final with the last chunk
    assert last.stats.forward_steps == 0


@pytest.mark.asyncio
async def test_slow_decoding_skips_ticks_never_bursts() -> None:
    # decoding slower than the cadence: deltas still come at least one interval apart
    interval = 0.03
    got = await timed(safe_stream(engine_stream([[A]] * 4, step_s=0.07), chunker(1), interval))
    times = [t for t, c in got if isinstance(c, TextDelta)]
    assert len(times) == 4
    assert all(b - a >= interval - EPS_S for a, b in itertools.pairwise(times))


async def failing_stream() -> AsyncIterator[AnswerChunk]:
    raise InvalidArgument("question is empty")
    yield  # an async generator


@pytest.mark.asyncio
async def test_an_error_is_raised_at_once_not_at_the_tick() -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(InvalidArgument, match="question is empty"):
        await timed(safe_stream(failing_stream(), chunker(2), interval_s=30.0))
    assert loop.time() - start < 5.0


@pytest.mark.asyncio
async def test_closing_the_safe_stream_closes_the_engine_stream() -> None:
    # the client goes away after the first chunk: the engine's stream is closed (its request cancelled)
    closed = asyncio.Event()
    stream = safe_stream(engine_stream([[A]] * 100, step_s=0.01, closed=closed), chunker(1), 0.02)
    first = await anext(stream)
    assert isinstance(first, TextDelta) and not closed.is_set()
    await stream.aclose()  # type: ignore[attr-defined]
    assert closed.is_set()


# ---- bench-serve's on_safe and on_tls ways --------------------------------------------------------
def test_bench_serve_cost_ways_parse_in_run_order() -> None:
    from lookahead_rag.bench.serve_args import parse_args

    assert parse_args(["--ways", "on_safe,on,on_tls"]).ways == ["on", "on_tls", "on_safe"]
    assert parse_args([]).ways == ["on", "off", "serial_hf"]  # the cost ways are asked for by name
    with pytest.raises(SystemExit):
        parse_args(["--ways", "on,tls"])


def test_bench_serve_tls_stack_serves_and_verifies_a_run_time_ca(tmp_path: Path) -> None:
    from lookahead_rag.bench.serve_stack import StackConfig

    stack = StackConfig(tmp_path, "smollm2-135m-instruct", 8, 1, 0, 10.0)
    tls = stack.settings("on_tls", tls=True).tls
    assert tls.server_enabled and tls.client_enabled and not tls.mutual
    assert tls.ca_file is not None and tls.ca_file.read_bytes().startswith(b"-----BEGIN CERTIFICATE-----")
    assert stack.settings("on_tls-2", tls=True).tls.ca_file == tls.ca_file  # one CA per run
    assert not stack.settings("on").tls.server_enabled  # the other ways stay plaintext


class FakeStub:
    """A Generator stub whose Answer streams two padded deltas and a safe final, recording the request."""

    def __init__(self) -> None:
        self.requests: list[generator_pb2.AnswerRequest] = []

    def Answer(self, request: generator_pb2.AnswerRequest, timeout: float,
               metadata: tuple[tuple[str, str], ...] = ()) -> AsyncIterator[generator_pb2.AnswerChunk]:
        self.requests.append(request)

        async def chunks() -> AsyncIterator[generator_pb2.AnswerChunk]:
            for ids in ([A, BC], [DE]):
                yield generator_pb2.AnswerChunk(delta=generator_pb2.TextDelta(token_ids=ids, padding=b"\0" * 9))
            yield chunk_to_proto(safe_final(final_chunk(3)))

        return chunks()


@pytest.mark.asyncio
async def test_bench_serve_client_asks_for_the_safe_stream_and_counts_its_tokens() -> None:
    from lookahead_rag.bench.serve_client import one_request
    from lookahead_rag.bench.serve_load import Question

    stub = FakeStub()
    question = Question(qid="q1", tenant="acme", question="q")
    rec = await one_request(stub, 0, question, "", 8, 10.0, safe_stream=True)
    assert stub.requests[0].params.safe_stream
    assert rec.completed and rec.output_ids == [A, BC, DE]  # the final has no ids: the streamed ones count
    assert [n for _, n in rec.deltas] == [2, 1]
