"""Callers are bound to tenants: who is calling (an API key or a client-certificate subject) and
whether they may use the tenant they ask for.

    auth = Authenticator(settings.auth)                   # one per process (one KeyStore)
    principal = auth.authenticate(bearer, subject)         # Unauthenticated without a valid credential
    auth.permit(principal, grpc_scope(method), method)    # PermissionDenied without the call's scope
    auth.authorize(principal, request.tenant)             # PermissionDenied for another tenant
    bind_principal(principal)                             # current_principal() for the handler (gRPC)

    metadata = call_metadata(settings.auth.service_key)   # what a client sends: request id + bearer key

A request without a tenant (Stats over every tenant, Snapshot) needs a credential for every tenant
(``*``) or ``admin``. What each call needs is one table (``lookahead_rag.services.common.auth.scopes``).
Messages are one line and never contain the key. The gRPC side is
``lookahead_rag.services.common.auth.interceptor.AuthInterceptor``; the HTTP side
``lookahead_rag.services.http.guard.RequestGuard``.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass

from pydantic import SecretStr

from lookahead_rag.services.common.auth.keys import KeyStore
from lookahead_rag.services.common.auth.scopes import Scope, check_scope, holds
from lookahead_rag.services.common.auth.settings import ALL_TENANTS, AuthSettings
from lookahead_rag.services.common.errors import PermissionDenied, Unauthenticated
from lookahead_rag.services.common.telemetry.logs import outgoing_metadata

log = logging.getLogger(__name__)

AUTHORIZATION = "authorization"  # gRPC metadata key / HTTP header (both lower case on the wire)
BEARER = "bearer"  # the scheme, matched case-insensitively (RFC 6750)
CN_PROPERTY = "x509_common_name"  # the peer certificate's subject CN in grpc's auth_context()
API_KEY_ENV = "LAR_API_KEY"  # the command-line clients' key when --api-key is not given


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: what to call it in logs, the tenants it may use and what it may do."""

    name: str  # "key k3f9a1c2b" or "cert CN=..." (never the key)
    tenants: frozenset[str]
    scopes: frozenset[Scope] = frozenset()  # services.common.auth.scopes (none: no call but the open ones)

    @property
    def admin(self) -> bool:
        return Scope.ADMIN in self.scopes

    @property
    def all_tenants(self) -> bool:
        """Every tenant: a ``*`` credential, or an admin one."""
        return ALL_TENANTS in self.tenants or self.admin

    def may(self, scope: Scope) -> bool:
        return holds(self.scopes, scope)

    def allows(self, tenant: str) -> bool:
        """Whether it may use ``tenant`` ("" = every tenant: only a ``*`` credential)."""
        return self.all_tenants or (bool(tenant) and tenant in self.tenants)

    @property
    def only_tenant(self) -> str | None:
        """Its one tenant, when it has exactly one (the HTTP endpoint's default)."""
        if len(self.tenants) == 1 and not self.all_tenants:
            return next(iter(self.tenants))
        return None


def bearer_token(header: str | None) -> str | None:
    """The key of an ``authorization: Bearer <key>`` value; None when absent (Unauthenticated if malformed)."""
    if header is None:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != BEARER or not token or " " in token:
        raise Unauthenticated("malformed authorization: expected 'Bearer <key>'")
    return token


def subject_of(auth_context: Mapping[str, Iterable[bytes]] | None) -> str | None:
    """The peer certificate's subject CN, when the TLS handshake verified one.

    grpc sets it only for a peer certificate it verified: the server asks for a client certificate
    only with ``require_client_auth`` (mTLS), and then refuses one its CA did not sign.
    """
    values = list((auth_context or {}).get(CN_PROPERTY, ()))
    return values[0].decode("utf-8", "replace") if values else None


