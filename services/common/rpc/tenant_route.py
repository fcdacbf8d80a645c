"""The tenant as a routing header: what a proxy hashes on to send each tenant to the replica that holds
its caches (deploy/haproxy/haproxy.cfg, deploy/k8s/routing/), and the server's check that it tells the truth.

    stub.Answer(request, metadata=(*call_metadata(key), *tenant_metadata(request.tenant)))   # a client
    interceptors = [*server_interceptors(registry, auth), TenantRouteInterceptor()]         # a server

The header is ``x-tenant`` on both doors: gRPC metadata here, the HTTP endpoint's ``[http]
tenant_header`` there (where it *is* the request's tenant). At most one value: proxies disagree on
several (Envoy hashes all of them sorted; deploy/haproxy refuses more than one itself), so a second
value would let a client steer its call to a replica of its choosing while the server read the first;
more than one is INVALID_ARGUMENT (one line) on every call. It is optional unless the server runs behind
a tenant-routing proxy (``[generator] tenant_routing``, the ``required`` flag here): a call without it
would be balanced by the proxy's fallback (round robin), onto any replica. A call that sends it must
name the request's own ``tenant``, which the auth guard (outermost) has already checked against the
caller's credential: so a header naming any other tenant is PERMISSION_DENIED before the handler runs,
and a client cannot pick another tenant's replica (to read timing from its caches) while asking for its
own. A request without a tenant field (Stats over every tenant, Snapshot) needs a credential for every
tenant already, so its header is neither compared nor required.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc

from lookahead_rag.services.common.auth.interceptor import tenant_of
from lookahead_rag.services.common.auth.scopes import Scope, grpc_scope
from lookahead_rag.services.common.errors import InvalidArgument, PermissionDenied, ServiceError, status_of
from lookahead_rag.services.common.rpc.handlers import HandlerInterceptor, check_first

log = logging.getLogger(__name__)

TENANT_METADATA = "x-tenant"  # gRPC metadata key a proxy hashes on (lower case: gRPC metadata keys are)
UNARY_REQUEST_KINDS = ("unary_unary", "unary_stream")  # one request message: it has a tenant field to compare


def tenant_metadata(tenant: str) -> tuple[tuple[str, str], ...]:
    """What a client adds to a call for ``tenant`` (nothing for no tenant)."""
    return ((TENANT_METADATA, tenant),) if tenant else ()


def header_tenants(metadata: Any) -> list[str]:
    """Every ``x-tenant`` value of a call's invocation metadata, in order (none: [])."""
    return [str(v) for k, v in metadata or () if k.lower() == TENANT_METADATA]


def check_route(headers: list[str], tenant: str, required: bool = False) -> None:
    """Raise InvalidArgument for more than one routing header, or none when ``required`` and the request
    has a tenant; PermissionDenied when it names another tenant than the request's."""
    if len(headers) > 1:
        raise InvalidArgument(f"send one {TENANT_METADATA} metadata value, not {len(headers)}")
    if not headers:
        if required and tenant:
            raise InvalidArgument(f"tenant routing is on: send the {TENANT_METADATA} metadata naming the "
                                  "request's tenant")
        return
    if tenant and headers[0] != tenant:
        raise PermissionDenied(f"the {TENANT_METADATA} metadata must name the request's tenant")


class TenantRouteInterceptor(HandlerInterceptor):
    """Refuse a call with more than one ``x-tenant`` metadata value, or none when ``required`` (INVALID_ARGUMENT),
    or whose value is not its request's tenant (PERMISSION_DENIED)."""

    def __init__(self, required: bool = False) -> None:
        self.required = required  # behind a tenant-routing proxy ([generator] tenant_routing): no header, no call

    async def guard(self, method: str, request: Any, context: grpc.aio.ServicerContext) -> None:
        try:
            check_route(header_tenants(context.invocation_metadata()), tenant_of(request), self.required)
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
