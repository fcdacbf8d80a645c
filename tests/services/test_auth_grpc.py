"""The auth interceptor on a real gRPC server (the draft cache: no model needed): every RPC with a
bad credential is refused before it touches the store, the right key works, a revoked key stops
working on the running server, health stays open, and an mTLS subject is a credential."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from lookahead_rag.services.common.auth.callers import Authenticator
from lookahead_rag.services.common.auth.interceptor import AuthInterceptor
from lookahead_rag.services.common.auth.keys import KeyFile
from lookahead_rag.services.common.auth.settings import AuthSettings
from lookahead_rag.services.common.rules.limits import RequestLimits
from lookahead_rag.services.common.telemetry.observability import ObservabilityInterceptor
from lookahead_rag.services.draftcache.build import build_draftcache
from lookahead_rag.services.events.inprocess import InProcessBus
from lookahead_rag.v1 import draftcache_pb2 as pb
from lookahead_rag.v1 import draftcache_pb2_grpc
from tests.builders import TOKENIZER
from tests.services.auth_cases import Cases, bad_credentials, md
from tests.services.draftcache_helpers import small_settings

module_loop = pytest.mark.asyncio(loop_scope="module")  # the tests share the module's server

A, B = "acme", "beta"
IDS = [5, 6, 7, 8, 9]
DENIED = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED}
CERT_DAYS = 1


@dataclass
class Server:
    service: Any
    target: str
    keys: KeyFile
    tokens: dict[str, str]  # who -> key
    revoked_id: str


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Server]:
    root = tmp_path_factory.mktemp("auth-grpc")
    keys = KeyFile(root / "keys.json")
    tokens = {who: keys.add(tenants, who, ["admin"] if who == "admin" else ["answer", "write"])[1]
              for who, tenants in {"acme": [A], "beta": [B], "admin": ["*"], "acme2": [A]}.items()}
    revoked, tokens["revoked"] = keys.add([A], "revoked")
    keys.revoke(revoked.id)
    auth = Authenticator(AuthSettings(mode="required", keys_file=keys.path))
    registry = CollectorRegistry()
    service = await build_draftcache(small_settings(data_dir=root / "dc"), RequestLimits(), InProcessBus(), registry)
    await service.start()
    port = await service.serve(port=0, interceptors=[ObservabilityInterceptor(registry), AuthInterceptor(auth)])
    service.core.add_output(A, TOKENIZER, IDS, "seed")  # acme's data, which no refused call may touch
    try:
        yield Server(service, f"127.0.0.1:{port}", keys, tokens, revoked.id)
    finally:
        await service.stop(grace_s=1.0)


def file_state(path: Path) -> int | None:
    """The file's mtime (ns), or None when there is none."""
    return path.stat().st_mtime_ns if path.exists() else None


Rpc = Callable[[draftcache_pb2_grpc.DraftCacheStub, Any], Awaitable[Any]]
# every DraftCache RPC, aimed at tenant acme (Stats over every tenant and Snapshot have no tenant)
RPCS: dict[str, Rpc] = {
    "AddOutput": lambda s, m: s.AddOutput(pb.AddOutputRequest(tenant=A, tokenizer_id=TOKENIZER, output_ids=[1, 2, 3],
                                                              event_id="intruder"), metadata=m),
    "Fetch": lambda s, m: s.Fetch(pb.FetchRequest(tenant=A, tokenizer_id=TOKENIZER, prompt_ids=IDS[:2], budget=8),
                                  metadata=m),
    "Stats": lambda s, m: s.Stats(pb.DraftStatsRequest(tenant=A), metadata=m),
    "Stats(all tenants)": lambda s, m: s.Stats(pb.DraftStatsRequest(), metadata=m),
    "Snapshot": lambda s, m: s.Snapshot(pb.SnapshotRequest(), metadata=m),
}
NO_TENANT = {"Stats(all tenants)", "Snapshot"}


def cases_for(srv: Server, rpc: str) -> Cases:
    """The bad-credential cases for ``rpc`` on acme's data."""
    tokens = srv.tokens
    return bad_credentials(tokens["acme"], tokens["beta"], tokens["revoked"], rpc in NO_TENANT)


async def codes_of(srv: Server, rpc: str) -> dict[str, grpc.StatusCode]:
    got = {}
    async with grpc.aio.insecure_channel(srv.target) as channel:
        stub = draftcache_pb2_grpc.DraftCacheStub(channel)
        for case, (metadata, _) in cases_for(srv, rpc).items():
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await RPCS[rpc](stub, metadata)
            got[case] = err.value.code()
            # one line, and never the key that was sent
            assert "\n" not in (err.value.details() or "") and srv.tokens["acme"] not in (err.value.details() or "")
    return got


