"""The endpoints over the generator (GeneratorCore): ``POST /v1/chat/completions``, ``GET /v1/models``,
``GET /health``; beside them the chat page ``GET /`` (page.py) and ``POST /v1/documents`` (ingest.py, to the
retriever). A thin adapter, as the gRPC servicer is: headers and body -> a generator call
(``GeneratorCore.answer``, or ``generate`` with ``"rag": false``) -> JSON or server-sent events.

    front = Frontend(generator, settings)       # settings: HttpSettings
    app = make_app(front)                    # served by services.http.server.HttpServer

Every request passes ``lookahead_rag.services.http.guard.RequestGuard`` first: the credential and the route's scope
(``lookahead_rag.services.common.auth.scopes``) are checked and the body limited before FastAPI reads it; the routes
only authorize the tenant, with the caller the guard put on ``request.state``. The schema pages
(/docs, /redoc, /openapi.json) are routed only with ``[http] docs = true``.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from lookahead_rag.services.common.auth.callers import Authenticator, Principal
from lookahead_rag.services.common.errors import (
    InvalidArgument,
    NotFound,
    ServiceError,
    Unauthenticated,
    Unavailable,
)
from lookahead_rag.services.common.telemetry.logs import REQUEST_ID_HEADER, request_context
from lookahead_rag.services.generator.domain import AnswerChunk, FinalInfo, GenerationParams
from lookahead_rag.services.generator.prepared import PromptFacts
from lookahead_rag.services.http import chat_choices, choices, completions, errors, ingest, page, translate
from lookahead_rag.services.http.guard import PRINCIPAL, RequestGuard
from lookahead_rag.services.http.schema import ChatCompletionRequest, bounded_chat_request
from lookahead_rag.services.http.settings import HttpSettings
from lookahead_rag.services.http.streaming import (
    DONE,
    SSE_MEDIA_TYPE,
    ClientDisconnected,
    ClosingStreamingResponse,
    json_reply,
    or_disconnect,
    padded_sse,
    safe_event_bytes,
    sse,
)

if TYPE_CHECKING:
    from lookahead_rag.services.generator.core import GeneratorCore

OWNER = "lookahead-rag"
Chunks = AsyncIterator[AnswerChunk]


class Frontend:
    """The endpoints' state: the generator, the settings, and whether new requests are welcome."""

    def __init__(self, generator: GeneratorCore, settings: HttpSettings, auth: Authenticator | None = None,
                 documents: ingest.Ingest | None = None) -> None:
        self.generator = generator
        self.settings = settings
        self.auth = auth if auth is not None and auth.required else None  # None: no credential asked
        self.ingest = documents  # POST /v1/documents: the retriever's Ingest (None: no retriever reachable)
        self.serving = False  # True while the server runs; False from the moment it starts stopping
        self.created = int(time.time())

    @property
    def model(self) -> str:
        return self.generator.model_name

    # ---- request headers and body ------------------------------------------------------------
    def principal_of(self, request: Request) -> Principal | None:
        """The caller the guard authenticated, when auth is required (None: auth off); 401 if none was."""
        if self.auth is None:
            return None
        principal = getattr(request.state, PRINCIPAL, None)
        if not isinstance(principal, Principal):  # the guard did not run: refuse rather than serve
            raise Unauthenticated("no credential was checked for this request")
        return principal

    def tenant_of(self, request: Request) -> str:
        """The tenant header, else the key's only tenant, else the default tenant; none is a 400, and
        one the key may not use a 403. More than one header is a 400 (a proxy may hash them all and the
        door would read one: docs/SECURITY.md), and so is none behind a tenant-routing proxy
        (``[generator] tenant_routing``)."""
        principal = self.principal_of(request)
        only = principal.only_tenant if principal is not None else None
        header = self.settings.tenant_header
        sent = request.headers.getlist(header)
        if len(sent) > 1:
            raise InvalidArgument(f"send one {header} header, not {len(sent)}")
        if not any(sent) and self.generator.settings.tenant_routing:
            raise InvalidArgument(f"tenant routing is on: send the {header} header naming your tenant")
        tenant = (sent[0] if sent else "") or only or self.settings.default_tenant
        if not tenant:
            raise InvalidArgument(f"no tenant: send the {header} header")
        if principal is not None:
            Authenticator.authorize(principal, tenant)
        return tenant

    def deadline_of(self, request: Request) -> float | None:
        """The request's deadline (time.monotonic()) from the timeout header or the settings, or None."""
        header = self.settings.timeout_header
        raw = request.headers.get(header)
        if raw is None:
            seconds = self.settings.request_timeout_s
            return time.monotonic() + seconds if seconds else None
        try:
            seconds = float(raw)
        except ValueError:
            seconds = math.nan
        if not (math.isfinite(seconds) and seconds > 0):
            raise InvalidArgument(f"{header} must be a positive number of seconds, got {raw!r}")
        return time.monotonic() + seconds

    def check_model(self, name: str) -> None:
        if name and name != self.model:
            raise NotFound(f"model {name!r} is not served here; GET /v1/models lists {self.model!r}")

    def safe_stream(self, tenant: str, asked: bool) -> bool:
        """Whether ``tenant``'s answer takes the side-channel-safe stream: ``asked`` for, or the tenant's setting."""
        return self.generator.is_safe(tenant, GenerationParams(safe_stream=asked))

    def admitted(self, request: Request, model: str) -> tuple[str, float | None]:
        """The caller's tenant and deadline, once the server is serving and ``model`` is ours (raises otherwise)."""
        if not self.serving:
            raise Unavailable("the server is stopping")
        tenant, deadline = self.tenant_of(request), self.deadline_of(request)
        self.check_model(model)
        return tenant, deadline

    def chunks(self, body: ChatCompletionRequest, tenant: str, deadline: float | None, rid: str,
               on_prompt: Callable[[PromptFacts], None]) -> Chunks:
        """The generator's stream; ``on_prompt`` hears what a RAG answer's prompt came to before its first token."""
        ext = {"mode": body.mode, "logprobs": bool(body.logprobs), "top_logprobs": body.top_logprobs}  # choices.py
        if body.rag:
            query = translate.answer_query(body, tenant)
            query = replace(query, params=choices.extended(query.params, **ext))
            return self.generator.answer(query, deadline, rid, on_prompt=on_prompt)
        generate = translate.generate_query(body, tenant)
        extended = replace(generate, params=choices.extended(generate.params, **ext))
        return self.generator.generate(extended, deadline, rid)

    # ---- the endpoint ------------------------------------------------------------------------
    async def chat(self, body: ChatCompletionRequest, request: Request) -> Response:
        headers: dict[str, str] = {}
        try:
            tenant, deadline = self.admitted(request, body.model)
            translate.check_supported(body)
            with request_context(request.headers.get(REQUEST_ID_HEADER), tenant) as rid:
                headers[REQUEST_ID_HEADER] = rid
                if chat_choices.wants_choices(body):  # n > 1 or logprobs: chat_choices.py
                    return await chat_choices.chat(self, body, request, tenant, deadline, rid, headers)
                reply = translate.Reply.of(rid, self.model, body)
                facts: list[PromptFacts] = []  # told before the first token (a RAG answer, not a safe stream)
                chunks, when = self.chunks(body, tenant, deadline, rid, facts.append), choices.loop_deadline(deadline)
                if not body.stream:
                    final = (await or_disconnect(request, choices.collect(chunks, when))).final
                    choices.check_final(final, deadline)
                    headers.update(translate.prompt_headers(facts[-1] if facts else None))
                    return await json_reply(lambda: translate.completion(reply, final),
                                            self.generator.settings.stream_send_timeout_s, headers)
                # errors before the first chunk keep their status
                first = await or_disconnect(request, choices.next_chunk(chunks, when))
                headers.update(translate.prompt_headers(facts[-1] if facts else None))
                events = _events(translate.StreamTranslator(reply), first, chunks, when, deadline, (rid, tenant))
                return ClosingStreamingResponse(events, self.generator.settings.stream_send_timeout_s,
                                                media_type=SSE_MEDIA_TYPE,
                                                headers={**headers, "cache-control": "no-cache"})
        except ClientDisconnected:
            return Response(status_code=errors.CLIENT_CLOSED)
        except Exception as exc:
            return errors.error_response(exc, headers, ChatCompletionRequest.model_fields)

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [self.model_card()]}

    def model_card(self) -> dict[str, Any]:
        return {"id": self.model, "object": "model", "created": self.created, "owned_by": OWNER}


