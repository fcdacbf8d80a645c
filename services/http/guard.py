"""The HTTP request guard: who is calling, whether they may call the route, and how much body they
may send, all decided before a byte of the body is read (FastAPI parses a route's body before the
route runs, so the route itself is too late).

    app.add_middleware(RequestGuard, front=front, router=app.router)   # services.http.routes.make_app

For each HTTP request, in order:

1. the route it reaches (its path template). A request that reaches none passes through: FastAPI
   answers 404 or 405 without reading its body.
2. with ``[auth] mode = "required"``: the route's scope (``lookahead_rag.services.common.auth.scopes``, the one table; a
   route not in it is refused) and the caller's credential (``Authorization: Bearer <key>``): 401
   without a valid one, 403 without the scope. The caller goes on the request's state
   (``request.state.principal``) for the route to check the tenant.
3. a request with a body (POST, PUT, PATCH) must declare ``Content-Type: application/json``: 415
   otherwise (``lookahead_rag.services.http.origin``), whatever the installed FastAPI would accept.
4. the body, read up to ``[http] max_body_bytes``: 413 past it, at once for a larger Content-Length
   and, for a chunked body, as soon as what came passes the limit (nothing more is read). The body
   read is handed on to the application.

Refusals have the OpenAI error shape (``lookahead_rag.services.http.errors``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.datastructures import Headers
from starlette.routing import Match, Router
from starlette.types import ASGIApp, Message, Receive, Send
from starlette.types import Scope as AsgiScope

from lookahead_rag.services.common.auth import scopes
from lookahead_rag.services.common.auth.callers import AUTHORIZATION, Authenticator, Principal
from lookahead_rag.services.common.errors import ServiceError
from lookahead_rag.services.http import errors
from lookahead_rag.services.http.origin import check_json

if TYPE_CHECKING:
    from lookahead_rag.services.http.routes import Frontend

PRINCIPAL = "principal"  # request.state.principal: the authenticated caller (None: auth off, or an open route)
CONTENT_LENGTH = "content-length"


def route_of(router: Router, scope: AsgiScope) -> str | None:
    """The path template of the route ``scope`` reaches (method included), or None."""
    for route in router.routes:
        match, _ = route.matches(scope)
        if match is Match.FULL:
            return str(getattr(route, "path", ""))
    return None


def check_length(scope: AsgiScope, limit: int) -> None:
    """BodyTooLarge when the request declares a body longer than ``limit``."""
    declared = Headers(scope=scope).get(CONTENT_LENGTH, "").strip()
    if declared.isdigit() and int(declared) > limit:
        raise errors.BodyTooLarge(too_large(limit))


def too_large(limit: int) -> str:
    return f"request body over {limit} bytes ([http] max_body_bytes)"


async def read_body(receive: Receive, limit: int) -> Receive:
    """Read the body up to ``limit`` bytes (BodyTooLarge as soon as it passes: no more is read); the
    ``receive`` the application gets: the body read, then ``receive``'s later messages (disconnect)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":  # http.disconnect: the application sees it
            break
        body = message.get("body", b"")
        size += len(body)
        if size > limit:
            raise errors.BodyTooLarge(too_large(limit))
        chunks.append(body)
        if not message.get("more_body", False):
            message = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            break
    pending: list[Message] = [message]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay


class RequestGuard:
    """ASGI middleware: authentication, the route's scope and the body limit before the application."""

    def __init__(self, app: ASGIApp, front: Frontend, router: Router) -> None:
        self.app = app
        self.front = front
        self.router = router

    def admit(self, scope: AsgiScope, path: str | None) -> Principal | None:
        """The caller of an HTTP request, when it may call the route it reaches, ``path`` (None: auth
        off, an open route, or no route); Unauthenticated or PermissionDenied otherwise."""
        auth = self.front.auth
        if auth is None or path is None:
            return None
        method = str(scope.get("method", ""))
        needed = scopes.http_scope(method, path)
        if needed is scopes.Scope.OPEN:
            return None
        principal = auth.authenticate(Headers(scope=scope).get(AUTHORIZATION))
        Authenticator.permit(principal, needed, f"{method} {path}")
        return principal

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.front.settings.max_body_bytes
        path = route_of(self.router, scope)
        try:
            principal = self.admit(scope, path)
            if path is not None:  # no route: FastAPI's 404 or 405, the body unread
                check_json(scope)
            check_length(scope, limit)
            body = await read_body(receive, limit)
        except ServiceError as exc:
            await errors.error_response(exc)(scope, receive, send)
            return
        state: dict[str, Any] = scope.setdefault("state", {})
        state[PRINCIPAL] = principal
        await self.app(scope, body, send)
