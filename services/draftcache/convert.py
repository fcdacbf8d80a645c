"""Protobuf <-> draft-cache domain types, in one place: the servicer and both clients use these."""

from __future__ import annotations

from collections.abc import Sequence

from lookahead_rag.v1 import draftcache_pb2

from services.draftcache.fetch import Branch
from services.draftcache.store import ScopeStats


def fetch_response(branches: Sequence[Branch]) -> draftcache_pb2.FetchResponse:
    return draftcache_pb2.FetchResponse(
        branches=[draftcache_pb2.Branch(ids=b.ids, weight=b.weight) for b in branches],
        tokens=sum(len(b.ids) for b in branches),
    )


def branches_from_proto(response: draftcache_pb2.FetchResponse) -> list[Branch]:
    return [Branch(list(b.ids), b.weight) for b in response.branches]


def stats_response(stats: Sequence[ScopeStats]) -> draftcache_pb2.DraftStatsResponse:
    return draftcache_pb2.DraftStatsResponse(
        tries=[
            draftcache_pb2.TenantTrieStats(
                tenant=s.tenant, tokenizer_id=s.tokenizer_id, nodes=s.nodes, bytes=s.bytes, outputs=s.outputs
            )
            for s in stats
        ]
    )
