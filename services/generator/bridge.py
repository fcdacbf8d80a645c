"""One request's bridge from the engine's thread to its event loop: the scheduler's callbacks post typed
messages (a verified step, then the end) that the request's stream reads in order.

    bridge = Bridge()                                 # on the request's loop
    ServeRequest(..., on_tokens=bridge.on_tokens, on_done=bridge.on_done)
    message = await bridge.get()                      # Verified ... then one Ended
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from lookahead_core.serving import ServeRequest

from lookahead_rag.services.generator.domain import TokenLogprob
from lookahead_rag.services.generator.logprobs import step_logprobs


@dataclass(frozen=True, slots=True)
class Verified:
    """A step's verified tokens."""

    ids: tuple[int, ...]  # the tokens the step emitted, in order
    logprobs: tuple[TokenLogprob, ...]  # one per token when the request asked for them, else empty


@dataclass(frozen=True, slots=True)
class Ended:
    """The request left the engine (its last message)."""

    error: BaseException | None  # why it ended early (RequestExpired: its deadline); None: it finished


class Bridge:
    """Messages from the engine's thread to the loop that built this bridge, in the order posted."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.messages: asyncio.Queue[Verified | Ended] = asyncio.Queue()

    def post(self, message: Verified | Ended) -> None:
        """Hand ``message`` to the loop (any thread)."""
        with contextlib.suppress(RuntimeError):  # the loop is gone (shutdown): nobody listens any more
            self.loop.call_soon_threadsafe(self.messages.put_nowait, message)

    def on_tokens(self, req: ServeRequest, ids: list[int]) -> None:
        """``ServeRequest.on_tokens``: the engine's thread, as it announces ``req``'s step."""
        self.post(Verified(tuple(ids), step_logprobs(req, len(ids))))

    def on_done(self, _req: ServeRequest, error: BaseException | None) -> None:
        """``ServeRequest.on_done``: the engine is done with the request."""
        self.post(Ended(error))

    async def get(self) -> Verified | Ended:
        return await self.messages.get()
