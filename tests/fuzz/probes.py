"""Checks around the fuzz cases: is every service still healthy, has every call left the server, and
does a normal request still get a normal answer.

- ``healthy``: grpc.health.v1 Check of every service the server declares, each under a deadline
  (a server that stopped answering is a hang even when the fuzz calls themselves returned);
- ``in_flight``: the servers' ``rpc_in_flight`` gauges, read from /metrics (``drained`` waits for
  them to reach 0: a call the client gave up on must end on the server too);
- ``normal_requests``: a Retrieve, a Fetch, both Stats and an Answer for the known tenant.
"""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lookahead_rag.v1 import (
    draftcache_pb2,
    draftcache_pb2_grpc,
    generator_pb2,
    generator_pb2_grpc,
    retriever_pb2,
    retriever_pb2_grpc,
)
from tests.fuzz.process import ServerInfo, ServerProcess
from tests.fuzz.targets import SERVICE_FILES

HEALTH_TIMEOUT_S = 30.0  # a health check on 2 busy cores
PROBE_TIMEOUT_S = 120.0  # a normal request, an Answer included
DRAIN_TIMEOUT_S = 120.0  # calls given up by the client must end on the server within this
POLL_S = 0.2
PROBE_NEW_TOKENS = 2  # the Answer probe's max_new_tokens
IN_FLIGHT = re.compile(r'^\w*rpc_in_flight\{method="([^"]+)"\} (\S+)$', re.MULTILINE)


@dataclass(frozen=True)
class ProbeResult:
    name: str
    ok: bool
    detail: str = ""


def healthy(server: ServerProcess) -> ProbeResult:
    """Every declared service answers SERVING."""
    if not server.alive():
        return ProbeResult("health", False, f"the server process exited ({server.exit_code()})")
    for service, file in SERVICE_FILES.items():
        stub = health_pb2_grpc.HealthStub(server.channel(service))
        for name in file.services_by_name.values():
            try:
                got = stub.Check(health_pb2.HealthCheckRequest(service=name.full_name), timeout=HEALTH_TIMEOUT_S)
            except grpc.RpcError as err:
                return ProbeResult("health", False, f"{name.full_name}: {err.code().name} {err.details()}")  # type: ignore[attr-defined]
            if got.status != health_pb2.HealthCheckResponse.SERVING:
                return ProbeResult("health", False, f"{name.full_name}: status {got.status}")
    return ProbeResult("health", True)


HEALTH_WATCH = "/grpc.health.v1.Health/Watch"  # a channel's standing health check (never ends)


def in_flight(info: ServerInfo) -> dict[str, float]:
    """Calls in progress on the server, by method (only those not at 0), less the health watches the
    services' own channels keep open to each other (client-side health checking: [channels] health_check)."""
    if info.metrics_port is None:
        return {}
    url = f"http://127.0.0.1:{info.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=HEALTH_TIMEOUT_S) as reply:
        text = reply.read().decode()
    return {method: float(v) for method, v in IN_FLIGHT.findall(text)
            if float(v) and method != HEALTH_WATCH}


def drained(info: ServerInfo, timeout_s: float = DRAIN_TIMEOUT_S) -> ProbeResult:
    """Wait until no call is in progress on the server."""
    end = time.monotonic() + timeout_s
    while (busy := in_flight(info)) and time.monotonic() < end:
        time.sleep(POLL_S)
    if busy:
        return ProbeResult("drained", False, f"still in flight after {timeout_s:.0f} s: {busy}")
    return ProbeResult("drained", True)


def _answer(server: ServerProcess, info: ServerInfo) -> str:
    stub = generator_pb2_grpc.GeneratorStub(server.channel("generator"))
    request = generator_pb2.AnswerRequest(tenant=info.known_tenant, question=info.question,
                                          params=generator_pb2.GenerationParams(max_new_tokens=PROBE_NEW_TOKENS))
    chunks = list(stub.Answer(request, timeout=PROBE_TIMEOUT_S, metadata=server.metadata))
    if not chunks or not chunks[-1].HasField("final"):
        return "the stream did not end with a final message"
    final = chunks[-1].final
    return "" if final.output_ids and final.documents else f"an empty answer: {final}"


def _retrieve(server: ServerProcess, info: ServerInfo) -> str:
    stub = retriever_pb2_grpc.RetrieverStub(server.channel("retriever"))
    got = stub.Retrieve(retriever_pb2.RetrieveRequest(tenant=info.known_tenant, question=info.question),
                        timeout=PROBE_TIMEOUT_S, metadata=server.metadata)
    return "" if got.chunks and got.prompt_ids else "no chunks for the known tenant"


def _retriever_stats(server: ServerProcess, info: ServerInfo) -> str:
    stub = retriever_pb2_grpc.RetrieverStub(server.channel("retriever"))
    got = stub.Stats(retriever_pb2.RetrieverStatsRequest(tenant=info.known_tenant), timeout=PROBE_TIMEOUT_S,
                     metadata=server.metadata)
    return "" if got.chunks else "no chunks counted for the known tenant"


def _fetch(server: ServerProcess, info: ServerInfo) -> str:
    stub = draftcache_pb2_grpc.DraftCacheStub(server.channel("draftcache"))
    stats = stub.Stats(draftcache_pb2.DraftStatsRequest(tenant=info.known_tenant), timeout=PROBE_TIMEOUT_S,
                       metadata=server.metadata)
    if not stats.tries:
        return "the known tenant's cached output is gone"
    stub.Fetch(draftcache_pb2.FetchRequest(tenant=info.known_tenant, tokenizer_id=info.tokenizer_id,
                                           prompt_ids=[1, 2, 3]), timeout=PROBE_TIMEOUT_S, metadata=server.metadata)
    return ""


NORMAL: dict[str, Callable[[ServerProcess, ServerInfo], str]] = {
    "Retriever.Retrieve": _retrieve,
    "Retriever.Stats": _retriever_stats,
    "DraftCache.Stats+Fetch": _fetch,
    "Generator.Answer": _answer,
}


def normal_requests(server: ServerProcess) -> list[ProbeResult]:
    """Each normal request: ok, or what went wrong."""
    assert server.info is not None
    out: list[ProbeResult] = []
    for name, probe in NORMAL.items():
        try:
            problem = probe(server, server.info)
        except grpc.RpcError as err:
            problem = f"{err.code().name}: {err.details()}"  # type: ignore[attr-defined]
        out.append(ProbeResult(name, not problem, problem))
    return out
