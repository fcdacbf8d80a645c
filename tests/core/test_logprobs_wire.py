"""Logprobs over gRPC: GenerationParams' new fields reach the domain, a delta's logprobs reach the wire."""

from __future__ import annotations

import pytest

from lookahead_rag.services.common.errors import InvalidArgument
from lookahead_rag.services.generator.convert import delta_to_proto, params_from_proto
from lookahead_rag.services.generator.domain import GenerationParams, TextDelta, TokenLogprob
from lookahead_rag.services.generator.logprobs import check_logprobs
from lookahead_rag.v1 import generator_pb2


def test_params_carry_logprobs() -> None:
    # fields 13 and 14 of GenerationParams become the domain's logprobs / top_logprobs
    got = params_from_proto(generator_pb2.GenerationParams(logprobs=True, top_logprobs=4))
    assert got.logprobs is True and got.top_logprobs == 4
    assert params_from_proto(generator_pb2.GenerationParams()).logprobs is False


def test_delta_carries_one_logprob_per_token() -> None:
    delta = TextDelta(text="ab", token_ids=(5, 6), logprobs=(TokenLogprob(5, -0.5, ((5, -0.5), (9, -1.25))),
                                                              TokenLogprob(6, -2.0)))
    wire = generator_pb2.TextDelta.FromString(delta_to_proto(delta).SerializeToString())
    # in order, each with its alternatives (float32 on the wire: these values are exact)
    assert [(p.token_id, p.logprob) for p in wire.logprobs] == [(5, -0.5), (6, -2.0)]
    assert [(t.token_id, t.logprob) for t in wire.logprobs[0].top] == [(5, -0.5), (9, -1.25)]
    assert not wire.logprobs[1].top


def test_safe_stream_refuses_logprobs() -> None:
    # a safe stream's fixed-size deltas cannot carry logprobs: a one-line InvalidArgument
    with pytest.raises(InvalidArgument, match="safe stream"):
        check_logprobs(GenerationParams(logprobs=True), safe=True)
    check_logprobs(GenerationParams(logprobs=True), safe=False)  # not a safe stream: served
