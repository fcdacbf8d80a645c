"""Issue 22 item 7: the HTTP endpoint checks the caller before it reads a byte of the body, limits the
body (chunked ones too), and serves its schema only when asked to.

The endpoint runs on real uvicorn (``HttpServer``) over a stand-in generator: what is tested happens
before any generator call, and the one answered request needs no model. The ASGI-level tests count the
body messages the application pulls, which no client on a socket can see.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
import pytest_asyncio

from lookahead_rag.services.common.auth.callers import Authenticator
from lookahead_rag.services.common.auth.keys import KeyFile
from lookahead_rag.services.common.auth.settings import AuthSettings
from lookahead_rag.services.common.rules.limits import RequestLimits
from lookahead_rag.services.generator.domain import FinalInfo, GenerationStats, TextDelta
from lookahead_rag.services.generator.settings import GeneratorSettings
from lookahead_rag.services.http.routes import Frontend, make_app
from lookahead_rag.services.http.server import HttpServer
from lookahead_rag.services.http.settings import HttpSettings

module_loop = pytest.mark.asyncio(loop_scope="module")

TENANT, OTHER = "acme", "beta"
LIMIT = 4096  # [http] max_body_bytes here
PIECE = 256  # a chunked body's piece
TIMEOUT_S = 60.0
ANSWER = "hello"
SCHEMA_PATHS = ("/openapi.json", "/docs", "/redoc")


class StandInGenerator:
    """What the routes call on the generator: one short answer, and a count of the calls."""

    model_name = "stand-in"
    limits = RequestLimits()  # the routes read [limits] max_messages
    settings = GeneratorSettings()  # and [generator] stream_send_timeout_s

    @staticmethod
    def is_safe(tenant: str, params: Any) -> bool:  # no safe-stream tenant here
        return False

    def __init__(self) -> None:
        self.calls = 0

    async def answer(self, query: Any, deadline: float | None = None, rid: str = "",
                     on_prompt: Any = None) -> AsyncIterator[Any]:
        self.calls += 1
        yield TextDelta(text=ANSWER, token_ids=(1,))
        yield FinalInfo(request_id=rid, stats=GenerationStats(new_tokens=1, finish_reason="eos"),
                        answer_text=ANSWER, output_ids=(1,))

    generate = answer


@dataclass
class Endpoint:
    server: HttpServer
    generator: StandInGenerator
    auth: Authenticator
    tokens: dict[str, str]  # who -> key

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    def bearer(self, who: str) -> dict[str, str]:
        return {"authorization": f"Bearer {self.tokens[who]}"}


def keyed_auth(root: Path) -> tuple[Authenticator, dict[str, str]]:
    keys = KeyFile(root / "keys.json")
    tokens = {"web": keys.add([TENANT], "web")[1],  # answer: what a frontend gets
              "sync": keys.add([TENANT], "sync", ["write"])[1]}  # write only
    return Authenticator(AuthSettings(mode="required", keys_file=keys.path)), tokens


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def endpoint(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Endpoint]:
    auth, tokens = keyed_auth(tmp_path_factory.mktemp("http-first"))
    engine = StandInGenerator()
    server = await HttpServer.start(engine, HttpSettings(port=0, max_body_bytes=LIMIT), port=0,  # type: ignore[arg-type]
                                    auth=auth)
    try:
        yield Endpoint(server, engine, auth, tokens)
    finally:
        await server.stop()


def body(content: str = "What is JSON?") -> dict[str, Any]:
    return {"model": "", "messages": [{"role": "user", "content": content}], "max_tokens": 4}


def assert_openai_error(response: httpx2.Response, status: int) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and "\n" not in error["message"], error


# ---- over the wire ----------------------------------------------------------------------------------

@module_loop
async def test_no_credential_is_401_before_the_body_is_parsed(endpoint: Endpoint) -> None:
    async with httpx2.AsyncClient(base_url=endpoint.url, timeout=TIMEOUT_S) as http:
        # a body FastAPI would refuse as malformed (400) if it were read first
        assert_openai_error(await http.post("/v1/chat/completions", content=b"{not json",
                                            headers={"content-type": "application/json"}), HTTPStatus.UNAUTHORIZED)
        # a body past the limit: still the credential first
        big = {"content-type": "application/json", "x-tenant": TENANT}
        assert_openai_error(await http.post("/v1/chat/completions", content=b"x" * (2 * LIMIT), headers=big),
                            HTTPStatus.UNAUTHORIZED)
        # a key without the route's scope (write only): 403, the malformed body never parsed
        sync = {**endpoint.bearer("sync"), "content-type": "application/json"}
        assert_openai_error(await http.post("/v1/chat/completions", content=b"{not json", headers=sync),
                            HTTPStatus.FORBIDDEN)
    assert endpoint.generator.calls == 0


@module_loop
async def test_a_body_past_the_limit_is_413_in_the_openai_shape(endpoint: Endpoint) -> None:
    web = endpoint.bearer("web")
    async with httpx2.AsyncClient(base_url=endpoint.url, timeout=TIMEOUT_S) as http:
        # a valid request made too big: Content-Length says so
        padded = body("q" * (2 * LIMIT))
        assert_openai_error(await http.post("/v1/chat/completions", json=padded, headers=web),
                            HTTPStatus.REQUEST_ENTITY_TOO_LARGE)

        async def pieces() -> AsyncIterator[bytes]:  # chunked: no Content-Length
            for _ in range(2 * LIMIT // PIECE):
                yield b" " * PIECE

        response = await http.post("/v1/chat/completions", content=pieces(),
                                   headers={**web, "content-type": "application/json"})
        assert "content-length" not in response.request.headers
        assert_openai_error(response, HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
        assert "max_body_bytes" in response.json()["error"]["message"]
    assert endpoint.generator.calls == 0


@module_loop
async def test_within_the_limit_the_right_key_is_answered_and_the_tenant_still_checked(endpoint: Endpoint) -> None:
    client = openai.AsyncOpenAI(base_url=f"{endpoint.url}/v1", api_key=endpoint.tokens["web"], max_retries=0,
                                timeout=TIMEOUT_S)
    async with client:
        got = await client.chat.completions.create(model="", messages=body()["messages"], max_tokens=4)
        assert got.choices[0].message.content == ANSWER  # the key's only tenant
        with pytest.raises(openai.PermissionDeniedError):  # the guard's caller, the route's tenant check
            await client.chat.completions.create(model="", messages=body()["messages"], max_tokens=4,
                                                 extra_headers={"x-tenant": OTHER})
        assert [m.id async for m in client.models.list()] == [StandInGenerator.model_name]


@module_loop
async def test_the_schema_is_not_served_by_default(endpoint: Endpoint) -> None:
    async with httpx2.AsyncClient(base_url=endpoint.url, timeout=TIMEOUT_S) as http:
        for path in SCHEMA_PATHS:
            assert (await http.get(path)).status_code == HTTPStatus.NOT_FOUND, path
            assert (await http.get(path, headers=endpoint.bearer("web"))).status_code == HTTPStatus.NOT_FOUND, path
        assert (await http.get("/health")).status_code == HTTPStatus.OK  # open, as before


# ---- at the ASGI interface: how much of the body the application pulls -------------------------------

@dataclass
class Exchange:
    status: int
    body: bytes
    pulled: int  # body messages taken from the server


async def asgi_post(app: Any, headers: dict[str, str], pieces: Sequence[bytes], path: str = "/v1/chat/completions",
                    method: str = "POST") -> Exchange:
    """One request straight into ``app``: its body in ``pieces`` (more_body on all but the last)."""
    pulled = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        if pulled < len(pieces):
            pulled += 1
            return {"type": "http.request", "body": pieces[pulled - 1], "more_body": pulled < len(pieces)}
        await asyncio.Event().wait()  # the client stays: no disconnect
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "state": {},
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    await asyncio.wait_for(app(scope, receive, send), TIMEOUT_S)
    start = next(m for m in sent if m["type"] == "http.response.start")
    return Exchange(start["status"], b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"),
                    pulled)


def app_of(root: Path, **http: Any) -> tuple[Any, StandInGenerator, dict[str, str]]:
    auth, tokens = keyed_auth(root)
    engine = StandInGenerator()
    front = Frontend(engine, HttpSettings(max_body_bytes=LIMIT, **http), auth)  # type: ignore[arg-type]
    front.serving = True
    return make_app(front), engine, tokens


@module_loop
async def test_a_refused_caller_is_answered_without_pulling_the_body(tmp_path: Path) -> None:
    app, engine, tokens = app_of(tmp_path)
    pieces = [b"{"] + [b" " * PIECE] * 8
    json_type = {"content-type": "application/json"}
    for headers, status in (
        (json_type, HTTPStatus.UNAUTHORIZED),
        ({**json_type, "authorization": "Bearer lar_not-a-key"}, HTTPStatus.UNAUTHORIZED),
        ({**json_type, "authorization": f"Bearer {tokens['sync']}"}, HTTPStatus.FORBIDDEN),
    ):
        got = await asgi_post(app, headers, pieces)
        assert (got.status, got.pulled) == (status, 0), (headers, got)
    assert engine.calls == 0


@module_loop
async def test_a_chunked_body_is_cut_at_the_limit(tmp_path: Path) -> None:
    app, engine, tokens = app_of(tmp_path)
    pieces = [b" " * PIECE] * (8 * LIMIT // PIECE)  # eight times the limit, no Content-Length
    web = {"authorization": f"Bearer {tokens['web']}", "content-type": "application/json"}
    got = await asgi_post(app, web, pieces)
    assert got.status == HTTPStatus.REQUEST_ENTITY_TOO_LARGE, got
    assert got.pulled == LIMIT // PIECE + 1  # the piece that passed the limit, and not one more
    # and a declared length past the limit: refused before any of it is pulled
    declared = {**web, "content-length": str(LIMIT + 1)}
    got = await asgi_post(app, declared, [b" " * (LIMIT + 1)])
    assert (got.status, got.pulled) == (HTTPStatus.REQUEST_ENTITY_TOO_LARGE, 0)
    assert engine.calls == 0


@module_loop
async def test_docs_true_serves_the_schema(tmp_path: Path) -> None:
    app, _, _ = app_of(tmp_path, docs=True)
    for path in SCHEMA_PATHS:
        got = await asgi_post(app, {}, [b""], path=path, method="GET")
        assert got.status == HTTPStatus.OK, (path, got)  # open: a browser fetches it without a key
    schema = await asgi_post(app, {}, [b""], path="/openapi.json", method="GET")
    assert b"/v1/chat/completions" in schema.body