class Authenticator:
    """Credentials -> Principal, by the ``[auth]`` settings and the keys file."""

    def __init__(self, settings: AuthSettings, store: KeyStore | None = None) -> None:
        self.settings = settings
        self.store = store if store is not None else KeyStore(settings.keys_file)

    @property
    def required(self) -> bool:
        return self.settings.required

    def authenticate(self, bearer: str | None, subject: str | None = None) -> Principal:
        """The caller of a request with this authorization value and certificate subject. A bearer key
        wins over the certificate when both are given; neither is Unauthenticated."""
        token = bearer_token(bearer)
        if token is not None:
            key = self.store.find(token)
            if key is None:
                raise Unauthenticated("unknown or revoked API key")
            return Principal(f"key {key.id}", frozenset(key.tenants), frozenset(key.scopes))
        if subject is not None:
            grant = self.settings.subject(subject)
            if grant is None:
                raise Unauthenticated(f"client certificate CN={subject!r} is not in [auth] cert_subjects")
            return Principal(f"cert CN={subject}", frozenset(grant[0]), frozenset(grant[1]))
        raise Unauthenticated("no credential: send 'authorization: Bearer <key>' (or a client certificate)")

    @staticmethod
    def permit(principal: Principal, scope: Scope | None, call: str) -> None:
        """PermissionDenied unless ``principal`` holds ``scope`` (what ``call`` needs; None: undeclared)."""
        check_scope(principal.name, principal.scopes, scope, call)

    @staticmethod
    def authorize(principal: Principal, tenant: str) -> None:
        """PermissionDenied unless ``principal`` may use ``tenant`` ("" = every tenant)."""
        if principal.allows(tenant):
            return
        if not tenant:
            raise PermissionDenied(f"{principal.name} may not make calls across every tenant (needs *)")
        raise PermissionDenied(f"{principal.name} may not use tenant {tenant!r}")

    def check(self, bearer: str | None, subject: str | None, tenant: str, scope: Scope | None = Scope.ANSWER,
              call: str = "this call") -> Principal:
        """The caller, when it may make ``call`` (needing ``scope``) on ``tenant``; else the refusal."""
        principal = self.authenticate(bearer, subject)
        self.permit(principal, scope, call)
        self.authorize(principal, tenant)
        return principal


# ---- the caller of the request in progress (a gRPC handler's; the HTTP routes read request.state) ----
_principal: ContextVar[Principal | None] = ContextVar("lar_principal", default=None)


def current_principal() -> Principal | None:
    """The authenticated caller of the current gRPC call; None when auth is off (nobody was asked)."""
    return _principal.get()


def bind_principal(principal: Principal | None) -> None:
    """Set the current call's caller (the auth interceptor, once the call is allowed)."""
    _principal.set(principal)


def sees_engine_load(principal: Principal | None) -> bool:
    """Whether a caller may see the engine's load in an answer's stats (batch sizes, queue wait: other
    tenants' traffic): an admin, or anyone when auth is off (no principal)."""
    return principal is None or principal.admin


def secret_value(key: SecretStr | str | None) -> str | None:
    if isinstance(key, SecretStr):
        return key.get_secret_value() or None
    return key or None


def bearer_metadata(key: SecretStr | str | None) -> tuple[tuple[str, str], ...]:
    """``(("authorization", "Bearer <key>"),)``, or nothing without a key."""
    value = secret_value(key)
    return ((AUTHORIZATION, f"Bearer {value}"),) if value else ()


def call_metadata(key: SecretStr | str | None) -> tuple[tuple[str, str], ...]:
    """What a client sends on each call: the request id (``outgoing_metadata``) and its key."""
    return (*outgoing_metadata(), *bearer_metadata(key))


def add_key_argument(parser: argparse.ArgumentParser) -> None:
    """``--api-key`` for a command-line client (default: ``$LAR_API_KEY``; none: no credential sent)."""
    parser.add_argument("--api-key", default=os.environ.get(API_KEY_ENV) or None,
                        help=f"API key sent as 'authorization: Bearer <key>' (default: ${API_KEY_ENV})")
