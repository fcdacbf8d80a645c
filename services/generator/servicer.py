"""The Generator gRPC service: a thin adapter over GeneratorEngine."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import grpc
from lookahead_rag.v1 import generator_pb2, generator_pb2_grpc

from services.common.errors import grpc_errors
from services.common.logs import request_context
from services.generator.engine import GeneratorEngine

SERVICE_NAME: str = generator_pb2.DESCRIPTOR.services_by_name["Generator"].full_name


def _deadline(context: grpc.aio.ServicerContext) -> float | None:
    """The caller's deadline on the monotonic clock, or None."""
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining


class GeneratorServicer(generator_pb2_grpc.GeneratorServicer):
    def __init__(self, engine: GeneratorEngine) -> None:
        self.engine = engine

    @grpc_errors
    async def Answer(self, request: generator_pb2.AnswerRequest,
                     context: grpc.aio.ServicerContext) -> AsyncIterator[generator_pb2.AnswerChunk]:
        with request_context(tenant=request.tenant) as rid:
            async for chunk in self.engine.answer(request, _deadline(context), rid):
                yield chunk

    @grpc_errors
    async def Generate(self, request: generator_pb2.GenerateRequest,
                       context: grpc.aio.ServicerContext) -> AsyncIterator[generator_pb2.AnswerChunk]:
        with request_context(tenant=request.tenant) as rid:
            async for chunk in self.engine.generate(request, _deadline(context), rid):
                yield chunk
