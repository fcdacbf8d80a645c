"""Several choices for one request (OpenAI's ``n``), and the request extensions every route shares.

Each choice is its own generator request, run concurrently in the batch: choice 0 keeps the request's
seed, choice i > 0 a seed derived from it (``choice_seeds``), so the same request gives the same
choices. ``n > 1`` needs sampling (temperature > 0): greedy choices would all be the same answer.

    n = check_n(body.n, body.temperature, body.safe_stream)
    streams = [generator.generate(query_i, ...) for query_i in ...]
    results = await collect_all(streams, when)         # a whole answer per choice: final + logprobs
    async for index, chunk in merged(firsts, streams, when): ...   # streams interleaved by choice
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import AsyncIterator, Coroutine, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from lookahead_rag.services.common.errors import DeadlineExceeded, Unavailable
from lookahead_rag.services.generator.domain import AnswerChunk, FinalInfo, GenerationParams, TextDelta, TokenLogprob
from lookahead_rag.services.http.errors import InvalidParam

MAX_CHOICES = 16  # most choices one request may ask (each is a generator request and a stream of the tenant's quota)
SEED_BYTES = 8  # a derived seed is 64 bits, as the request's
Chunks = AsyncIterator[AnswerChunk]
T = TypeVar("T")


def check_n(n: int | None, temperature: float | None, safe_stream: bool) -> int:
    """The number of choices asked (omitted: 1); a one-line InvalidParam naming ``n`` when it cannot be served."""
    count = 1 if n is None else n
    if not 1 <= count <= MAX_CHOICES:
        raise InvalidParam("n", f"n={count} is out of range (1..{MAX_CHOICES})")
    if count > 1 and not (temperature or 0.0) > 0:
        raise InvalidParam("n", f"n={count} needs sampling (temperature > 0): greedy choices would all be the same")
    if count > 1 and safe_stream:
        raise InvalidParam("n", f"n={count}: a safe stream serves one choice")
    return count


def choice_seeds(seed: int | None, n: int) -> list[int | None]:
    """Each choice's seed: the request's for choice 0, one derived from it (and the choice's index) for the
    others; no seed: each choice draws its own random one (reported in its final stats)."""
    if seed is None:
        return [None] * n
    derived = [int.from_bytes(hashlib.blake2b(f"{seed}/{i}".encode(), digest_size=SEED_BYTES).digest())
               for i in range(1, n)]
    return [seed, *derived]


def extended(params: GenerationParams, mode: str | None, logprobs: bool, top_logprobs: int | None) -> GenerationParams:
    """``params`` with the fields the OpenAI requests add: the draft ``mode`` (our extension), logprobs."""
    return replace(params, mode=mode or params.mode, logprobs=logprobs, top_logprobs=top_logprobs or 0)


# ---- reading the generator's streams ----------------------------------------------------------------
def loop_deadline(deadline: float | None) -> float | None:
    """A time.monotonic() deadline on the running loop's clock (what asyncio.timeout_at takes)."""
    if deadline is None:
        return None
    return asyncio.get_running_loop().time() + (deadline - time.monotonic())


def check_final(final: FinalInfo, deadline: float | None) -> None:
    """An answer the generator ended itself (its deadline passed while running, or it is closing) is an error."""
    if final.stats.finish_reason != "cancelled":
        return
    if deadline is not None and time.monotonic() >= deadline:
        raise DeadlineExceeded("deadline exceeded while decoding")
    raise Unavailable("the generator stopped the request (it is shutting down)")


async def checked(chunks: AsyncIterator[tuple[int, Any]], deadline: float | None,
                  finals: list[FinalInfo]) -> AsyncIterator[tuple[int, Any]]:
    """``chunks`` (choice index, chunk) as they come; each final is checked (``check_final``) and kept in ``finals``."""
    async for i, chunk in chunks:
        if isinstance(chunk, FinalInfo):
            check_final(chunk, deadline)
            finals.append(chunk)
        yield i, chunk


async def next_chunk(chunks: Chunks, when: float | None) -> AnswerChunk | None:
    async with asyncio.timeout_at(when):
        return await anext(chunks, None)


@dataclass(frozen=True)
class Choice:
    """One choice's whole answer: its final message (text and ids filled in) and its tokens' logprobs."""

    final: FinalInfo
    logprobs: tuple[TokenLogprob, ...]


async def collect(chunks: Chunks, when: float | None) -> Choice:
    """Read one stream to its end."""
    deltas: list[TextDelta] = []
    try:
        while (chunk := await next_chunk(chunks, when)) is not None:
            if isinstance(chunk, FinalInfo):
                final = chunk
                if not (final.answer_text or final.output_ids):  # a safe stream's final leaves them to the deltas
                    final = replace(final, answer_text="".join(d.text for d in deltas),
                                    output_ids=tuple(t for d in deltas for t in d.token_ids))
                return Choice(final, tuple(lp for d in deltas for lp in d.logprobs))
            deltas.append(chunk)
        raise RuntimeError("the answer ended without its final message")
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]


async def _together(calls: Sequence[Coroutine[Any, Any, T]]) -> list[T]:
    """``calls`` run concurrently, their results in order; the first error cancels the rest and is raised
    as itself (not as an ExceptionGroup, so it maps to its status like any other)."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(call) for call in calls]
    except BaseExceptionGroup as eg:
        raise eg.exceptions[0] from None
    return [t.result() for t in tasks]


async def collect_all(streams: Sequence[Chunks], when: float | None, deadline: float | None) -> list[Choice]:
    """Every stream to its end, concurrently (the first error cancels the others and is raised)."""
    choices = await _together([collect(s, when) for s in streams])
    for c in choices:
        check_final(c.final, deadline)
    return choices


async def firsts(streams: Sequence[Chunks], when: float | None) -> list[AnswerChunk | None]:
    """The first chunk of every stream (before the response starts: an error there keeps its status)."""
    return await _together([next_chunk(s, when) for s in streams])


async def merged(first: Sequence[AnswerChunk | None], streams: Sequence[Chunks],
                 when: float | None) -> AsyncIterator[tuple[int, AnswerChunk]]:
    """``(choice index, chunk)`` of every stream as they come (``first``: each one's first chunk, read
    already); a stream's error ends them all. Every stream is closed however this ends."""
    queue: asyncio.Queue[tuple[int, AnswerChunk | BaseException | None]] = asyncio.Queue()

    async def pump(i: int) -> None:
        try:
            while (chunk := await anext(streams[i], None)) is not None:
                await queue.put((i, chunk))
            await queue.put((i, None))
        except Exception as exc:  # handed to the reader, which ends every stream
            await queue.put((i, exc))

    for i, chunk in enumerate(first):
        if chunk is not None:
            yield i, chunk
    open_ = {i for i, chunk in enumerate(first) if chunk is not None and not isinstance(chunk, FinalInfo)}
    tasks = [asyncio.create_task(pump(i)) for i in sorted(open_)]
    try:
        while open_:
            async with asyncio.timeout_at(when):
                i, item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            if item is None:  # after its final (no longer open) it is only the stream's end
                if i in open_:
                    raise RuntimeError("the answer ended without its final message")
                continue
            if isinstance(item, FinalInfo):
                open_.discard(i)
            yield i, item
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t
        for s in streams:
            await s.aclose()  # type: ignore[attr-defined]

