"""A request's stream read ahead of its consumer, so that what the request holds is freed when it ends.

The generator's stream (retrieve -> decode -> final, ``GeneratorCore``) is read by a task of its own
into a queue, as fast as the generator makes it; the consumer (a gRPC write or an HTTP send, which waits
while the client does not read) takes from the queue at its own pace. When the generator's stream ends,
with its final message, an error or a cancel, ``on_end`` runs at once (the tenant's stream slot is
freed) and the frames that held the request (its ticket, trie, drafting state) are done, however long
the consumer still waits on a send. What waits for the consumer is the answer's chunks, at most one
per verified step. Closing the consumer's side (the client went away, a send timed out) cancels the
reading task, which cancels the request in the engine.

    async for chunk in read_ahead(generator_chunks, on_end=release_slot): ...
"""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class _End:
    """The stream ended: whole (``error`` None), or broken off by ``error`` (raised to the consumer there)."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


class _Item(Generic[T]):
    def __init__(self, chunk: T) -> None:
        self.chunk = chunk


async def _pump(chunks: AsyncIterator[T], queue: asyncio.Queue[_Item[T] | _End], on_end: Callable[[], None]) -> None:
    """Read ``chunks`` to their end into ``queue`` (then an ``_End``), and call ``on_end``."""
    try:
        async for chunk in chunks:
            queue.put_nowait(_Item(chunk))
        queue.put_nowait(_End())
    except Exception as exc:  # the request's error (a status), for the consumer after what came before it
        traceback.clear_frames(exc.__traceback__)  # its frames' locals (the request's ticket, trie) go now
        queue.put_nowait(_End(exc))
    except BaseException as exc:  # cancelled: by read_ahead's consumer going away, or from inside
        queue.put_nowait(_End(exc))
        raise
    finally:
        on_end()


async def read_ahead(chunks: AsyncIterator[T], on_end: Callable[[], None]) -> AsyncGenerator[T, None]:
    """``chunks``, read to their end by a task of their own as they come; ``on_end()`` once they end.
    Closing this stream cancels the reading (and closes ``chunks``)."""
    queue: asyncio.Queue[_Item[T] | _End] = asyncio.Queue()  # unbounded: at most the answer's chunks
    task = asyncio.ensure_future(_pump(chunks, queue, on_end))
    try:
        while isinstance(item := await queue.get(), _Item):
            yield item.chunk
        if item.error is not None:
            raise item.error
    finally:
        if not task.done():
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)  # the generator stream's own finally has run
        await chunks.aclose()  # type: ignore[attr-defined]
