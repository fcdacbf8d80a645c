"""How another service reaches the retriever: in-process or over gRPC, same domain reply.

Either client returns the core's ``RetrieveResult`` (notes and ``unknown_tenant`` included; over gRPC
read back from the wire by ``convert.retrieve_result``), so the caller holds no protobuf. Over gRPC the
caller's own bad input (INVALID_ARGUMENT) is raised as InvalidArgument; any other failure is
raised as is, and the caller decides to answer without documents. Calls carry the current
request id (``x-request-id``), so the retriever logs under the same id, and the service's API key.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import grpc
from pydantic import SecretStr

from lookahead_rag.services.common.auth.callers import call_metadata
from lookahead_rag.services.common.errors import reraise_bad_input
from lookahead_rag.services.common.rules.conversation import Message
from lookahead_rag.services.retriever.convert import history_to_proto, retrieve_result
from lookahead_rag.services.retriever.core import RetrieverCore, RetrieveResult
from lookahead_rag.v1 import retriever_pb2, retriever_pb2_grpc


class GrpcRetrieverClient:
    def __init__(self, channel: grpc.aio.Channel, key: SecretStr | str | None = None) -> None:
        """``key``: the API key every call sends (``[auth] service_key``), or none."""
        self.stub = retriever_pb2_grpc.RetrieverStub(channel)
        self.key = key

    async def retrieve(self, tenant: str, question: str, k: int, m: int, max_new_tokens: int, tokenizer_id: str,
                       history: Sequence[Message], timeout_s: float) -> RetrieveResult:
        req = retriever_pb2.RetrieveRequest(tenant=tenant, question=question, k=k, m=m,
                                            max_new_tokens=max_new_tokens, tokenizer_id=tokenizer_id,
                                            history=history_to_proto(history))
        try:
            return retrieve_result(await self.stub.Retrieve(req, timeout=timeout_s, metadata=call_metadata(self.key)))
        except grpc.aio.AioRpcError as err:
            reraise_bad_input(err)
            raise

    async def served_model(self, timeout_s: float) -> tuple[str, str]:
        """(model name, tokenizer id) the retriever builds prompts for."""
        resp = await self.stub.Stats(retriever_pb2.RetrieverStatsRequest(), timeout=timeout_s,
                                     metadata=call_metadata(self.key))
        return resp.model, resp.tokenizer_id


class LocalRetrieverClient:
    """Direct calls into a RetrieverCore in this process (the embedded default)."""

    def __init__(self, core: RetrieverCore) -> None:
        self.core = core

    async def retrieve(self, tenant: str, question: str, k: int, m: int, max_new_tokens: int, tokenizer_id: str,
                       history: Sequence[Message], timeout_s: float) -> RetrieveResult:
        return await asyncio.wait_for(
            asyncio.to_thread(self.core.retrieve, tenant, question, k, m, max_new_tokens, tokenizer_id, history),
            timeout_s,
        )

    async def served_model(self, timeout_s: float) -> tuple[str, str]:
        """(model name, tokenizer id) the retriever builds prompts for."""
        return self.core.served.name, self.core.tokenizer_id
