"""Requests that do not decode are the caller's bad input: INVALID_ARGUMENT, never UNKNOWN.

grpc.aio deserializes a request before any handler or ``services.common.errors.grpc_errors`` runs;
a ``DecodeError`` there (bytes that are not the method's message: truncated, invalid UTF-8 in a
string field, nesting past the parser's limit) escapes as UNKNOWN "Unexpected <class ...>", which
reads as a server fault. ``DecodeGuard`` (one server interceptor, the innermost: installed by
``services.common.grpcutil.start_server``) wraps each unary-request method's deserializer so such
bytes become an ``Undecodable`` marker, and the handler refuses it with INVALID_ARGUMENT before the
servicer runs. Found by the schema fuzzer (tests/fuzz).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from services.common.errors import one_line
from services.common.handlers import relay

Behavior = Callable[[Any, grpc.aio.ServicerContext], Any]
Deserializer = Callable[[bytes], Any]


class Undecodable:
    """A request whose bytes the method's deserializer refused (why: ``error``)."""

    def __init__(self, error: str) -> None:
        self.error = error


def safe_deserializer(deserialize: Deserializer | None) -> Deserializer | None:
    if deserialize is None:  # the method takes raw bytes: nothing can fail
        return None

    def safe(raw: bytes) -> Any:
        try:
            return deserialize(raw)
        except Exception as exc:  # DecodeError, or whatever a custom deserializer raises
            return Undecodable(one_line(f"{type(exc).__name__}: {exc}"))

    return safe


async def _refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
    if isinstance(request, Undecodable):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the request does not decode: {request.error}")


def _unary_request(behavior: Behavior) -> Behavior:
    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await _refuse(request, context)
        result = behavior(request, context)
        return await result if inspect.isawaitable(result) else result

    return unary


def _streamed_response(behavior: Behavior) -> Behavior:
    async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await _refuse(request, context)
        async for response in relay(behavior(request, context)):
            yield response

    return stream


def guard_handler(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """The same handler, refusing undecodable requests (unary requests only: a client stream's
    messages are decoded one by one inside the handler's own iteration)."""
    kinds: list[tuple[str, Callable[..., grpc.RpcMethodHandler], Callable[[Behavior], Behavior]]] = [
        ("unary_unary", grpc.unary_unary_rpc_method_handler, _unary_request),
        ("unary_stream", grpc.unary_stream_rpc_method_handler, _streamed_response),
    ]
    for attr, make, wrap in kinds:
        behavior = getattr(handler, attr)
        if behavior is not None and handler.request_deserializer is not None:
            return make(wrap(behavior), request_deserializer=safe_deserializer(handler.request_deserializer),
                        response_serializer=handler.response_serializer)
    return handler


class DecodeGuard(grpc.aio.ServerInterceptor):
    """Every unary-request method of the server refuses undecodable bytes with INVALID_ARGUMENT."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        return handler if handler is None else guard_handler(handler)
