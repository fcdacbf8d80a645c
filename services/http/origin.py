"""Where an HTTP request says it comes from and what it says it sends, checked before any route runs.

- **Host** (DNS rebinding): a page on ``evil.example`` whose name its DNS re-points at 127.0.0.1 is, to
  the browser, the same origin as that name, so it may read what an auth-off loopback endpoint (``demo
  --serve``) answers. The browser still sends ``Host: evil.example``. ``HostGuard`` (installed by
  ``HttpServer.start`` only when it binds loopback with auth off) serves only a Host naming loopback
  (``localhost``, 127.0.0.0/8, ``[::1]``, any port) or one of ``[http] allowed_hosts``: 421 otherwise.
- **JSON bodies** (``check_json``, called by the request guard): a POST, PUT or PATCH to a route must
  say ``Content-Type: application/json``, else 415. A cross-site form or ``text/plain`` fetch needs no
  CORS preflight; refusing it here does not depend on which FastAPI version is installed (some parse
  a JSON body whatever its Content-Type).
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Send
from starlette.types import Scope as AsgiScope

from lookahead_rag.services.common.auth.tls import is_loopback
from lookahead_rag.services.http import errors
from lookahead_rag.services.http.errors import ForeignHost, NotJson

HOST = "host"  # the request header naming the server it was meant for
CONTENT_TYPE = "content-type"
JSON = "application/json"  # the one media type our request bodies have
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})  # methods whose body a route parses
PORT_SEPARATOR = ":"


def host_name(header: str) -> str:
    """The name in a Host header, without its port, lower case: ``[::1]:8080`` -> ``[::1]``."""
    value = header.strip().lower()
    if value.startswith("["):  # an IPv6 literal: its port (if any) follows the bracket
        return value[:value.find("]") + 1] if "]" in value else value
    return value.partition(PORT_SEPARATOR)[0]


def host_allowed(header: str | None, extra: frozenset[str]) -> bool:
    """Whether a request with this Host header may be served on loopback with auth off (no header: a
    client that is not a browser, which always sends one)."""
    if header is None:
        return True
    name = host_name(header)
    return is_loopback(name) or name in extra


def check_json(scope: AsgiScope) -> None:
    """NotJson unless a request that carries a body declares ``application/json``."""
    if str(scope.get("method", "")).upper() not in BODY_METHODS:
        return
    declared = Headers(scope=scope).get(CONTENT_TYPE, "")
    if declared.partition(";")[0].strip().lower() != JSON:
        raise NotJson(f"send the request body as JSON with 'Content-Type: {JSON}' "
                      f"(got {declared.strip()[:60]!r})")


class HostGuard:
    """ASGI middleware: 421 for a request whose Host is not loopback nor among ``extra`` names."""

    def __init__(self, app: ASGIApp, extra: Iterable[str] = ()) -> None:
        self.app = app
        self.extra = frozenset(name.strip().lower() for name in extra)

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = Headers(scope=scope).get(HOST)
        if not host_allowed(header, self.extra):
            refusal = ForeignHost(f"Host {host_name(header or '')[:60]!r} is not served here: this endpoint "
                                  "listens on loopback without auth (add the name to [http] allowed_hosts)")
            await errors.error_response(refusal)(scope, receive, send)
            return
        await self.app(scope, receive, send)
