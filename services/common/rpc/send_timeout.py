"""One send of a response stream, bounded by the stream's send timeout (``[generator] stream_send_timeout_s``).

A send waits while the client's flow-control window is full (gRPC's ``context.write``; an ASGI ``send``
under uvicorn's flow control): a client that stops reading without disconnecting would hold it, and
everything its stream holds, for ever. ``send_within`` bounds the wait: past it the send is abandoned
and ``SendTimeout`` raised, which ends the stream (its request is cancelled in the engine, its
tenant's stream slot freed; gRPC: DEADLINE_EXCEEDED, HTTP: the connection is closed).

    await send_within(context.write(message), settings.stream_send_timeout_s)
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from lookahead_rag.services.common.errors import SendTimeout

T = TypeVar("T")


async def send_within(send: Awaitable[T], timeout_s: float) -> T:
    """``await send``; SendTimeout when the client has not taken it within ``timeout_s``."""
    timeout = asyncio.timeout(timeout_s)
    try:
        async with timeout:
            return await send
    except TimeoutError:
        if timeout.expired():
            raise SendTimeout(timeout_s) from None
        raise  # the send's own TimeoutError