# ---- streaming ---------------------------------------------------------------------------------------
async def _events(stream: translate.StreamTranslator, first: AnswerChunk | None, chunks: Chunks,
                  when: float | None, deadline: float | None, context: tuple[str, str]) -> AsyncIterator[bytes]:
    """The SSE body: ``data: {chunk}`` per step, then the finish chunk and ``data: [DONE]``. Once the
    status line is out, an error comes as one ``data: {"error": ...}`` event (what OpenAI sends)."""
    with request_context(*context):
        size = 0  # a safe stream's delta events: all this size (set by the first)
        try:
            chunk = first
            while chunk is not None:
                if isinstance(chunk, FinalInfo):
                    choices.check_final(chunk, deadline)
                    for obj in stream.final(chunk):
                        yield sse(obj)
                    yield DONE
                    return
                if chunk.safe_bytes:  # a safe stream: every delta event has the same size
                    size = size or safe_event_bytes(stream.largest_delta(), chunk.safe_bytes)
                for obj in stream.delta(chunk):
                    yield padded_sse(obj, size) if chunk.safe_bytes else sse(obj)
                chunk = await choices.next_chunk(chunks, when)
            raise RuntimeError("the answer ended without its final message")
        except Exception as exc:
            yield sse(errors.http_error(exc)[1])
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]


