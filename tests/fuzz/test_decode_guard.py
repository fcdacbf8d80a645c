"""Bytes that do not decode as the method's request are INVALID_ARGUMENT on every server started by
``lookahead_rag.services.common.rpc.grpcutil.start_server`` (services.common.rpc.decode_guard), unary and
streaming alike; the first bug the fuzzer found (grpc.aio answered UNKNOWN "Unexpected <class 'DecodeError'>")."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from lookahead_rag.services.common.rpc.grpcutil import start_server, stop_server
from lookahead_rag.v1 import draftcache_pb2, draftcache_pb2_grpc, generator_pb2, generator_pb2_grpc
from tests.fuzz.targets import discover, invoke, open_channel
from tests.fuzz.wire import delimited

DEADLINE_S = 30.0
NOT_UTF8 = delimited(1, b"acme\xff")  # field 1 (tenant) of both requests, with a byte UTF-8 never has


class Fake(draftcache_pb2_grpc.DraftCacheServicer, generator_pb2_grpc.GeneratorServicer):
    """Answers every well-formed request; records the tenants it saw."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def Stats(self, request: Any, context: grpc.aio.ServicerContext) -> draftcache_pb2.DraftStatsResponse:
        self.seen.append(request.tenant)
        return draftcache_pb2.DraftStatsResponse()

    async def Answer(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        self.seen.append(request.tenant)
        yield generator_pb2.AnswerChunk(final=generator_pb2.FinalInfo(answer_text="ok"))


RPCS = {r.name: r for r in discover()}


@pytest.mark.parametrize("name", ["DraftCache.Stats", "Generator.Answer"])
def test_undecodable_request_is_invalid_argument_and_never_reaches_the_servicer(name: str) -> None:
    async def main() -> tuple[Any, Any, list[str]]:
        fake = Fake()
        server, port = await start_server(
            [(draftcache_pb2_grpc.add_DraftCacheServicer_to_server, fake),
             (generator_pb2_grpc.add_GeneratorServicer_to_server, fake)], [])
        try:
            with open_channel(f"127.0.0.1:{port}") as channel:
                bad = await asyncio.to_thread(invoke, channel, RPCS[name], NOT_UTF8, DEADLINE_S)
                good = await asyncio.to_thread(invoke, channel, RPCS[name], delimited(1, b"acme"), DEADLINE_S)
            return bad, good, fake.seen
        finally:
            await stop_server(server, grace_s=1.0)

    bad, good, seen = asyncio.run(main())
    assert bad.code is grpc.StatusCode.INVALID_ARGUMENT, bad
    assert bad.details.startswith("the request does not decode") and "\n" not in bad.details
    assert good.code is grpc.StatusCode.OK, good
    assert seen == ["acme"]  # only the well-formed request reached the servicer
