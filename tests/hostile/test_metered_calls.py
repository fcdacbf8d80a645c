"""Issue 32 item 7: no call is unmetered. Every RPC has a quota class (``common/rules/call_quota.py``), the
per-tenant quotas are limited by default, Retrieve, Fetch, AddOutput and Delete count against the
tenant's rate like Ingest and Forget, and each service takes messages up to its own
``max_message_bytes`` (8 MiB; the retriever 16 MiB for ingest batches), no longer 64 MiB.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from lookahead_rag.services.common.auth.scopes import GRPC_SCOPES
from lookahead_rag.services.common.rpc.grpcutil import open_channel, start_server, stop_server
from lookahead_rag.services.common.rules.limits import RequestLimits
from lookahead_rag.services.draftcache.build import build_draftcache
from lookahead_rag.services.draftcache.settings import DraftCacheSettings
from lookahead_rag.services.events.inprocess import InProcessBus
from lookahead_rag.services.retriever.servicer import SERVICE_NAME, RetrieverServicer
from lookahead_rag.services.retriever.settings import RetrieverSettings
from lookahead_rag.v1 import draftcache_pb2, draftcache_pb2_grpc, generator_pb2, retriever_pb2, retriever_pb2_grpc
from tests.builders import TOKENIZER
from tests.services.draftcache_helpers import small_settings

SLOW = RequestLimits(tenant_rps=0.001, tenant_burst=1)  # one call, then one per 1000 s
OLD_MESSAGE_BYTES = 64 * 1024 * 1024  # what every service accepted before
OVERSIZE = 9 * 1024 * 1024  # past the draft cache's 8 MiB
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED


def test_every_rpc_has_a_quota_class_and_the_defaults_are_limited() -> None:
    from lookahead_rag.services.common.rules.call_quota import GRPC_QUOTA_CLASSES, QuotaClass  # the module the fix adds

    served = {f"/{service.full_name}/{method.name}" for pb in (generator_pb2, retriever_pb2, draftcache_pb2)
              for service in pb.DESCRIPTOR.services_by_name.values() for method in service.methods}
    assert served <= set(GRPC_QUOTA_CLASSES) <= set(GRPC_SCOPES)
    for method in ("Retriever/Retrieve", "Retriever/Delete", "DraftCache/Fetch", "DraftCache/AddOutput"):
        assert GRPC_QUOTA_CLASSES[f"/lookahead_rag.v1.{method}"] is QuotaClass.CALL
    limits = RequestLimits()
    assert limits.tenant_rps > 0 and limits.tenant_burst > 0 and limits.tenant_streams > 0
    for settings in (RetrieverSettings(), DraftCacheSettings()):
        assert settings.max_message_bytes < OLD_MESSAGE_BYTES


async def second_call(call: Callable[[], Awaitable[Any]]) -> grpc.StatusCode:
    """The status of a call made a second time (the first may fail on its own: only the rate matters)."""
    for _ in range(2):
        try:
            await call()
            code = grpc.StatusCode.OK
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
    return code


@pytest.mark.asyncio
async def test_fetch_and_add_output_are_metered_and_messages_bounded() -> None:
    service = await build_draftcache(small_settings(), SLOW, InProcessBus(), CollectorRegistry())
    await service.start()
    port = await service.serve(port=0, host="127.0.0.1")
    try:
        async with open_channel(f"127.0.0.1:{port}") as channel:
            stub = draftcache_pb2_grpc.DraftCacheStub(channel)
            add = draftcache_pb2.AddOutputRequest(tenant="a", tokenizer_id=TOKENIZER, output_ids=[1, 2, 3, 4])
            fetch = draftcache_pb2.FetchRequest(tenant="f", tokenizer_id=TOKENIZER, prompt_ids=[1, 2, 3])
            assert await second_call(lambda: stub.AddOutput(add)) == EXHAUSTED
            assert await second_call(lambda: stub.Fetch(fetch)) == EXHAUSTED
            huge = draftcache_pb2.AddOutputRequest(tenant="h", tokenizer_id="t" * OVERSIZE, output_ids=[1])
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.AddOutput(huge)
            assert err.value.code() == EXHAUSTED and "message" in (err.value.details() or "").lower()
    finally:
        await service.stop(grace_s=0.5)


class StandIn:
    """A retriever core and document writer that refuse everything (only the servicer's metering is tested)."""

    limits = SLOW

    def retrieve(self, *args: Any) -> Any:
        raise LookupError("stand-in")

    def delete(self, *args: Any) -> Any:
        raise LookupError("stand-in")


@pytest.mark.asyncio
async def test_retrieve_and_delete_are_metered() -> None:
    stand_in = StandIn()
    servicer = RetrieverServicer(stand_in, writer=stand_in)  # type: ignore[arg-type]
    server, port = await start_server([(retriever_pb2_grpc.add_RetrieverServicer_to_server, servicer)], [SERVICE_NAME])
    try:
        async with open_channel(f"127.0.0.1:{port}") as channel:
            stub = retriever_pb2_grpc.RetrieverStub(channel)
            retrieve = retriever_pb2.RetrieveRequest(tenant="r", question="q")
            delete = retriever_pb2.DeleteRequest(tenant="d", doc_ids=["x"])
            assert await second_call(lambda: stub.Retrieve(retrieve)) == EXHAUSTED
            assert await second_call(lambda: stub.Delete(delete)) == EXHAUSTED
    finally:
        await stop_server(server, 0)
