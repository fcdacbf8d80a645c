"""Transport security (issue 12, item 1): TLS and mutual TLS on real gRPC servers, the generator's
channels, the HTTP endpoint's settings, serve's refusal to listen in plaintext beyond loopback, and
the Kafka clients' TLS/SASL arguments (test_tls_kafka.py); the bind check is test_tls_bind.py.

Certificates are made at run time (``cryptography``): a CA, a server certificate for 127.0.0.1,
::1 and localhost, a client certificate it signed, and a second ("rogue") CA with its own client.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import ssl
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from lookahead_rag.services.common.auth.tls import (
    TARGET_NAME_OVERRIDE,
    TlsSettings,
    add_tls_arguments,
    server_credentials,
    sync_channel,
    tls_from_args,
    uvicorn_ssl,
)
from lookahead_rag.services.common.rpc import grpcutil
from lookahead_rag.services.common.rpc.grpcutil import open_channel
from lookahead_rag.services.common.rules.limits import RequestLimits
from lookahead_rag.services.draftcache.build import build_draftcache
from lookahead_rag.services.events.inprocess import InProcessBus
from lookahead_rag.v1 import draftcache_pb2 as pb
from tests.builders import TOKENIZER
from tests.services.draftcache_helpers import small_settings
from tests.services.tls_helpers import LOOPBACK_V4, RPC_TIMEOUT_S, Pki, Stub, T, client_tls, server_tls

pytestmark = pytest.mark.usefixtures("no_lar_env")


# --- a real server: the draft cache over gRPC ----------------------------------------------------


async def with_draftcache(tls: TlsSettings | None, call: Callable[[int], Awaitable[Any]]) -> Any:
    """Build the draft cache, serve it on loopback with ``tls``'s server credentials, run ``call(port)``."""
    service = await build_draftcache(small_settings(), RequestLimits(), InProcessBus(), CollectorRegistry())
    await service.start()
    port = await service.serve(port=0, host=LOOPBACK_V4, credentials=server_credentials(tls))
    try:
        return await call(port)
    finally:
        await service.stop(grace_s=0.5)


async def add_and_count(port: int, tls: TlsSettings | None) -> int:
    """AddOutput then Stats over a channel built with ``tls``: the tenant's outputs."""
    async with open_channel(f"{LOOPBACK_V4}:{port}", tls=tls) as channel:
        stub = Stub(channel)
        await stub.AddOutput(pb.AddOutputRequest(tenant=T, tokenizer_id=TOKENIZER, output_ids=[1, 2, 3, 4],
                                                 event_id="e1"), timeout=RPC_TIMEOUT_S)
        stats = await stub.Stats(pb.DraftStatsRequest(tenant=T), timeout=RPC_TIMEOUT_S)
        return sum(t.outputs for t in stats.tries)


def refused_code(server: TlsSettings, client: TlsSettings | None) -> grpc.StatusCode:
    """The status a call from ``client`` gets from a draft cache served with ``server``."""

    async def call(port: int) -> grpc.StatusCode:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await add_and_count(port, client)
        return err.value.code()

    return asyncio.run(with_draftcache(server, call))


def test_tls_server_answers_a_tls_client(pki: Pki) -> None:
    # the whole path works over TLS: the client verifies the server against the CA and the RPCs answer
    assert asyncio.run(with_draftcache(server_tls(pki), lambda port: add_and_count(port, client_tls(pki)))) == 1


def test_plaintext_client_against_a_tls_server_fails(pki: Pki) -> None:
    # no TLS on the client side: the server speaks TLS only, so the connection never comes up
    assert refused_code(server_tls(pki), None) == grpc.StatusCode.UNAVAILABLE
    assert refused_code(server_tls(pki), TlsSettings()) == grpc.StatusCode.UNAVAILABLE  # the default: off


def test_client_refuses_a_server_its_ca_did_not_sign(pki: Pki) -> None:
    # the client really verifies: trusting only the rogue CA, it rejects the server's certificate
    assert refused_code(server_tls(pki), client_tls(pki, ca=pki.rogue_ca)) == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_without_a_client_certificate_fails(pki: Pki) -> None:
    # client_ca_file set: a caller presenting no certificate is refused during the handshake
    assert refused_code(server_tls(pki, mutual=True), client_tls(pki)) == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_with_a_certificate_from_another_ca_fails(pki: Pki) -> None:
    # a certificate is not enough: it must be signed by client_ca_file
    rogue = client_tls(pki, cert=pki.rogue_client_cert, key=pki.rogue_client_key)
    assert refused_code(server_tls(pki, mutual=True), rogue) == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_with_a_client_certificate_works(pki: Pki) -> None:
    # the CA's client certificate gets through and the RPCs answer
    client = client_tls(pki, cert=pki.client_cert, key=pki.client_key)
    assert asyncio.run(with_draftcache(server_tls(pki, mutual=True), lambda port: add_and_count(port, client))) == 1


