"""The Generator gRPC service: a thin adapter over GeneratorCore (protobuf <-> domain: convert.py).

Both calls are one adapter: the request as a domain query -> the generator's stream -> AnswerChunks,
each written within ``[generator] stream_send_timeout_s`` (a client that stopped reading ends the call).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from lookahead_rag.services.common.auth.callers import current_principal, sees_engine_load
from lookahead_rag.services.common.errors import grpc_errors
from lookahead_rag.services.common.rpc.send_timeout import send_within
from lookahead_rag.services.common.telemetry.logs import request_context
from lookahead_rag.services.generator.convert import answer_query, chunk_to_proto, generate_query
from lookahead_rag.services.generator.core import GeneratorCore
from lookahead_rag.services.generator.domain import AnswerChunk, AnswerQuery, GenerateQuery
from lookahead_rag.v1 import generator_pb2, generator_pb2_grpc

SERVICE_NAME: str = generator_pb2.DESCRIPTOR.services_by_name["Generator"].full_name
# GeneratorCore.answer or .generate: (generator, query, deadline, request id) -> the generator's stream
EngineCall = Callable[[GeneratorCore, Any, float | None, str], AsyncIterator[AnswerChunk]]
Method = Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[None]]  # writes its stream with context.write


def _deadline(context: grpc.aio.ServicerContext) -> float | None:
    """The caller's deadline on the monotonic clock, or None."""
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining


def _streaming(name: str, to_query: Callable[[Any], AnswerQuery | GenerateQuery], call: EngineCall) -> Method:
    """The servicer method ``name``: its request as a domain query, streamed through ``call`` onto the
    wire, logged under the request's id and tenant; however the stream ends, the generator's is closed
    (a request still running is cancelled), and errors map to status codes (``grpc_errors``). A write
    the client does not take within the send timeout is a SendTimeout (DEADLINE_EXCEEDED)."""

    async def method(self: GeneratorServicer, request: Any,
                     context: grpc.aio.ServicerContext) -> None:
        query = to_query(request)
        send_timeout_s = self.generator.settings.stream_send_timeout_s
        load = sees_engine_load(current_principal())  # batch sizes, queue wait: an admin's (or auth off)
        with request_context(tenant=query.tenant) as rid:
            chunks = call(self.generator, query, _deadline(context), rid)
            try:
                async for chunk in chunks:
                    await send_within(context.write(chunk_to_proto(chunk, load)), send_timeout_s)
            finally:
                await chunks.aclose()  # type: ignore[attr-defined]

    method.__name__, method.__qualname__ = name, f"GeneratorServicer.{name}"
    return grpc_errors(method)


class GeneratorServicer(generator_pb2_grpc.GeneratorServicer):
    def __init__(self, generator: GeneratorCore) -> None:
        self.generator = generator

    Answer = _streaming("Answer", answer_query, GeneratorCore.answer)  # AnswerRequest: grounded on retrieval
    Generate = _streaming("Generate", generate_query, GeneratorCore.generate)  # GenerateRequest: a given prompt
