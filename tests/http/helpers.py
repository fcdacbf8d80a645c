"""Clients for the OpenAI-compatible endpoint of a test pipeline (tests/pipeline/helpers.py starts it
on port 0 beside the gRPC servers: ``pipe.pipeline.http_port``).

    async with openai_client(pipe, tenant) as client:      # the real ``openai`` client, no retries
        got = await client.chat.completions.create(model=model(pipe), messages=ask(QUESTION), max_tokens=8)
    async with raw_client(pipe) as http:                    # plain HTTP, for what the client cannot send
        response = await http.post("/v1/chat/completions", content=b"{")
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

import httpx2
import openai
import pytest

from tests.pipeline.helpers import CALL_TIMEOUT_S, RunningPipeline

TENANT_HEADER = "x-tenant"  # [http] tenant_header's default


def base_url(p: RunningPipeline) -> str:
    assert p.pipeline.http_port is not None, "the pipeline serves no HTTP endpoint"
    return f"http://127.0.0.1:{p.pipeline.http_port}"


def openai_client(p: RunningPipeline, tenant: str | None = None, **headers: str) -> openai.AsyncOpenAI:
    """The openai client on the pipeline's endpoint; ``tenant`` goes in the tenant header. No
    retries: a 429 or 503 must reach the test as it came."""
    default = {**({TENANT_HEADER: tenant} if tenant is not None else {}), **headers}
    return openai.AsyncOpenAI(base_url=f"{base_url(p)}/v1", api_key="unused", default_headers=default,
                              max_retries=0, timeout=CALL_TIMEOUT_S)


def raw_client(p: RunningPipeline) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(base_url=base_url(p), timeout=CALL_TIMEOUT_S)


def model(p: RunningPipeline) -> str:
    """The served model's name (what /v1/models lists)."""
    return str(p.generator.model_name)


def ask(question: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": question}]


def extra(obj: Any, name: str) -> Any:
    """An extension field of a parsed openai object (``documents``, ``token_ids``, ...)."""
    extras = obj.model_extra or {}
    assert name in extras, f"{name} missing from {sorted(extras)}"
    return extras[name]


async def bad_request_body(call: Awaitable[Any]) -> dict[str, Any]:
    """The error body of a call the endpoint refuses with a 400 (its message one line)."""
    with pytest.raises(openai.BadRequestError) as caught:
        await call
    body = caught.value.body
    assert isinstance(body, dict) and "\n" not in body["message"], body
    return body
