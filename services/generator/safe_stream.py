"""Side-channel-safe streams: verified tokens leave at a fixed cadence, in fixed-size, padded chunks.

A normal stream sends each verified step as it is verified: a step that accepted a long draft (a hit
in the tenant's cache of past answers) arrives as one large delta after a short wait, a miss as many
small ones. Chunk sizes and timings then tell an observer of the encrypted stream which tokens were
drafted (Wei et al., arXiv 2411.01076; Carlini & Nasr, arXiv 2410.17175; see docs/SECURITY.md).
Here the engine's stream is re-cut, after decoding, so decoding itself is unchanged:

- a tick every ``interval_s`` from the stream's start; at each tick at most one delta leaves, and
  only a full chunk of ``chunk_tokens`` tokens (the last one may hold fewer);
- every delta has the same serialized size, whatever its text (each door pads it: gRPC's ``padding``
  field, ``lookahead_rag.services.generator.convert.pad``; HTTP's ``padding`` member of the event): a chunk's
  text is what lookahead_core's detokenizer (``TextStreamer``: whole characters, stop strings cut) makes
  of its tokens, up to ``text_bytes`` bytes; any rest rides in the next chunk;
- the final message keeps only the request id, ``finish_reason`` and ``new_tokens`` (no acceptance
  counters, timings, kernels, prompt, documents or answer ids: their sizes and values would tell).

What still shows: the number of chunks (the answer's length / chunk_tokens, which the text reveals
anyway) and, when decoding is slower than the cadence, the ticks it missed.

    chunker = Chunker(TextStreamer(tokenizer, stops), SafeStreamConfig(0.2, 4, text_bytes))
    async for chunk in safe_stream(engine_chunks, chunker, 0.2): ...
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from lookahead_core import TextStreamer

from lookahead_rag.services.generator.convert import largest_delta_bytes
from lookahead_rag.services.generator.domain import AnswerChunk, FinalInfo, GenerationStats, TextDelta

MAX_TEXT_BYTES = 8192  # most text one chunk may carry: keeps the padding under 16384 bytes
DECODED_PER_ROUND = 64  # max_token_bytes decodes the pieces with the most bytes this many at a time
Clock = Callable[[], float]


@dataclass(frozen=True)
class SafeStreamConfig:
    """The cadence and the chunk shape of a safe stream."""

    interval_s: float  # one delta at most per tick of this length
    chunk_tokens: int  # tokens per delta (the last one may hold fewer)
    text_bytes: int  # UTF-8 bytes of text one delta may carry

    @property
    def delta_bytes(self) -> int:
        """The serialized size of the largest delta, before padding (every delta is padded past it)."""
        return largest_delta_bytes(self.text_bytes, self.chunk_tokens)


def max_token_bytes(tokenizer: object) -> int:
    """The UTF-8 bytes of the longest token decoded alone (a chunk of n tokens holds at most n times that,
    bar text the detokenizer held back).

    A token decodes to no more bytes than its vocabulary piece has (byte-level BPE: one character per
    byte; SentencePiece's ``▁`` and ``<0x..>`` pieces and WordPiece's ``##`` shrink), so only the pieces
    that could beat the longest found are decoded: milliseconds, not a decode of the whole vocabulary.
    """
    bounds = {token: len(piece.encode()) for piece, token in tokenizer.get_vocab().items()}  # type: ignore[attr-defined]
    longest = 1
    while candidates := [t for t, bound in bounds.items() if bound > longest]:
        for token in heapq.nlargest(DECODED_PER_ROUND, candidates, key=bounds.__getitem__):
            longest = max(longest, len(tokenizer.decode([token]).encode()))  # type: ignore[attr-defined]
            del bounds[token]
    return longest


def text_budget(chunk_tokens: int, token_bytes: int) -> int:
    """Text bytes one chunk may carry: ``chunk_tokens`` of the longest token, within MAX_TEXT_BYTES."""
    return max(4, min(MAX_TEXT_BYTES, chunk_tokens * token_bytes))  # 4: any one character fits


def utf8_prefix(text: str, limit: int) -> tuple[str, str]:
    """``text`` split into its longest prefix of at most ``limit`` UTF-8 bytes (whole characters) and the rest."""
    encoded = text.encode()
    if len(encoded) <= limit:
        return text, ""
    head = encoded[:limit].decode(errors="ignore")  # a character cut in two is dropped from the head
    return head, text[len(head):]


class Chunker:
    """Verified token ids in, fixed-size deltas out. No clock: ``safe_stream`` keeps the cadence."""

    def __init__(self, streamer: TextStreamer, config: SafeStreamConfig) -> None:
        self.streamer = streamer
        self.config = config
        self.size = config.delta_bytes  # every delta's TextDelta.safe_bytes
        self.ids: list[int] = []  # verified, not sent yet
        self.text = ""  # decoded, not sent yet (over a chunk's text budget)
        self.finished = False  # the detokenizer's tail is in ``text``

    def add(self, ids: list[int]) -> None:
        self.ids.extend(ids)

    def ready(self, done: bool) -> bool:
        """Whether a delta can leave: a full chunk, or (``done``: decoding ended) whatever is left."""
        if len(self.ids) >= self.config.chunk_tokens:
            return True
        if not done:
            return False
        if not self.ids and not self.finished:
            self._finish()
        return bool(self.ids or self.text)

    def next(self, done: bool) -> TextDelta:
        """The next delta (call when ``ready``): up to chunk_tokens ids, their text, to be padded."""
        take, self.ids = self.ids[: self.config.chunk_tokens], self.ids[self.config.chunk_tokens:]
        self.text += self.streamer.push(take)
        if done and not self.ids and not self.finished:
            self._finish()
        text, self.text = utf8_prefix(self.text, self.config.text_bytes)
        return TextDelta(text=text, token_ids=tuple(take), safe_bytes=self.size)

    def _finish(self) -> None:
        self.text += self.streamer.finish()
        self.finished = True


def safe_final(final: FinalInfo) -> FinalInfo:
    """The final message of a safe stream: the answer is complete, and nothing about how it was made."""
    stats = GenerationStats(finish_reason=final.stats.finish_reason, new_tokens=final.stats.new_tokens)
    return FinalInfo(request_id=final.request_id, stats=stats)


async def _pump(chunks: AsyncIterator[AnswerChunk], chunker: Chunker) -> FinalInfo:
    """Feed the engine's verified tokens to ``chunker`` as they come; returns the final message."""
    async for chunk in chunks:
        if isinstance(chunk, FinalInfo):
            return chunk
        chunker.add(list(chunk.token_ids))  # its text is re-made per chunk by the chunker
    raise RuntimeError("the answer ended without its final message")


async def _until(when: float, pump: asyncio.Future[FinalInfo], clock: Clock) -> None:
    """Sleep until ``when``; a failed pump ends the wait at once (errors are not held to the cadence)."""
    delay = when - clock()
    if delay > 0 and not pump.done():
        await asyncio.wait({pump}, timeout=delay)
    if pump.done() and not pump.cancelled() and pump.exception() is not None:
        return
    delay = when - clock()
    if delay > 0:
        await asyncio.sleep(delay)


async def safe_stream(chunks: AsyncIterator[AnswerChunk], chunker: Chunker, interval_s: float,
                      clock: Clock | None = None) -> AsyncIterator[AnswerChunk]:
    """The engine's chunks re-cut: one fixed-size delta at most per tick, then the safe final.

    A tick with no full chunk ready is skipped (never a burst to catch up). Closing or cancelling
    this stream cancels the engine's (which frees the request's place in the scheduler).
    """
    now = clock or asyncio.get_running_loop().time
    start = now()
    pump = asyncio.ensure_future(_pump(chunks, chunker))
    try:
        tick = 1
        while True:
            await _until(start + tick * interval_s, pump, now)
            done = pump.done()
            if done:
                pump.result()  # the engine's error, as it raised it
            if chunker.ready(done):
                yield chunker.next(done)
            if done and not chunker.ready(done):
                yield safe_final(pump.result())
                return
            tick = max(tick + 1, int((now() - start) / interval_s) + 1)  # the next tick still ahead
    finally:
        if not pump.done():
            pump.cancel()
        await asyncio.gather(pump, return_exceptions=True)  # the engine's own finally has run
        await chunks.aclose()  # type: ignore[attr-defined]
