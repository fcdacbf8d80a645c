"""The TLS tests' constants and the TlsSettings they build from the run-time PKI (services.common.auth.devpki)."""

from __future__ import annotations

from pathlib import Path

from lookahead_rag.services.common.auth.devpki import LOOPBACK_V4, Pki, make_pki
from lookahead_rag.services.common.auth.tls import TlsSettings
from lookahead_rag.v1 import draftcache_pb2_grpc

__all__ = ["LOOPBACK_V4", "RPC_TIMEOUT_S", "Pki", "Stub", "T", "client_tls", "make_pki", "server_tls"]

T = "acme"
RPC_TIMEOUT_S = 10.0  # a refused handshake fails at once; this only bounds a hang
Stub = draftcache_pb2_grpc.DraftCacheStub


def server_tls(pki: Pki, mutual: bool = False) -> TlsSettings:
    return TlsSettings(cert_file=pki.server_cert, key_file=pki.server_key,
                       client_ca_file=pki.ca if mutual else None)


def client_tls(pki: Pki, ca: Path | None = None, cert: Path | None = None, key: Path | None = None) -> TlsSettings:
    return TlsSettings(ca_file=ca or pki.ca, client_cert_file=cert, client_key_file=key)
