"""What every server interceptor that wraps a handler needs (the observability interceptor, the auth
guard and the decode guard all do): one ``intercept_service``, rebuilding a handler around a wrapped
behaviour, and relaying a handler's responses whatever its style."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from functools import partial
from typing import Any

import grpc

Behavior = Callable[[Any, grpc.aio.ServicerContext], Any]
Check = Callable[[Any, grpc.aio.ServicerContext], Awaitable[None]]  # returns, or aborts the call
Deserializer = Callable[[bytes], Any]
Wrap = Callable[[Behavior], Behavior]

# handler attribute (the method's kind) -> the grpc factory that builds a handler of that kind
HANDLER_FACTORIES: dict[str, Callable[..., grpc.RpcMethodHandler]] = {
    "unary_unary": grpc.unary_unary_rpc_method_handler,
    "stream_unary": grpc.stream_unary_rpc_method_handler,
    "unary_stream": grpc.unary_stream_rpc_method_handler,
    "stream_stream": grpc.stream_stream_rpc_method_handler,
}


def by_response(unary: Wrap, stream: Wrap, kinds: Iterable[str] = tuple(HANDLER_FACTORIES)) -> dict[str, Wrap]:
    """``rewrap``'s ``wraps`` for ``kinds``: ``unary`` where one response comes back, else ``stream``."""
    return {kind: unary if kind.endswith("_unary") else stream for kind in kinds}


def rewrap(handler: grpc.RpcMethodHandler, wraps: Mapping[str, Wrap],
           request_deserializer: Deserializer | None = None) -> grpc.RpcMethodHandler:
    """The same handler, its behaviour passed through ``wraps[kind]`` (kind: ``unary_unary`` ...) and its
    request deserializer replaced when one is given; unchanged when its kind is not in ``wraps``."""
    for kind, wrap in wraps.items():
        behavior = getattr(handler, kind)
        if behavior is not None:
            return HANDLER_FACTORIES[kind](
                wrap(behavior),
                request_deserializer=request_deserializer or handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
    return handler


def _checked_unary(behavior: Behavior, check: Check) -> Behavior:
    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await check(request, context)
        result = behavior(request, context)
        return await result if inspect.isawaitable(result) else result

    return unary


def _checked_stream(behavior: Behavior, check: Check) -> Behavior:
    async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await check(request, context)
        async for response in relay(behavior(request, context)):
            yield response

    return stream


def check_first(handler: grpc.RpcMethodHandler, check: Check, kinds: Iterable[str] = tuple(HANDLER_FACTORIES),
                request_deserializer: Deserializer | None = None) -> grpc.RpcMethodHandler:
    """The same handler (of one of ``kinds``; else unchanged), awaiting ``check(request, context)``
    before its behaviour runs; ``request_deserializer`` as in ``rewrap``."""
    wraps = by_response(partial(_checked_unary, check=check), partial(_checked_stream, check=check), kinds)
    return rewrap(handler, wraps, request_deserializer)


class HandlerInterceptor(grpc.aio.ServerInterceptor):
    """A server interceptor that hands every known method's handler to ``wrap`` (an unknown method's
    None passes through: gRPC itself answers UNIMPLEMENTED)."""

    def wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        """The handler of ``method`` (its full name), wrapped."""
        raise NotImplementedError

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        return handler if handler is None else self.wrap(handler, handler_call_details.method)


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
