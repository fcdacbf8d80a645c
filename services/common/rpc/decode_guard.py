"""Requests that do not decode are the caller's bad input: INVALID_ARGUMENT, never UNKNOWN.

grpc.aio deserializes a request before any handler or ``lookahead_rag.services.common.errors.grpc_errors`` runs;
a ``DecodeError`` there (bytes that are not the method's message: truncated, invalid UTF-8 in a
string field, nesting past the parser's limit) escapes as UNKNOWN "Unexpected <class ...>", which
reads as a server fault. ``DecodeGuard`` (one server interceptor, the innermost: installed by
``lookahead_rag.services.common.rpc.grpcutil.start_server``) wraps each unary-request method's deserializer so such
bytes become an ``Undecodable`` marker, and the handler refuses it with INVALID_ARGUMENT before the
servicer runs. Found by the schema fuzzer (tests/fuzz).
"""

from __future__ import annotations

from typing import Any

import grpc

from lookahead_rag.services.common.errors import one_line
from lookahead_rag.services.common.rpc.handlers import Deserializer, HandlerInterceptor, check_first


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


def guard_handler(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """The same handler, refusing undecodable requests (unary requests only: a client stream's
    messages are decoded one by one inside the handler's own iteration)."""
    if handler.request_deserializer is None:
        return handler
    unary_requests = ("unary_unary", "unary_stream")
    return check_first(handler, _refuse, unary_requests, safe_deserializer(handler.request_deserializer))


class DecodeGuard(HandlerInterceptor):
    """Every unary-request method of the server refuses undecodable bytes with INVALID_ARGUMENT."""

    def wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        return guard_handler(handler)
