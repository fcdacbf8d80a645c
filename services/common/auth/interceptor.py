"""The gRPC side of ``lookahead_rag.services.common.auth.callers``: one server interceptor checks every call.

    interceptors = server_interceptors(registry, authenticator)   # observability outermost, then auth

Every method of every servicer on the server is checked before its handler runs, except the health
and reflection services, which probes and tools reach without a credential and which tell nothing
about a tenant. The caller needs the method's scope (``lookahead_rag.services.common.auth.scopes``: one table for every
RPC; a method not in it is refused, so a new RPC must be declared there). The request's ``tenant``
field names the tenant; a request without one (Snapshot, Stats over every tenant, a streamed
request) needs a credential for every tenant. Refusals are UNAUTHENTICATED or PERMISSION_DENIED
(``lookahead_rag.services.common.errors``), before the handler touches any data.

Once a call is allowed, its principal is bound (``auth.current_principal()``, for what only an admin
may see) and so is its tenant for log lines: the observability interceptor binds no tenant itself
when auth is on, so an unauthenticated caller cannot put a tenant of its choice in the log.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import grpc
from prometheus_client import CollectorRegistry

from lookahead_rag.services.common.auth.callers import AUTHORIZATION, Authenticator, bind_principal, subject_of
from lookahead_rag.services.common.auth.scopes import Scope, grpc_scope
from lookahead_rag.services.common.errors import ServiceError, status_of
from lookahead_rag.services.common.rpc.handlers import HandlerInterceptor, check_first
from lookahead_rag.services.common.telemetry.logs import bind_tenant
from lookahead_rag.services.common.telemetry.observability import ObservabilityInterceptor

log = logging.getLogger(__name__)


def tenant_of(request: Any) -> str:
    """The request's tenant ("" when it has none: a call across every tenant)."""
    tenant = getattr(request, "tenant", "")
    return tenant if isinstance(tenant, str) else ""


class AuthInterceptor(HandlerInterceptor):
    """Refuse a call whose credential is missing, unknown or revoked, lacks the method's scope, or is
    not for the request's tenant."""

    def __init__(self, auth: Authenticator) -> None:
        self.auth = auth

    async def guard(self, method: str, request: Any, context: grpc.aio.ServicerContext) -> None:
        """Return when the call may go on; else abort it with UNAUTHENTICATED or PERMISSION_DENIED."""
        metadata = context.invocation_metadata() or ()
        bearer = next((str(v) for k, v in metadata if k.lower() == AUTHORIZATION), None)
        tenant = tenant_of(request)
        try:
            principal = self.auth.check(bearer, subject_of(context.auth_context()), tenant, grpc_scope(method),
                                        method)
        except ServiceError as exc:
            code, message = status_of(exc)
            log.info("%s refused: %s: %s", method, code.name, message)
            await context.abort(code, message)
            raise  # abort() raises; should it ever return, the call is still refused
        bind_principal(principal)
        bind_tenant(tenant or None)  # only now: the tenant is one the caller may use
        log.debug("%s by %s", method, principal.name)

    def wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        """The same handler, guarded (the open methods: unchanged)."""
        if grpc_scope(method) is Scope.OPEN:
            return handler
        return check_first(handler, partial(self.guard, method))


def auth_interceptors(auth: Authenticator | None) -> list[grpc.aio.ServerInterceptor]:
    """``[AuthInterceptor(auth)]`` when ``[auth] mode = "required"``, else none."""
    return [AuthInterceptor(auth)] if auth is not None and auth.required else []


def server_interceptors(registry: CollectorRegistry | None, auth: Authenticator | None
                        ) -> list[grpc.aio.ServerInterceptor]:
    """Every server's interceptors, outermost first: observability (which binds the request's tenant
    itself only when no credential is asked for), then the auth guard when auth is required."""
    guards = auth_interceptors(auth)
    return [ObservabilityInterceptor(registry, bind_tenant=not guards), *guards]
