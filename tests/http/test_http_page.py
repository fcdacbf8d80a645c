"""The chat page at ``/`` and the ``POST /v1/documents`` route it uploads to (issue 47), on a pipeline that
requires keys: the page is open (it is static and holds no tenant data), self-contained (no other origin,
under 100 KB, a Content-Security-Policy that runs only its own inline script), and the ingest route is the
retriever's Ingest behind the ``write`` scope: what it takes in is what the next answer is grounded on, and
its refusals have the endpoint's one-line shape. The finish chunk carries the ``decoding`` stats the page
shows. (The page in a real browser: tests/browser/test_chat_page.py.)
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import httpx2
import pytest
import pytest_asyncio

from lookahead_rag.services.common.auth.keys import KeyFile
from lookahead_rag.services.common.rules.limits import RequestLimits
from lookahead_rag.services.generator.settings import GeneratorSettings
from lookahead_rag.services.http.page import page_text, policy
from lookahead_rag.services.http.routes import Frontend, make_app
from lookahead_rag.services.http.settings import HttpSettings
from tests.http.helpers import raw_client
from tests.pipeline.helpers import RunningPipeline, module_loop, running_pipeline, unique_tenant

pytestmark = module_loop

PAGE_LIMIT_BYTES = 100_000  # issue 47: the page, all of it
MAX_NEW = 8
DOC = {"id": "okapi.md", "title": "The okapi",
       "text": "The okapi is a giraffid mammal native to the Congo. It has striped legs like a zebra and eats "
               "leaves with its long blue tongue.", "source": "okapi.md"}


@dataclass
class Keys:
    p: RunningPipeline
    tenant: str
    writer: str  # answer + write, for ``tenant``
    reader: str  # answer only, for ``tenant``


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def keys(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Keys]:
    root = tmp_path_factory.mktemp("page")
    file = KeyFile(root / "keys.json")
    tenant = unique_tenant("page")
    _, service_key = file.add(["*"], "services")  # the generator's clients reach the other two with it
    writer = file.add([tenant], "page", ["answer", "write"])[1]
    reader = file.add([tenant], "web")[1]
    auth = {"mode": "required", "keys_file": file.path, "service_key": service_key}
    async with running_pipeline(root, auth=auth, limits={"default_m": 0}) as p:
        yield Keys(p, tenant, writer, reader)


def bearer(key: str, tenant: str | None = None) -> dict[str, str]:
    return {"authorization": f"Bearer {key}", **({"x-tenant": tenant} if tenant else {})}


def error_of(response: httpx2.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"] and "\n" not in error["message"], error
    return error


async def test_the_page_is_open_self_contained_and_small(keys: Keys) -> None:
    async with raw_client(keys.p) as http:
        response = await http.get("/")  # no key: the page itself holds nothing of a tenant's
    assert response.status_code == HTTPStatus.OK, response.text
    assert response.headers["content-type"].startswith("text/html")
    assert len(response.content) < PAGE_LIMIT_BYTES
    html = response.text
    assert "://" not in html  # nothing from another origin: no CDN, works offline
    assert not re.search(r"<(script|link|img|iframe)[^>]*\s(src|href)=", html)  # nor a file of this one
    csp = response.headers["content-security-policy"]
    assert "unsafe-inline" not in csp and "connect-src 'self'" in csp and "default-src 'none'" in csp
    assert csp == policy(page_text()) and "'sha256-" in csp  # the page's own inline script, by its hash
    assert response.headers["x-content-type-options"] == "nosniff"
    for control in re.findall(r"<(?:input|textarea)[^>]*\sid=\"([^\"]+)\"", html):  # every field labelled
        assert f'<label for="{control}"' in html, control
    assert "localStorage" in html and "x-tenant" in html and "Bearer " in html  # the key: in headers, kept locally


async def test_uploaded_documents_ground_the_next_answer(keys: Keys) -> None:
    async with raw_client(keys.p) as http:
        reply = await http.post("/v1/documents", json={"documents": [DOC]}, headers=bearer(keys.writer, keys.tenant))
        assert reply.status_code == HTTPStatus.OK, reply.text
        counts = reply.json()
        assert counts["object"] == "ingest" and counts["documents"] == 1 and counts["unchanged"] == 0
        assert counts["chunks"] >= 1 and counts["total_chunks"] >= counts["chunks"]
        again = (await http.post("/v1/documents", json={"documents": [DOC]},
                                 headers=bearer(keys.writer, keys.tenant))).json()
        assert again["documents"] == 0 and again["unchanged"] == 1 and again["chunks"] == 0  # the same text
        chat = {"messages": [{"role": "user", "content": "What colour is the okapi's tongue?"}], "stream": True,
                "max_tokens": MAX_NEW}
        body = (await http.post("/v1/chat/completions", json=chat, headers=bearer(keys.reader, keys.tenant))).text
    events = [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: {")]
    (finish,) = [e for e in events if e["choices"] and e["choices"][0]["finish_reason"]]
    assert [d["doc_id"] for d in finish["documents"]] == [DOC["id"]]  # the tenant's one document
    assert finish["documents"][0]["title"] == DOC["title"] and finish["documents"][0]["source"] == DOC["source"]
    decoding = finish["decoding"]  # what the page's line shows: tokens, tokens/s, tokens/step, lossless
    assert decoding["new_tokens"] == MAX_NEW and decoding["lossless"] is True
    assert decoding["forward_steps"] >= 1 and decoding["mean_accepted_per_step"] >= 1
    assert decoding["wall_s"] >= decoding["time_to_first_token_s"] > 0


async def test_ingest_needs_the_write_scope_and_the_tenant(keys: Keys) -> None:
    async with raw_client(keys.p) as http:
        docs = {"documents": [DOC]}
        no_key = await http.post("/v1/documents", json=docs, headers={"x-tenant": keys.tenant})
        assert error_of(no_key, HTTPStatus.UNAUTHORIZED)["type"] == "authentication_error"
        bad_key = await http.post("/v1/documents", json=docs, headers=bearer("lar_not-a-key", keys.tenant))
        error_of(bad_key, HTTPStatus.UNAUTHORIZED)
        reader = await http.post("/v1/documents", json=docs, headers=bearer(keys.reader, keys.tenant))
        assert "write" in error_of(reader, HTTPStatus.FORBIDDEN)["message"]
        other = await http.post("/v1/documents", json=docs, headers=bearer(keys.writer, "someone-else"))
        assert error_of(other, HTTPStatus.FORBIDDEN)["type"] == "permission_error"


async def test_ingest_refusals_are_one_line_400s(keys: Keys) -> None:
    async with raw_client(keys.p) as http:
        headers = bearer(keys.writer, keys.tenant)
        empty_text = await http.post("/v1/documents", json={"documents": [{**DOC, "text": "  "}]}, headers=headers)
        assert "empty text" in error_of(empty_text, HTTPStatus.BAD_REQUEST)["message"]  # the retriever's own check
        twice = await http.post("/v1/documents", json={"documents": [DOC, DOC]}, headers=headers)
        assert "twice" in error_of(twice, HTTPStatus.BAD_REQUEST)["message"]
        for body in ({"documents": []}, {"documents": [{"id": "x"}]}, {"docs": [DOC]}):
            error = error_of(await http.post("/v1/documents", json=body, headers=headers), HTTPStatus.BAD_REQUEST)
            assert error["type"] == "invalid_request_error", body


class _NoRetriever:
    """A generator stand-in: the door needs only its name, limits and settings before it would call it."""

    model_name = "stand-in"
    limits = RequestLimits()
    settings = GeneratorSettings()


async def test_ingest_without_a_retriever_is_a_503() -> None:
    front = Frontend(_NoRetriever(), HttpSettings(default_tenant="public"))  # type: ignore[arg-type]
    front.serving = True
    transport = httpx2.ASGITransport(app=make_app(front))
    async with httpx2.AsyncClient(transport=transport, base_url="http://door") as http:
        reply = await http.post("/v1/documents", json={"documents": [DOC]})
        assert "lookahead-rag ingest" in error_of(reply, HTTPStatus.SERVICE_UNAVAILABLE)["message"]
        assert (await http.get("/")).status_code == HTTPStatus.OK