def test_blocking_cli_channel_uses_tls(pki: Pki) -> None:
    # sync_channel (what `ask` dials with) speaks TLS when configured, plaintext otherwise (then refused)
    def stats(port: int, tls: TlsSettings | None) -> Any:
        with sync_channel(f"{LOOPBACK_V4}:{port}", tls) as channel:
            return Stub(channel).Stats(pb.DraftStatsRequest(tenant=T), timeout=RPC_TIMEOUT_S)

    async def call(port: int) -> grpc.StatusCode | None:
        await asyncio.to_thread(stats, port, client_tls(pki))
        with pytest.raises(grpc.RpcError) as err:
            await asyncio.to_thread(stats, port, None)
        return err.value.code()  # type: ignore[attr-defined]

    assert asyncio.run(with_draftcache(server_tls(pki), call)) == grpc.StatusCode.UNAVAILABLE


def test_cli_flags_override_the_tls_settings(pki: Pki) -> None:
    # ask/ingest: --ca-file and the client certificate flags turn client TLS on
    parser = argparse.ArgumentParser()
    add_tls_arguments(parser)
    tls = tls_from_args(parser.parse_args(["--ca-file", str(pki.ca), "--client-cert", str(pki.client_cert),
                                           "--client-key", str(pki.client_key), "--server-name", "localhost"]))
    assert tls.client_enabled and tls.ca_file == pki.ca and tls.client_cert_file == pki.client_cert
    assert tls.server_name_override == "localhost"
    assert not tls_from_args(parser.parse_args([])).client_enabled  # nothing set: plaintext


# --- the generator's channels --------------------------------------------------------------------


