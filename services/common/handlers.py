"""What every server interceptor that wraps a handler needs: relay a handler's responses, whatever
its style (the observability interceptor, the auth guard and the decode guard all wrap handlers)."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator
from typing import Any


async def relay(responses: Any) -> AsyncIterator[Any]:
    """Yield a server-streaming handler's responses: an async iterator, a plain iterator, or an
    awaitable (a handler that writes with ``context.write()`` and yields nothing)."""
    if inspect.isawaitable(responses):
        await responses
    elif hasattr(responses, "__aiter__"):
        async for response in responses:
            yield response
    else:
        for response in responses:
            yield response