@module_loop
@pytest.mark.parametrize("rpc", list(RPCS))
async def test_every_rpc_refuses_every_bad_credential_and_touches_nothing(server: Server, rpc: str) -> None:
    store = server.service.core
    before, snapshot_before = store.stats(), file_state(store.settings.snapshot_path())
    got = await codes_of(server, rpc)
    # each class gets its own code: UNAUTHENTICATED without a valid key, PERMISSION_DENIED for another tenant
    assert got == {case: code for case, (_, code) in cases_for(server, rpc).items()}
    # the store is as it was: no output added, and no snapshot written
    assert store.stats() == before and file_state(store.settings.snapshot_path()) == snapshot_before


@module_loop
@pytest.mark.parametrize("rpc", list(RPCS))
async def test_the_right_key_works(server: Server, rpc: str) -> None:
    # acme's key for acme's calls; the all-tenant calls with the admin (*) key
    token = server.tokens["admin" if rpc in NO_TENANT else "acme"]
    async with grpc.aio.insecure_channel(server.target) as channel:
        reply = await RPCS[rpc](draftcache_pb2_grpc.DraftCacheStub(channel), md(token))
    assert reply is not None


@module_loop
async def test_revoking_a_key_takes_effect_on_the_running_server(server: Server) -> None:
    token = server.tokens["acme2"]
    async with grpc.aio.insecure_channel(server.target) as channel:
        stub = draftcache_pb2_grpc.DraftCacheStub(channel)
        await stub.Stats(pb.DraftStatsRequest(tenant=A), metadata=md(token))  # works now
        (record,) = [k for k in server.keys.load() if k.name == "acme2"]
        server.keys.revoke(record.id)
        # the next call, same server, no restart: refused
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Stats(pb.DraftStatsRequest(tenant=A), metadata=md(token))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


@module_loop
async def test_health_needs_no_credential(server: Server) -> None:
    async with grpc.aio.insecure_channel(server.target) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))
    # probes reach health without a key (it tells nothing about any tenant)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


# --- mTLS: a verified client-certificate subject is a credential ---------------------------------------

def _cert(subject: str, issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None, server: bool = False
          ) -> tuple[bytes, bytes, x509.Name, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    issuer_name, issuer_key = issuer if issuer is not None else (name, key)
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer_name).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
               .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
               .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True))
    if server:
        sans = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(issuer_key, hashes.SHA256())
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem, name, key


@module_loop
async def test_a_client_certificate_subject_binds_tenants(tmp_path: Path) -> None:
    ca_pem, _, ca_name, ca_key = _cert("test-ca", None)
    server_pem, server_key, _, _ = _cert("localhost", (ca_name, ca_key), server=True)
    clients = {cn: _cert(cn, (ca_name, ca_key)) for cn in ("batch-job", "stranger")}
    auth = Authenticator(AuthSettings(mode="required", cert_subjects={"batch-job": [A]}))
    service = await build_draftcache(small_settings(), RequestLimits(), InProcessBus(), CollectorRegistry())
    await service.start()
    credentials = grpc.ssl_server_credentials([(server_key, server_pem)], root_certificates=ca_pem,
                                              require_client_auth=True)
    port = await service.serve(port=0, interceptors=[AuthInterceptor(auth)], credentials=credentials)
    try:
        async def stats(cn: str, tenant: str) -> grpc.StatusCode:
            cert, key = clients[cn][0], clients[cn][1]
            creds = grpc.ssl_channel_credentials(ca_pem, key, cert)
            async with grpc.aio.secure_channel(f"127.0.0.1:{port}", creds) as channel:  # the IP SAN
                try:
                    await draftcache_pb2_grpc.DraftCacheStub(channel).Stats(pb.DraftStatsRequest(tenant=tenant),
                                                                            timeout=30)
                except grpc.aio.AioRpcError as err:
                    return err.code()
            return grpc.StatusCode.OK

        # the mapped subject, for its tenant: in
        assert await stats("batch-job", A) == grpc.StatusCode.OK
        # the mapped subject, another tenant: denied
        assert await stats("batch-job", B) == grpc.StatusCode.PERMISSION_DENIED
        # a certificate the CA signed but no one mapped: not a credential
        assert await stats("stranger", A) == grpc.StatusCode.UNAUTHENTICATED
    finally:
        await service.stop(grace_s=1.0)


def test_the_cases_cover_every_draftcache_rpc() -> None:
    # a new RPC must be added to RPCS (the interceptor guards it anyway; this keeps the test honest)
    methods = set(pb.DESCRIPTOR.services_by_name["DraftCache"].methods_by_name)
    assert {name.split("(")[0] for name in RPCS} == methods