def test_open_channel_gets_tls_credentials(pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    # unit level: with client TLS on, open_channel builds a secure channel with the credentials,
    # the message size limits and the name override; without it an insecure one
    made: list[tuple[str, Any, Any]] = []
    monkeypatch.setattr(grpcutil.grpc.aio, "secure_channel",
                        lambda target, creds, options, interceptors=(): made.append(("secure", creds, options)))
    monkeypatch.setattr(grpcutil.grpc.aio, "insecure_channel",
                        lambda target, options, interceptors=(): made.append(("insecure", None, options)))
    tls = TlsSettings(ca_file=pki.ca, server_name_override="localhost")
    open_channel("retriever:50051", 1024, tls)
    open_channel("retriever:50051", 1024, TlsSettings())
    (kind, creds, options), (plain_kind, _, _) = made
    assert kind == "secure" and isinstance(creds, grpc.ChannelCredentials)
    assert ("grpc.max_receive_message_length", 1024) in options and (TARGET_NAME_OVERRIDE, "localhost") in options
    assert plain_kind == "insecure"


def test_generator_channels_use_tls_when_configured(pki: Pki, tmp_path: Path) -> None:
    # the pipeline's channels to a retriever and a draft cache not built here (generator -> upstream)
    # use [tls]: with the CA they reach a TLS draft cache, without TLS the same call is refused
    from lookahead_rag.services.app import Pipeline
    from lookahead_rag.services.common.telemetry.refresher import Refresher
    from lookahead_rag.services.config import AllSettings

    def settings(port: int, tls: dict[str, Any]) -> AllSettings:
        target = f"{LOOPBACK_V4}:{port}"
        return AllSettings.load(None, generator={"draftcache_target": target, "retriever_target": target},
                                tls=tls)

    async def via_pipeline_channel(port: int, tls: dict[str, Any]) -> int:
        pipeline = Pipeline(settings(port, tls), InProcessBus(), CollectorRegistry(), Refresher(1.0), {})
        pipeline._clients(grpc_servers=True)  # the channels build_generator would get
        try:
            draft_channel = pipeline.channels[-1]
            stats = await Stub(draft_channel).Stats(pb.DraftStatsRequest(), timeout=RPC_TIMEOUT_S)
            return len(stats.tries)
        finally:
            for channel in pipeline.channels:
                await channel.close()

    async def call(port: int) -> grpc.StatusCode:
        assert await via_pipeline_channel(port, {"ca_file": str(pki.ca)}) == 0
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await via_pipeline_channel(port, {})
        return err.value.code()

    assert asyncio.run(with_draftcache(server_tls(pki), call)) == grpc.StatusCode.UNAVAILABLE


def test_pipeline_serves_tls_from_settings(pki: Pki, tmp_path: Path) -> None:
    # Pipeline.start(grpc_servers=True) binds with [tls]'s certificate: health answers over TLS only
    from lookahead_rag.services.app import Pipeline
    from lookahead_rag.services.config import AllSettings

    settings = AllSettings.load(None, draftcache={"data_dir": str(tmp_path), "host": LOOPBACK_V4},
                                tls={"cert_file": str(pki.server_cert), "key_file": str(pki.server_key),
                                     "ca_file": str(pki.ca)})

    async def health(port: int, tls: TlsSettings | None) -> Any:
        async with open_channel(f"{LOOPBACK_V4}:{port}", tls=tls) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            return (await stub.Check(health_pb2.HealthCheckRequest(), timeout=RPC_TIMEOUT_S)).status

    async def run() -> grpc.StatusCode:
        pipeline = await Pipeline.start(settings, ("draftcache",), grpc_servers=True, bind={"draftcache": 0})
        try:
            port = pipeline.ports["draftcache"]
            assert await health(port, settings.tls) == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await health(port, None)
            return err.value.code()
        finally:
            await pipeline.stop()

    assert asyncio.run(run()) == grpc.StatusCode.UNAVAILABLE


def test_http_endpoint_gets_the_same_certificate(pki: Pki) -> None:
    # uvicorn: the server certificate, and client certificates required under mutual TLS
    assert uvicorn_ssl(None) == {} and uvicorn_ssl(TlsSettings()) == {}
    plain = uvicorn_ssl(server_tls(pki))
    assert plain == {"ssl_certfile": str(pki.server_cert), "ssl_keyfile": str(pki.server_key)}
    mutual = uvicorn_ssl(server_tls(pki, mutual=True))
    assert mutual["ssl_cert_reqs"] == ssl.CERT_REQUIRED and mutual["ssl_ca_certs"] == str(pki.ca)


def get_health(port: int, context: ssl.SSLContext | None) -> int:
    """GET /health over HTTPS with ``context``, or plain HTTP without one: the status code."""
    if context is None:
        conn: http.client.HTTPConnection = http.client.HTTPConnection(LOOPBACK_V4, port, timeout=RPC_TIMEOUT_S)
    else:
        conn = http.client.HTTPSConnection(LOOPBACK_V4, port, timeout=RPC_TIMEOUT_S, context=context)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status
    finally:
        conn.close()


def test_http_endpoint_serves_https_and_mutual_tls(pki: Pki) -> None:
    # the OpenAI endpoint with [tls]: HTTPS verified against the CA answers; plain HTTP gets no answer;
    # under mutual TLS a client without a certificate is cut off and one with the CA's certificate answers
    from lookahead_rag.services.common.rules.limits import RequestLimits
    from lookahead_rag.services.http.server import HttpServer
    from lookahead_rag.services.http.settings import HttpSettings

    def context(cert: bool) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(pki.ca))
        if cert:
            ctx.load_cert_chain(pki.client_cert, pki.client_key)
        return ctx

    async def statuses(tls: TlsSettings) -> list[int | str]:
        engine = SimpleNamespace(limits=RequestLimits())  # the app reads the request limits; /health needs no more
        server = await HttpServer.start(engine, HttpSettings(host=LOOPBACK_V4, port=0), 0, tls)  # type: ignore[arg-type]
        got: list[int | str] = []
        try:
            for ctx in (context(cert=False), None, context(cert=True)):
                try:
                    got.append(await asyncio.to_thread(get_health, server.port, ctx))
                except (OSError, http.client.HTTPException):  # ssl.SSLError and resets are OSErrors
                    got.append("refused")
        finally:
            await server.stop()
        return got

    assert asyncio.run(statuses(server_tls(pki))) == [HTTPStatus.OK, "refused", HTTPStatus.OK]
    assert asyncio.run(statuses(server_tls(pki, mutual=True))) == ["refused", "refused", HTTPStatus.OK]
