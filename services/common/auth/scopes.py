"""What each call needs: the ONE table of scopes, for every gRPC method and every HTTP route.

    scope = grpc_scope("/lookahead_rag.v1.Retriever/Ingest")     # Scope.WRITE; None: not declared
    scope = http_scope("POST", "/v1/chat/completions")           # Scope.ANSWER (the route's path template)

A credential (an API key, a client-certificate subject) holds scopes:

    answer  read a tenant's answers: Answer, Generate, Retrieve, Fetch, Stats, chat completions, models
    write   change a tenant's data: Ingest, Delete, Forget, AddOutput, POST /v1/documents
    admin   everything, for every tenant (Snapshot, and every other call)

``open`` calls need no credential at all (health, reflection, the chat page at ``/``; the HTTP schema
pages when ``[http] docs = true``). The gRPC ``AuthInterceptor`` and the HTTP guard both look calls up here; one that is
not in the table is refused (fail closed), so a new RPC or route must be declared here to be served.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from lookahead_rag.services.common.errors import PermissionDenied


class Scope(StrEnum):
    """What a credential may do (``admin`` includes the others); ``open``: what needs no credential."""

    ANSWER = "answer"
    WRITE = "write"
    ADMIN = "admin"
    OPEN = "open"


GRANTABLE = (Scope.ANSWER, Scope.WRITE, Scope.ADMIN)  # what a key or a subject may hold
DEFAULT_SCOPES = (Scope.ANSWER,)  # a new key's scopes unless it is given others
LEGACY_SCOPES = (Scope.ANSWER, Scope.WRITE)  # a credential written before scopes existed (one for *: admin)
PACKAGE = "lookahead_rag.v1"

# /package.Service/Method -> its scope
GRPC_SCOPES: dict[str, Scope] = {
    f"/{PACKAGE}.{method}": scope for method, scope in {
        "Generator/Answer": Scope.ANSWER,
        "Generator/Generate": Scope.ANSWER,
        "Retriever/Retrieve": Scope.ANSWER,
        "Retriever/Stats": Scope.ANSWER,
        "Retriever/Ingest": Scope.WRITE,
        "Retriever/Delete": Scope.WRITE,
        "Retriever/Forget": Scope.WRITE,
        "DraftCache/Fetch": Scope.ANSWER,
        "DraftCache/Stats": Scope.ANSWER,
        "DraftCache/AddOutput": Scope.WRITE,
        "DraftCache/Snapshot": Scope.ADMIN,
    }.items()
}
OPEN_GRPC_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")  # probes and tools: no tenant data

# (HTTP method, the route's path template) -> its scope
HTTP_SCOPES: dict[tuple[str, str], Scope] = {
    ("POST", "/v1/chat/completions"): Scope.ANSWER,
    ("POST", "/v1/completions"): Scope.ANSWER,
    ("GET", "/v1/models"): Scope.ANSWER,
    ("GET", "/v1/models/{model:path}"): Scope.ANSWER,
    ("GET", "/health"): Scope.OPEN,
    ("GET", "/"): Scope.OPEN,  # the chat page (services/http/page.py): static, no tenant data; its calls need keys
    ("POST", "/v1/documents"): Scope.WRITE,  # ingest (services/http/ingest.py), as the retriever's Ingest
    # FastAPI's schema pages, routed only with [http] docs = true
    ("GET", "/openapi.json"): Scope.OPEN,
    ("GET", "/docs"): Scope.OPEN,
    ("GET", "/docs/oauth2-redirect"): Scope.OPEN,
    ("GET", "/redoc"): Scope.OPEN,
}
HEAD_AS = {"HEAD": "GET"}  # a HEAD request needs what its GET needs


def grpc_scope(method: str) -> Scope | None:
    """The scope of a gRPC method (its full name); None: not declared (refused)."""
    if method.startswith(OPEN_GRPC_PREFIXES):
        return Scope.OPEN
    return GRPC_SCOPES.get(method)


def http_scope(method: str, path_template: str) -> Scope | None:
    """The scope of an HTTP route (its path template, e.g. ``/v1/models/{model:path}``); None: not declared."""
    upper = method.upper()
    return HTTP_SCOPES.get((HEAD_AS.get(upper, upper), path_template))


def parse_scopes(values: Iterable[str]) -> tuple[Scope, ...]:
    """Scope names (each may be a comma list: ``"answer,write"``), deduplicated in order; ValueError
    for a name that is not a grantable scope."""
    names = [part.strip() for value in values for part in value.split(",") if part.strip()]
    allowed = {s.value for s in GRANTABLE}
    unknown = [n for n in names if n not in allowed]
    if unknown:
        raise ValueError(f"unknown scope {unknown[0]!r}: one of {', '.join(sorted(allowed))}")
    return tuple(dict.fromkeys(Scope(n) for n in names))


def legacy_scopes(tenants: Iterable[str], all_tenants: str) -> tuple[Scope, ...]:
    """The scopes of a credential written before scopes existed: ``admin`` for one with every tenant
    (``all_tenants``, i.e. ``*``), else ``answer`` and ``write`` (what it could do then, less admin)."""
    return (Scope.ADMIN,) if all_tenants in tenants else LEGACY_SCOPES


def holds(scopes: Iterable[Scope], needed: Scope) -> bool:
    """Whether ``scopes`` allow a call needing ``needed`` (``admin`` allows everything)."""
    held = set(scopes)
    return needed is Scope.OPEN or needed in held or Scope.ADMIN in held


def check_scope(name: str, scopes: Iterable[Scope], needed: Scope | None, call: str) -> None:
    """PermissionDenied (one line) unless ``scopes`` allow ``call``; a call of no declared scope never is."""
    if needed is None:
        raise PermissionDenied(f"{call} has no declared scope: refused")
    if not holds(scopes, needed):
        raise PermissionDenied(f"{name} lacks the {needed.value!r} scope {call} needs")
