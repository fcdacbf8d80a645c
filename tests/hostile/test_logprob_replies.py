"""Issue 32 item 4: n x top_logprobs x max_tokens. 16 choices x 512 tokens x 20 alternatives were built as
objects on the event loop, and a whole (non-streamed) reply to a client that did not read was held for
ever, outside every quota. Now the product is bounded (``[limits] max_logprob_entries``, a 400 past it),
whole replies are built on a worker thread, and their sending gives up past ``[generator]
stream_send_timeout_s`` as a stream's does.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import httpx2
import pytest

from lookahead_rag.services.generator.settings import GeneratorSettings
from lookahead_rag.services.http import chat_choices
from tests.hostile.test_http_first import TENANT, app_of, body
from tests.http.helpers import TENANT_HEADER, ask, base_url, model
from tests.pipeline.helpers import QUESTION, RunningPipeline, module_loop, module_pipeline

pytestmark = module_loop

SEND_TIMEOUT_S = 1.0  # [generator] stream_send_timeout_s here
REFUSED_WITHIN_S = 30.0  # the refusal comes before any decoding (the old code decoded 16 x 512 tokens)
STALL_WAIT_S = 60.0  # how long the server may take to give a stalled reply up (old code: never)
COUNTING = "1, 2, 3, 4, 5, 6, 7,"  # a prompt
TOP = 20

pipe = module_pipeline(generator={"stream_send_timeout_s": SEND_TIMEOUT_S})

HUGE = {  # path -> a body asking for 16 x 512 x 21 logprob entries
    "/v1/chat/completions": {"messages": ask(QUESTION), "n": 16, "temperature": 1.0, "logprobs": True,
                             "top_logprobs": TOP, "max_tokens": 512},
    "/v1/completions": {"prompt": COUNTING, "n": 16, "temperature": 1.0, "logprobs": TOP, "max_tokens": 512},
}


@pytest.mark.parametrize("path", sorted(HUGE))
async def test_too_many_logprob_entries_are_refused_at_once(pipe: RunningPipeline, path: str) -> None:
    tenant = pipe.new_tenant("logprob-flood")
    async with httpx2.AsyncClient(base_url=base_url(pipe), timeout=REFUSED_WITHIN_S) as http:
        response = await http.post(path, json={"model": model(pipe), **HUGE[path]}, headers={TENANT_HEADER: tenant})
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == "logprobs" and "\n" not in error["message"], error


async def test_a_whole_reply_is_built_off_the_event_loop(pipe: RunningPipeline,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[threading.Thread] = []
    real = chat_choices.chat_logprobs

    def spy(*args: Any) -> Any:
        threads.append(threading.current_thread())
        return real(*args)

    monkeypatch.setattr(chat_choices, "chat_logprobs", spy)
    tenant = pipe.new_tenant("logprob-thread")
    body = {"model": model(pipe), "messages": ask(QUESTION), "n": 2, "temperature": 1.0, "logprobs": True,
            "top_logprobs": 2, "max_tokens": 4}
    async with httpx2.AsyncClient(base_url=base_url(pipe), timeout=STALL_WAIT_S) as http:
        response = await http.post("/v1/chat/completions", json=body, headers={TENANT_HEADER: tenant})
    assert response.status_code == 200 and len(response.json()["choices"]) == 2
    assert len(threads) == 2 and threading.main_thread() not in threads


async def test_a_whole_reply_to_a_client_that_stops_reading_is_given_up(tmp_path: Path) -> None:
    app, engine, tokens = app_of(tmp_path)
    engine.settings = GeneratorSettings(stream_send_timeout_s=SEND_TIMEOUT_S)
    content = json.dumps(body()).encode()
    headers = [(b"authorization", f"Bearer {tokens['web']}".encode()), (b"x-tenant", TENANT.encode()),
               (b"content-type", b"application/json"), (b"content-length", str(len(content)).encode())]
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions", "query_string": b"",
             "root_path": "", "state": {}, "headers": headers, "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    received = asyncio.Queue[dict[str, Any]]()
    received.put_nowait({"type": "http.request", "body": content, "more_body": False})
    started: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:  # the client takes the head, then reads nothing
        if message["type"] == "http.response.body":
            await asyncio.Event().wait()
        started.append(message)

    await asyncio.wait_for(app(scope, received.get, send), STALL_WAIT_S)  # the old code: never returns
    assert started and started[0]["status"] == 200 and engine.calls == 1
