"""The one place that maps errors to gRPC status codes.

Library code (retriever core, draft cache, generator) raises a ``ServiceError`` subclass with a
one-line message; the ``grpc_errors`` decorator on a grpc.aio servicer method turns it into
``context.abort(code, message)``. Anything unexpected becomes INTERNAL with a one-line message, and
its traceback goes to the log, never to the client.

    class RetrieverServicer(retriever_pb2_grpc.RetrieverServicer):
        @grpc_errors
        async def Retrieve(self, request, context): ...

        @grpc_errors
        async def Stream(self, request, context):   # async generators work the same way
            yield ...
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import grpc

log = logging.getLogger(__name__)

MAX_MESSAGE_CHARS = 300  # status details are cut here: one readable line, never a dump


class ServiceError(Exception):
    """An error a client caused or can act on; ``code`` is the gRPC status it maps to."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN


class InvalidArgument(ServiceError):
    """Bad input: empty/over-long question, out-of-range parameter, malformed document."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class ResourceExhausted(ServiceError):
    """Over a configured limit: overload, oversize message, capacity."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class NotFound(ServiceError):
    """A named thing (tenant, snapshot, model) does not exist."""

    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(ServiceError):
    """The system is not in a state where the call can run (e.g. not ready yet)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class Unavailable(ServiceError):
    """A dependency is down; retrying later may succeed."""

    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(ServiceError):
    """The call ran out of its time budget."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


def one_line(message: object, limit: int = MAX_MESSAGE_CHARS) -> str:
    """Collapse whitespace/newlines and cut to ``limit`` characters (with an ellipsis)."""
    text = " ".join(str(message).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The (code, one-line message) a raised exception maps to."""
    if isinstance(exc, ServiceError):
        return exc.code, one_line(exc)
    if isinstance(exc, TimeoutError):  # asyncio.TimeoutError is TimeoutError on 3.11
        detail = f": {exc}" if str(exc) else ""
        return grpc.StatusCode.DEADLINE_EXCEEDED, one_line(f"deadline exceeded{detail}")
    return grpc.StatusCode.INTERNAL, one_line(f"internal error: {type(exc).__name__}: {exc}")


async def _abort(context: grpc.aio.ServicerContext, exc: Exception, method: str) -> None:
    code, message = status_of(exc)
    if code is grpc.StatusCode.INTERNAL:
        log.error("%s failed", method, exc_info=exc)
    else:
        log.info("%s -> %s: %s", method, code.name, message)
    await context.abort(code, message)


Method = TypeVar("Method", bound=Callable[..., Any])


def grpc_errors(method: Method) -> Method:
    """Decorate a grpc.aio servicer method (coroutine or async generator) with the mapping."""
    name = method.__qualname__
    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def stream(self: Any, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            try:
                async for item in method(self, request, context):
                    yield item
            except (grpc.aio.AbortError, asyncio.CancelledError):
                raise  # already a status (the method aborted itself) / the client went away
            except Exception as exc:
                await _abort(context, exc, name)

        return stream  # type: ignore[return-value]

    if not inspect.iscoroutinefunction(method):
        raise TypeError(
            f"grpc_errors wraps async servicer methods; {name} is neither coroutine nor generator"
        )

    @functools.wraps(method)
    async def unary(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await method(self, request, context)
        except (grpc.aio.AbortError, asyncio.CancelledError):
            raise
        except Exception as exc:
            await _abort(context, exc, name)

    return unary  # type: ignore[return-value]


def reraise_bad_input(err: grpc.aio.AioRpcError) -> None:
    """Client side: a peer's INVALID_ARGUMENT is the caller's own bad input and stays an error
    (raised as InvalidArgument), and FAILED_PRECONDITION a set-up error (FailedPrecondition); any
    other status returns, for the caller to treat as an outage."""
    if err.code() == grpc.StatusCode.INVALID_ARGUMENT:
        raise InvalidArgument(err.details() or "invalid argument") from err
    if err.code() == grpc.StatusCode.FAILED_PRECONDITION:  # e.g. the two services serve different models
        raise FailedPrecondition(err.details() or "failed precondition") from err
