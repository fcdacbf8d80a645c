"""The bad credentials every authenticated gRPC call is tried with, and the code each must get
(the interceptor's tests on one server here, and the whole pipeline's in tests/pipeline)."""

from __future__ import annotations

import grpc

Metadata = tuple[tuple[str, str], ...]
Cases = dict[str, tuple[Metadata, grpc.StatusCode]]


def md(token: str | None, scheme: str = "Bearer") -> Metadata:
    """The call metadata carrying ``token`` (none when it is None)."""
    return () if token is None else (("authorization", f"{scheme} {token}"),)


def bad_credentials(own: str, other: str, revoked: str, all_tenants: bool) -> Cases:
    """Credential class -> (metadata, the code it must get) for a call on the data of the tenant whose
    key is ``own``; ``other``: another tenant's key, ``revoked``: a revoked key for the same tenant,
    ``all_tenants``: the call reads across every tenant (then ``own`` alone is not enough either)."""
    unauth, denied = grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED
    cases = {
        "missing": (md(None), unauth),
        "wrong scheme": (md(own, "Basic"), unauth),
        "empty key": ((("authorization", "Bearer "),), unauth),
        "unknown key": (md("lar_" + "x" * 43), unauth),
        "tampered key": (md(own[:-2]), unauth),
        "revoked key": (md(revoked), unauth),
        "key in another header": ((("x-api-key", own),), unauth),
        "other tenant's key": (md(other), denied),
    }
    if all_tenants:  # a call across every tenant needs *: the tenant's own key is not enough
        cases["one-tenant key on an all-tenant call"] = (md(own), denied)
    return cases
