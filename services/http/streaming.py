"""Server-sent events and the client going away.

A client that disconnects cancels its request in the generator, as a gRPC cancel does:

* before the response starts (a whole answer, or a stream's first chunk), ``or_disconnect`` runs
  the work beside a watch on the connection and cancels the work when the client leaves;
* mid-stream, Starlette cancels the streaming task; ``ClosingStreamingResponse`` then closes the
  body iterator at once (not whenever it is garbage-collected), which closes the generator's stream,
  whose ``finally`` cancels the request in the scheduler.

A client that stops reading without disconnecting fills the connection's buffers, and a send then
waits (uvicorn's flow control): past ``[generator] stream_send_timeout_s`` ``ClosingStreamingResponse``
gives up the send, closes the body iterator (the request is cancelled, its slot freed) and returns
with the response unfinished, so the server closes the connection (no ``data: [DONE]``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterable, Awaitable, Callable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from lookahead_rag.services.common.errors import SendTimeout
from lookahead_rag.services.common.rpc.send_timeout import send_within

log = logging.getLogger(__name__)

T = TypeVar("T")
SSE_MEDIA_TYPE = "text/event-stream"
DONE = b"data: [DONE]\n\n"
JSON_BYTES_PER_BYTE = 11  # most JSON bytes one byte of a delta's text or ids makes (an id: 10 digits and a comma)


class ClientDisconnected(Exception):
    """The client closed the connection before the response was ready."""


def sse(obj: dict[str, Any]) -> bytes:
    """One ``data:`` event with ``obj`` as compact JSON."""
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def padded_sse(obj: dict[str, Any], size: int) -> bytes:
    """``sse(obj)`` with a ``"padding"`` field of spaces making it ``size`` bytes (as is when it is larger)."""
    base = len(sse({**obj, "padding": ""}))
    return sse({**obj, "padding": " " * max(0, size - base)})


def safe_event_bytes(largest: dict[str, Any], safe_bytes: int) -> int:
    """The size of every event of a safe stream's deltas: the ``largest`` empty delta chunk, plus what
    the text and ids of a delta of at most ``safe_bytes`` serialized bytes (``TextDelta.safe_bytes``)
    can take in JSON at most."""
    return len(sse({**largest, "padding": ""})) + JSON_BYTES_PER_BYTE * safe_bytes


async def _disconnected(request: Request) -> None:
    """Returns once the client has gone (the body is already read: nothing else can arrive)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def or_disconnect(request: Request, work: Awaitable[T]) -> T:
    """``await work``, cancelled if the client disconnects first (then ClientDisconnected)."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():  # the client left (or we are cancelled ourselves): the work stops too
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task in done:
        return task.result()
    raise ClientDisconnected("the client closed the connection")

class ClosingStreamingResponse(StreamingResponse):
    """A StreamingResponse that closes its body iterator however the stream ends, and ends the stream
    when one send waits past ``send_timeout_s`` (the client stopped reading)."""

    def __init__(self, content: AsyncIterable[bytes], send_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.send_timeout_s = send_timeout_s

    async def stream_response(self, send: Send) -> None:
        async def timed(message: Message) -> None:
            await send_within(send(message), self.send_timeout_s)

        try:
            await super().stream_response(timed)
        except SendTimeout as exc:  # unfinished: the server closes the connection once this returns
            log.info("stream ended: %s", exc)
        finally:
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                await close()


class TimedJSONResponse(JSONResponse):
    """A whole JSON reply whose sending gives up past ``send_timeout_s`` (``[generator]
    stream_send_timeout_s``), as a stream's does: a client that stops reading holds it no longer (the
    server closes the connection with the reply unfinished)."""

    def __init__(self, content: Any, send_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.send_timeout_s = send_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def timed(message: Message) -> None:
            await send_within(send(message), self.send_timeout_s)

        try:
            await super().__call__(scope, receive, timed)
        except SendTimeout as exc:
            log.info("reply ended: %s", exc)


async def json_reply(build: Callable[[], dict[str, Any]], send_timeout_s: float,
                     headers: dict[str, str] | None = None) -> TimedJSONResponse:
    """The reply ``build`` makes, built and serialized on a worker thread (many choices' logprobs never
    hold the event loop), sent within ``send_timeout_s``."""
    return await asyncio.to_thread(lambda: TimedJSONResponse(build(), send_timeout_s, headers=headers))
