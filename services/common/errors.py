"""The one place that maps errors to gRPC status codes.

Library code (retriever core, draft cache, generator) raises a ``ServiceError`` subclass with a
one-line message; the ``grpc_errors`` decorator on a grpc.aio servicer method turns it into
``context.abort(code, message)``. Anything unexpected becomes INTERNAL with a one-line message, and
its traceback goes to the log, never to the client. A ``ResourceExhausted`` that knows when to retry
(a tenant's quota) also carries a ``google.rpc.RetryInfo`` in the status details. A ``SendTimeout`` (a
stream's client stopped reading) is DEADLINE_EXCEEDED, and its status is not waited on past the timeout.

    class RetrieverServicer(retriever_pb2_grpc.RetrieverServicer):
        @grpc_errors
        async def Retrieve(self, request, context): ...

        @grpc_errors
        async def Stream(self, request, context):   # async generators work the same way
            yield ...
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

log = logging.getLogger(__name__)

MAX_MESSAGE_CHARS = 300  # status details are cut here: one readable line, never a dump
NANOS = 1_000_000_000


class ServiceError(Exception):
    """An error a client caused or can act on; ``code`` is the gRPC status it maps to."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN


class InvalidArgument(ServiceError):
    """Bad input: empty/over-long question, out-of-range parameter, malformed document."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class ResourceExhausted(ServiceError):
    """Over a configured limit: overload, oversize message, capacity, a tenant's quota.

    ``retry_after_s``: when the caller may try again, if known (a ``google.rpc.RetryInfo`` in the
    status details over gRPC, ``Retry-After`` over HTTP).
    """

    code = grpc.StatusCode.RESOURCE_EXHAUSTED

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


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


class SendTimeout(DeadlineExceeded):
    """A stream's client took no data for ``timeout_s`` (``[generator] stream_send_timeout_s``): it stopped
    reading, and the stream is cancelled. Its status queues behind the data the client has not read, so
    ``grpc_errors`` waits at most ``timeout_s`` more for it to leave (the client reads it if it reads again)."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"the client took no data for {timeout_s:g} s (stream_send_timeout_s): the stream is "
                         "cancelled")
        self.timeout_s = timeout_s


class Unauthenticated(ServiceError):
    """No credential, or one that is malformed, unknown or revoked (never echoes the credential)."""

    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(ServiceError):
    """A valid credential asked for a tenant (or for every tenant) it may not use."""

    code = grpc.StatusCode.PERMISSION_DENIED


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
    retry_after_s = retry_after_of(exc)
    if isinstance(exc, SendTimeout):  # a stalled reader: the status may never leave; the call ends here anyway
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(exc.timeout_s):
                await context.abort(code, message)
    elif retry_after_s is None:
        await context.abort(code, message)
    else:  # the hint travels in the status details (grpc-status-details-bin)
        await context.abort_with_status(rpc_status.to_status(retry_status(code, message, retry_after_s)))


def retry_after_of(exc: BaseException) -> float | None:
    """The seconds after which ``exc``'s caller may retry, when it says (a quota refusal does)."""
    return getattr(exc, "retry_after_s", None) if isinstance(exc, ResourceExhausted) else None


def retry_status(code: grpc.StatusCode, message: str, retry_after_s: float) -> status_pb2.Status:
    """A ``google.rpc.Status`` carrying a ``RetryInfo`` (the client reads it with ``rpc_status.from_call``)."""
    delay = duration_pb2.Duration()
    delay.FromNanoseconds(max(0, round(retry_after_s * NANOS)))
    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
    return status_pb2.Status(code=code.value[0], message=message, details=[detail])


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
        except grpc.aio.InternalError:  # a context.write() to a call that ended (the client left): gRPC's to handle
            raise
        except Exception as exc:
            await _abort(context, exc, name)

    return unary  # type: ignore[return-value]


def reraise_bad_input(err: grpc.aio.AioRpcError) -> None:
    """Client side: a peer's INVALID_ARGUMENT is the caller's own bad input and stays an error
    (raised as InvalidArgument), and FAILED_PRECONDITION a set-up error (FailedPrecondition), as is
    a refused service credential (UNAUTHENTICATED, PERMISSION_DENIED); any other status returns, for
    the caller to treat as an outage."""
    if err.code() == grpc.StatusCode.INVALID_ARGUMENT:
        raise InvalidArgument(err.details() or "invalid argument") from err
    if err.code() == grpc.StatusCode.FAILED_PRECONDITION:  # e.g. the two services serve different models
        raise FailedPrecondition(err.details() or "failed precondition") from err
    if err.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):  # [auth] service_key
        raise FailedPrecondition(f"a peer refused this service's credential: {err.details()}") from err


def error_of_status(code: grpc.StatusCode, details: str | None) -> Exception:
    """Client side: a peer's status as the ServiceError its servicer raised (the same class, so the door
    in front maps it to the same status); INTERNAL, UNKNOWN and the rest as a RuntimeError."""
    for cls in (InvalidArgument, NotFound, FailedPrecondition, Unavailable, DeadlineExceeded, Unauthenticated,
                PermissionDenied, ResourceExhausted):
        if cls.code == code:
            return cls(details or code.name.lower())
    return RuntimeError(f"{code.name}: {details}")
