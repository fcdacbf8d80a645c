"""Protobuf <-> draft-cache domain types, in one place: the servicer and both clients use these."""

from __future__ import annotations

from collections.abc import Sequence

from lookahead_rag.services.draftcache.fetch import Continuation
from lookahead_rag.services.draftcache.store import ScopeStats
from lookahead_rag.v1 import draftcache_pb2


def fetch_response(continuations: Sequence[Continuation]) -> draftcache_pb2.FetchResponse:
    return draftcache_pb2.FetchResponse(
        continuations=[draftcache_pb2.Branch(ids=c.ids, weight=c.weight) for c in continuations],
        tokens=sum(len(c.ids) for c in continuations),
    )


def continuations_from_proto(response: draftcache_pb2.FetchResponse) -> list[Continuation]:
    return [Continuation(list(c.ids), c.weight) for c in response.continuations]


def stats_response(stats: Sequence[ScopeStats]) -> draftcache_pb2.DraftStatsResponse:
    return draftcache_pb2.DraftStatsResponse(
        tries=[
            draftcache_pb2.TenantTrieStats(
                tenant=s.tenant, tokenizer_id=s.tokenizer_id, nodes=s.nodes, bytes=s.bytes, outputs=s.outputs
            )
            for s in stats
        ]
    )
