"""The gRPC side of ``services.common.auth``: one server interceptor checks every call.

    interceptors = [ObservabilityInterceptor(registry), *auth_interceptors(authenticator)]

Every method of every servicer on the server is checked before its handler runs (new RPCs
included: nothing to remember per method), except the health and reflection services, which
probes and tools reach without a credential and which tell nothing about a tenant. The request's
``tenant`` field names the tenant; a request without one (Snapshot, Stats over every tenant, a
streamed request) needs a credential for every tenant. Refusals are UNAUTHENTICATED or
PERMISSION_DENIED (``services.common.errors``), before the handler touches any data.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import grpc

from services.common.auth import AUTHORIZATION, Authenticator, subject_of
from services.common.errors import ServiceError, status_of
from services.common.handlers import HandlerInterceptor, check_first

log = logging.getLogger(__name__)

OPEN_METHOD_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")  # no tenant data behind them


def tenant_of(request: Any) -> str:
    """The request's tenant ("" when it has none: a call across every tenant)."""
    tenant = getattr(request, "tenant", "")
    return tenant if isinstance(tenant, str) else ""


class AuthInterceptor(HandlerInterceptor):
    """Refuse a call whose credential is missing, unknown or revoked, or is not for the request's tenant."""

    def __init__(self, auth: Authenticator) -> None:
        self.auth = auth

    async def guard(self, method: str, request: Any, context: grpc.aio.ServicerContext) -> None:
        """Return when the call may go on; else abort it with UNAUTHENTICATED or PERMISSION_DENIED."""
        metadata = context.invocation_metadata() or ()
        bearer = next((str(v) for k, v in metadata if k.lower() == AUTHORIZATION), None)
        try:
            principal = self.auth.check(bearer, subject_of(context.auth_context()), tenant_of(request))
        except ServiceError as exc:
            code, message = status_of(exc)
            log.info("%s refused: %s: %s", method, code.name, message)
            await context.abort(code, message)
            raise  # abort() raises; should it ever return, the call is still refused
        log.debug("%s by %s", method, principal.name)

    def wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        """The same handler, guarded (the open methods: unchanged)."""
        if method.startswith(OPEN_METHOD_PREFIXES):
            return handler
        return check_first(handler, partial(self.guard, method))


def auth_interceptors(auth: Authenticator | None) -> list[grpc.aio.ServerInterceptor]:
    """``[AuthInterceptor(auth)]`` when ``[auth] mode = "required"``, else none."""
    return [AuthInterceptor(auth)] if auth is not None and auth.required else []
