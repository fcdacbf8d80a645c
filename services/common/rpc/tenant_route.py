"""The tenant as a routing header: what a proxy hashes on to send each tenant to the replica that holds
its caches (deploy/caddy/Caddyfile, deploy/k8s/routing/), and the server's check that it tells the truth.

    stub.Answer(request, metadata=(*call_metadata(key), *tenant_metadata(request.tenant)))   # a client
    interceptors = [*server_interceptors(registry, auth), TenantRouteInterceptor()]         # a server

The header is ``x-tenant`` on both doors: gRPC metadata here, the HTTP endpoint's ``[http]
tenant_header`` there (where it *is* the request's tenant). It is optional: a call without it is
served as before (a proxy then balances it by its fallback policy). A call that sends it must name the
request's own ``tenant``, which the auth guard (outermost) has already checked against the caller's
credential: so a header naming any other tenant is PERMISSION_DENIED before the handler runs, and a
client cannot pick another tenant's replica (to read timing from its caches) while asking for its own.
A request without a tenant field (Stats over every tenant, Snapshot) needs a credential for every
tenant already, so its header is not compared.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc

from lookahead_rag.services.common.auth.interceptor import tenant_of
from lookahead_rag.services.common.auth.scopes import Scope, grpc_scope
from lookahead_rag.services.common.errors import PermissionDenied, ServiceError, status_of
from lookahead_rag.services.common.rpc.handlers import HandlerInterceptor, check_first

log = logging.getLogger(__name__)

TENANT_METADATA = "x-tenant"  # gRPC metadata key a proxy hashes on (lower case: gRPC metadata keys are)
UNARY_REQUEST_KINDS = ("unary_unary", "unary_stream")  # one request message: it has a tenant field to compare


def tenant_metadata(tenant: str) -> tuple[tuple[str, str], ...]:
    """What a client adds to a call for ``tenant`` (nothing for no tenant)."""
    return ((TENANT_METADATA, tenant),) if tenant else ()


def header_tenant(metadata: Any) -> str | None:
    """The ``x-tenant`` value of a call's invocation metadata, None when it has none."""
    return next((str(v) for k, v in metadata or () if k.lower() == TENANT_METADATA), None)


def check_route(header: str | None, tenant: str) -> None:
    """Raise PermissionDenied when the routing header names another tenant than the request's."""
    if header is not None and tenant and header != tenant:
        raise PermissionDenied(f"the {TENANT_METADATA} metadata must name the request's tenant")


class TenantRouteInterceptor(HandlerInterceptor):
    """Refuse a call whose ``x-tenant`` metadata is not its request's tenant (PERMISSION_DENIED)."""

    async def guard(self, method: str, request: Any, context: grpc.aio.ServicerContext) -> None:
        try:
            check_route(header_tenant(context.invocation_metadata()), tenant_of(request))
        except ServiceError as exc:
            code, message = status_of(exc)
            log.info("%s refused: %s: %s", method, code.name, message)
            await context.abort(code, message)
            raise

    def wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        if grpc_scope(method) is Scope.OPEN:
            return handler
        return check_first(handler, lambda request, context: self.guard(method, request, context),
                           UNARY_REQUEST_KINDS)
