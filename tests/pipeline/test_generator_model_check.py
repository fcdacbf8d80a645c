"""One served model: a generator and a retriever on different models refuse each other, never
answer silently without documents (the retriever's prompt would be in another token space)."""

from __future__ import annotations

import grpc
import pytest

from lookahead_rag.services.common.errors import FailedPrecondition
from lookahead_rag.services.generator.build import check_same_model
from lookahead_rag.v1 import retriever_pb2, retriever_pb2_grpc
from tests.pipeline.helpers import RunningPipeline, assert_status, collect, module_loop, module_pipeline, rpc_error

pipe = module_pipeline()
OTHER_TOKENIZER = "other-model-tokenizer"  # a token space neither service serves
TIMEOUT_S = 5.0


class FakeRetriever:
    """A retriever client that reports a served model, or cannot be reached (``served is None``)."""

    def __init__(self, served: tuple[str, str] | None) -> None:
        self.served = served

    async def served_model(self, timeout_s: float) -> tuple[str, str]:
        if self.served is None:
            raise ConnectionError("retriever down")
        return self.served


@module_loop
async def test_an_answer_across_models_is_failed_precondition(pipe: RunningPipeline, tenant: str) -> None:
    engine = pipe.generator
    own = engine.tokenizer_id
    engine.tokenizer_id = OTHER_TOKENIZER  # as if the generator had been started on another model
    try:
        err = await rpc_error(lambda: collect(pipe.stub.Answer(pipe.answer_request(tenant), timeout=60)))
    finally:
        engine.tokenizer_id = own
    assert_status(err, grpc.StatusCode.FAILED_PRECONDITION)
    assert "[model]" in err.details()  # the message says what to fix
    ok = await pipe.answer(tenant, max_new_tokens=4)  # the same request on one model is answered with documents
    assert ok.final is not None and ok.final.stats.documents_available


@module_loop
async def test_the_retriever_refuses_a_prompt_for_another_tokenizer_over_grpc(pipe: RunningPipeline,
                                                                              tenant: str) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{pipe.pipeline.ports['retriever']}") as channel:
        stub = retriever_pb2_grpc.RetrieverStub(channel)
        request = retriever_pb2.RetrieveRequest(tenant=tenant, question="What is csv?", tokenizer_id=OTHER_TOKENIZER)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Retrieve(request, timeout=TIMEOUT_S)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # another token space: refused
        same = retriever_pb2.RetrieveRequest(tenant=tenant, question="What is csv?",
                                             tokenizer_id=pipe.generator.tokenizer_id)
        assert (await stub.Retrieve(same, timeout=TIMEOUT_S)).chunks  # its own token space: answered
        stats = await stub.Stats(retriever_pb2.RetrieverStatsRequest(), timeout=TIMEOUT_S)
        assert (stats.model, stats.tokenizer_id) == (pipe.pipeline.settings.model.name, pipe.generator.tokenizer_id)


@pytest.mark.asyncio
async def test_start_up_check_refuses_another_model_and_tolerates_an_unreachable_retriever() -> None:
    # another model's tokenizer: the generator refuses to start, naming both
    with pytest.raises(FailedPrecondition, match="other-model"):
        await check_same_model(FakeRetriever(("other-model", OTHER_TOKENIZER)), "mine", "my-tok", TIMEOUT_S)
    # the same tokenizer under another name (a path vs a built-in name): accepted
    await check_same_model(FakeRetriever(("alias", "my-tok")), "mine", "my-tok", TIMEOUT_S)
    # not reachable yet: start anyway (each call is checked)
    await check_same_model(FakeRetriever(None), "mine", "my-tok", TIMEOUT_S)