def make_app(front: Frontend) -> FastAPI:
    """The FastAPI application over ``front`` (errors in OpenAI's shape, see services.http.errors),
    behind the request guard; the schema pages only with ``[http] docs = true``."""
    schema = {} if front.settings.docs else {"openapi_url": None}  # None: no /openapi.json, /docs, /redoc
    app = FastAPI(title="lookahead-rag", summary="OpenAI-compatible chat completions over RAG", **schema)
    errors.install(app)
    app.add_middleware(RequestGuard, front=front, router=app.router)

    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await front.chat(body, request)

    # the body's type with the configured [limits] max_messages (FastAPI validates by this annotation)
    chat_completions.__annotations__["body"] = bounded_chat_request(front.generator.limits.max_messages)
    app.post("/v1/chat/completions", response_model=None)(chat_completions)

    @app.post("/v1/completions", response_model=None)
    async def legacy_completions(body: completions.CompletionRequest, request: Request) -> Response:
        return await completions.complete(front, body, request)

    @app.get("/v1/models", response_model=None)
    async def list_models() -> Response:  # the guard checked the caller
        return JSONResponse(front.models())

    @app.get("/v1/models/{model:path}", response_model=None)
    async def get_model(model: str) -> Response:
        try:
            front.check_model(model)
        except ServiceError as exc:
            return errors.error_response(exc)
        return JSONResponse(front.model_card())

    @app.post("/v1/documents", response_model=None)
    async def documents(body: ingest.IngestRequest, request: Request) -> Response:
        return await ingest.ingest(front, body, request)

    @app.get("/", response_model=None, include_in_schema=False)
    async def chat_page() -> Response:
        return page.response()

    @app.get("/health", response_model=None)
    async def health() -> JSONResponse:
        if front.serving:
            return JSONResponse({"status": "serving"})
        return JSONResponse({"status": "not serving"}, status_code=HTTPStatus.SERVICE_UNAVAILABLE)

    return app
