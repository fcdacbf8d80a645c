"""Structured logs: one JSON object a line, every line of a request carrying its id and tenant.

    setup_logging("INFO")                        # once per process (json=False: readable text)
    with request_context(request_id, tenant):   # ObservabilityInterceptor does this for each gRPC call
        bind_tenant(request.tenant)              # once the servicer has parsed the tenant
        log.info("retrieved", extra={"chunks": 4})
        log_text(log, prompt, label="prompt")    # text only ever at DEBUG

A line: {"ts", "level", "logger", "msg", "request_id", "tenant", ...extras, "exc"}.
Prompt and answer text never reach a line above DEBUG: extras named in TEXT_FIELDS and arguments
wrapped in ``sensitive()`` are replaced by their length there; ``log_text`` logs at DEBUG only.
Outgoing gRPC calls pass the request id on with ``metadata=outgoing_metadata()``. A caller's request id
(``x-request-id``) is taken only when it is ``REQUEST_ID_PATTERN`` (ASCII letters, digits, ``._:-``, at
most 128): anything else gets a fresh id, so no caller's bytes reach log lines, response ids, events or
outgoing metadata (where a non-ASCII value would break the call).
"""

from __future__ import annotations

import json as _json
import logging
import re
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import IO, Any

REQUEST_ID_HEADER = "x-request-id"  # gRPC metadata key carrying the request id between services
# a caller's request id kept as sent: ASCII letters, digits and ._:- only, 1 to 128 of them (a UUID is 36)
REQUEST_ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,128}")

# Extras with these names hold user text: above DEBUG their values are replaced by their length.
TEXT_FIELDS = frozenset({
    "text", "prompt", "prompt_text", "question", "answer", "answer_text", "output", "output_text",
    "completion", "messages", "documents", "references", "content", "chunk", "chunks_text",
})

_request_id: ContextVar[str | None] = ContextVar("lar_request_id", default=None)
_tenant: ContextVar[str | None] = ContextVar("lar_tenant", default=None)

# LogRecord attributes that are not extras.
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}
_CORE = ("ts", "level", "logger", "msg", "request_id", "tenant")
_HANDLER_MARK = "_lookahead_rag_handler"


class sensitive(str):  # lower case: used like a function, log.info("got %s", sensitive(answer))
    """A log argument that holds user text: shown as its length above DEBUG."""

    __slots__ = ()


def new_request_id() -> str:
    return uuid.uuid4().hex


def safe_request_id(request_id: str | None) -> str | None:
    """``request_id`` when it matches ``REQUEST_ID_PATTERN``, else None (the caller makes a fresh one)."""
    return request_id if request_id and REQUEST_ID_PATTERN.fullmatch(request_id) else None


def current_request_id() -> str | None:
    return _request_id.get()


@contextmanager
def request_context(request_id: str | None = None, tenant: str | None = None) -> Iterator[str]:
    """Bind a request id and tenant to every log line inside; yields the id.

    None keeps what an enclosing request context bound (a servicer inside the gRPC interceptor's
    scope stays on the caller's ``x-request-id``); outside any request a new id is made. A ``request_id``
    that is not ``REQUEST_ID_PATTERN`` counts as None.
    """
    rid = safe_request_id(request_id) or _request_id.get() or new_request_id()
    rid_token, tenant_token = _request_id.set(rid), _tenant.set(tenant or _tenant.get())
    try:
        yield rid
    finally:
        for var, token in ((_tenant, tenant_token), (_request_id, rid_token)):
            try:
                var.reset(token)
            except ValueError:  # exited from another context (an async generator closed elsewhere)
                var.set(None)


def bind_tenant(tenant: str | None) -> None:
    """Set the tenant of the current request (until its request_context ends)."""
    _tenant.set(tenant)


def outgoing_metadata() -> tuple[tuple[str, str], ...]:
    """gRPC metadata passing the current request id on to a downstream service."""
    rid = _request_id.get()
    return ((REQUEST_ID_HEADER, rid),) if rid else ()


def log_text(logger: logging.Logger, text: str, label: str = "text") -> None:
    """Log user text (a prompt, an answer) at DEBUG only; never at INFO or above."""
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug("%s: %s", label, text)


def _redacted(value: Any) -> str:
    return f"<{len(value)} chars>" if isinstance(value, str | bytes | list | tuple) else "<redacted>"


def redact(record: logging.LogRecord) -> None:
    """Above DEBUG, replace text extras and ``sensitive`` arguments of ``record`` by their length."""
    if record.levelno <= logging.DEBUG:
        return
    for key in TEXT_FIELDS & record.__dict__.keys():
        record.__dict__[key] = _redacted(record.__dict__[key])
    if isinstance(record.args, tuple):
        record.args = tuple(_redacted(a) if isinstance(a, sensitive) else a for a in record.args)
    elif isinstance(record.args, dict):
        record.args = {k: _redacted(v) if isinstance(v, sensitive) else v for k, v in record.args.items()}


def extras(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a caller added with ``extra={...}``."""
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")}


class ContextFilter(logging.Filter):
    """Stamps ``request_id`` and ``tenant`` from the context onto each record (unless given)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = _request_id.get()
        if getattr(record, "tenant", None) is None:
            record.tenant = _tenant.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object a line."""

    def format(self, record: logging.LogRecord) -> str:
        redact(record)
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            "request_id": getattr(record, "request_id", None) or _request_id.get(),
            "tenant": getattr(record, "tenant", None) or _tenant.get(),
        }
        for key, value in extras(record).items():
            if key not in ("request_id", "tenant"):
                line[f"x_{key}" if key in _CORE else key] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return _json.dumps(line, default=str, ensure_ascii=False)


# Control characters (line breaks above all) as escapes: a caller-chosen tenant, request id or message
# must not start a line of its own in a text log (JSON lines escape them already).
_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F]}


def escape_controls(text: str) -> str:
    """``text`` with every control character written as ``\\xNN`` (one log line stays one line)."""
    return text.translate(_CONTROL)


class TextFormatter(logging.Formatter):
    """Human-readable lines with the same redaction and the request id/tenant when there is one; one
    record is one line (control characters in the request's fields and the message escaped; a
    traceback keeps its own lines after it)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s%(ctx)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        redact(record)
        rid, tenant = getattr(record, "request_id", None), getattr(record, "tenant", None)
        record.ctx = escape_controls(f" [{rid} {tenant or '-'}]") if rid else ""
        record.msg, record.args = escape_controls(record.getMessage()), None
        return super().format(record)


def setup_logging(level: str | int = "INFO", json: bool = True, stream: IO[str] | None = None
                  ) -> logging.Handler:
    """Route every logger to one handler on ``stream`` (stderr): JSON lines, or text if ``json=False``.
    Calling it again replaces the handler it installed before."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if json else TextFormatter())
    handler.addFilter(ContextFilter())
    setattr(handler, _HANDLER_MARK, True)
    root.addHandler(handler)
    root.setLevel(level if isinstance(level, int) else level.upper())
    return handler
