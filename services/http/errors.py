"""The one place that maps errors to HTTP statuses, in OpenAI's error shape.

The generator raises the same ``ServiceError`` classes for HTTP as for gRPC
(``lookahead_rag.services.common.errors``); here each becomes a status and a body
``{"error": {"message", "type", "param", "code"}}`` (``code``: the gRPC status name in lower case;
``param``: the request field at fault when known, else null)::

    InvalidArgument                      -> 400     NotFound           -> 404
    Unauthenticated                      -> 401     PermissionDenied   -> 403
    BodyTooLarge (a ResourceExhausted)   -> 413     ResourceExhausted  -> 429
    Unavailable, FailedPrecondition      -> 503
    DeadlineExceeded, TimeoutError       -> 504     anything else      -> 500 (one line; traceback logged)

A ResourceExhausted that knows when to retry (a tenant's quota) adds ``Retry-After`` (whole seconds).

FailedPrecondition is 503: on this path it means the deployment is wrong (the generator and the
retriever serve different models), which the caller cannot fix by changing the request; 412 is
about conditional request headers. FastAPI's own errors are reshaped too: a
malformed body or a wrong type is a 400 (not FastAPI's 422), an unknown path a 404.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Collection
from http import HTTPStatus
from typing import Any

import grpc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from lookahead_rag.services.common.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    ServiceError,
    Unauthenticated,
    Unavailable,
    one_line,
    retry_after_of,
    status_of,
)

log = logging.getLogger(__name__)


class BodyTooLarge(ResourceExhausted):
    """A request body past ``[http] max_body_bytes`` (refused before the rest of it is read)."""


class ForeignHost(InvalidArgument):
    """A Host header naming neither loopback nor ``[http] allowed_hosts`` on a loopback auth-off endpoint
    (services.http.origin: DNS rebinding)."""


class NotJson(InvalidArgument):
    """A request body without ``Content-Type: application/json`` (services.http.origin)."""


BAD_REQUEST = HTTPStatus.BAD_REQUEST
CLIENT_CLOSED = 499  # nginx's "client closed request": nobody reads it, the access log and metrics do
INTERNAL = (HTTPStatus.INTERNAL_SERVER_ERROR, "server_error")
# exception class -> (HTTP status, OpenAI error type); the first match wins
STATUSES: tuple[tuple[type[BaseException], int, str], ...] = (
    (ForeignHost, HTTPStatus.MISDIRECTED_REQUEST, "invalid_request_error"),
    (NotJson, HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "invalid_request_error"),
    (InvalidArgument, BAD_REQUEST, "invalid_request_error"),
    (Unauthenticated, HTTPStatus.UNAUTHORIZED, "authentication_error"),
    (PermissionDenied, HTTPStatus.FORBIDDEN, "permission_error"),
    (BodyTooLarge, HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "invalid_request_error"),
    (FailedPrecondition, HTTPStatus.SERVICE_UNAVAILABLE, "service_unavailable_error"),
    (NotFound, HTTPStatus.NOT_FOUND, "not_found_error"),
    (ResourceExhausted, HTTPStatus.TOO_MANY_REQUESTS, "rate_limit_error"),
    (Unavailable, HTTPStatus.SERVICE_UNAVAILABLE, "service_unavailable_error"),
    (DeadlineExceeded, HTTPStatus.GATEWAY_TIMEOUT, "timeout_error"),
    (TimeoutError, HTTPStatus.GATEWAY_TIMEOUT, "timeout_error"),
)
TYPES_BY_STATUS = {status: kind for _, status, kind in STATUSES}


PARAM_WORD = re.compile(r"^([a-z_]+)\b")  # a message that starts with a field's name is about that field


class InvalidParam(InvalidArgument):
    """An InvalidArgument about one request field, named in the error body's ``param``."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param  # the request body's field at fault


def error_body(message: str, kind: str, code: str, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error body: ``param`` is the request field at fault, None (null) when not known."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def param_of(exc: BaseException, fields: Collection[str] = ()) -> str | None:
    """The request field ``exc`` is about: its own ``param`` (InvalidParam), else the field among ``fields``
    (the body's) its message starts with (the generator's checks name the field first: "top_p must be ...")."""
    param = getattr(exc, "param", None)
    if isinstance(param, str):
        return param
    if not isinstance(exc, InvalidArgument):
        return None
    match = PARAM_WORD.match(str(exc))
    return match.group(1) if match and match.group(1) in fields else None


def http_error(exc: BaseException, fields: Collection[str] = ()) -> tuple[int, dict[str, Any]]:
    """The (status, body) ``exc`` maps to (``fields``: the request body's, to name the ``param`` at fault);
    an unexpected one is logged with its traceback."""
    code, message = status_of(exc)
    for cls, status, kind in STATUSES:
        if isinstance(exc, cls):
            log.info("chat completion -> %d: %s", status, message)
            return status, error_body(message, kind, code.name.lower(), param_of(exc, fields))
    log.error("chat completion failed", exc_info=exc)
    status, kind = INTERNAL
    return status, error_body(message, kind, grpc.StatusCode.INTERNAL.name.lower())


def error_response(exc: BaseException, headers: dict[str, str] | None = None,
                   fields: Collection[str] = ()) -> JSONResponse:
    status, body = http_error(exc, fields)
    if status == HTTPStatus.UNAUTHORIZED:  # RFC 6750: say which scheme to use
        headers = {**(headers or {}), "www-authenticate": "Bearer"}
    retry_after_s = retry_after_of(exc)
    if retry_after_s is not None:  # a quota refusal: when to come back (RFC 9110: whole seconds)
        headers = {**(headers or {}), "retry-after": retry_after_header(retry_after_s)}
    return JSONResponse(body, status_code=status, headers=headers)


def retry_after_header(seconds: float) -> str:
    """HTTP ``Retry-After``: whole seconds, rounded up (at least 1: 0 would invite an instant retry)."""
    return str(max(1, math.ceil(seconds)))


def _validation_message(exc: RequestValidationError) -> str:
    """pydantic's errors in one line: ``field.path: message; ...`` (the body's own errors unprefixed)."""
    parts = []
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        parts.append(f"{'.'.join(loc)}: {err.get('msg', 'invalid')}" if loc else str(err.get("msg", "invalid")))
    return one_line("; ".join(parts) or "invalid request body")


def _validation_param(exc: RequestValidationError) -> str | None:
    """The body field of the first error (its top-level name: ``messages`` for ``messages.0.role``), if any."""
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        return loc[0] if loc else None
    return None


async def _on_validation(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    body = error_body(_validation_message(exc), TYPES_BY_STATUS[BAD_REQUEST], "invalid_argument",
                      _validation_param(exc))
    return JSONResponse(body, status_code=BAD_REQUEST)


async def _on_http(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    kind = TYPES_BY_STATUS.get(exc.status_code, "invalid_request_error")
    body = error_body(one_line(exc.detail), kind, str(exc.status_code))
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


async def _on_service_error(_request: Request, exc: Exception) -> JSONResponse:
    return error_response(exc)


def install(app: FastAPI) -> None:
    """Route FastAPI's and our errors through this mapping."""
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(HTTPException, _on_http)
    app.add_exception_handler(ServiceError, _on_service_error)
