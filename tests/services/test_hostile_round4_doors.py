"""Issue 51, findings 7 and 9: the front doors no longer serve strangers when auth is off.

7. ``check_bind`` returned as soon as server TLS was on and never looked at ``[auth]`` (default "off"):
   ``serve`` on 0.0.0.0 with certificates and no auth let anyone on the network ingest, delete and
   read every tenant. Now a non-loopback bind with auth off is refused in one line, TLS or not, unless
   ``[auth] allow_unauthenticated = true``, which logs a WARNING.
9. ``demo --serve`` binds loopback with auth off, and any Host header was served, so a DNS-rebinding
   page could read answers and write documents. Now such an endpoint serves only a Host naming
   loopback or ``[http] allowed_hosts`` (421 otherwise); and a request body without
   ``Content-Type: application/json`` is refused by our guard (415), whatever FastAPI is installed.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from http import HTTPStatus
from pathlib import Path

import httpx2
import pytest
import pytest_asyncio

from lookahead_rag.services.common.auth.settings import AuthSettings
from lookahead_rag.services.common.auth.tls import TlsSettings, UnauthenticatedBindError, check_bind
from lookahead_rag.services.http.server import HttpServer
from lookahead_rag.services.http.settings import HttpSettings
from tests.hostile.test_http_first import StandInGenerator, assert_openai_error, body, keyed_auth
from tests.services.tls_helpers import LOOPBACK_V4, Pki, server_tls

module_loop = pytest.mark.asyncio(loop_scope="module")
TENANT = "demo"  # the endpoint's default tenant, as demo --serve's
CONFIGURED = "my-box.lan"  # a name in [http] allowed_hosts
FOREIGN = "rebind.evil.example"  # what a rebinding page's requests carry
TIMEOUT_S = 30.0
PUBLIC = "0.0.0.0"


def keyed(root: Path) -> AuthSettings:
    return AuthSettings(mode="required", keys_file=root / "keys.json")


# --- 7: auth off beyond loopback -------------------------------------------------------------------


@pytest.mark.usefixtures("no_lar_env")
@pytest.mark.parametrize("tls_on", [True, False])
def test_auth_off_beyond_loopback_is_refused_with_tls_or_without(tls_on: bool, pki: Pki) -> None:
    # TLS hides the traffic, not who sends it: with mode = "off" the bind is refused either way
    tls = server_tls(pki) if tls_on else TlsSettings(allow_insecure=True)
    with pytest.raises(UnauthenticatedBindError) as err:
        check_bind({"retriever": LOOPBACK_V4, "generator": PUBLIC, "http": PUBLIC}, tls, AuthSettings())
    message = str(err.value)
    assert "\n" not in message and message.startswith("[auth] refusing to serve generator on 0.0.0.0")
    assert "retriever" not in message  # loopback is fine
    assert "LAR_AUTH_MODE" in message and "allow_unauthenticated" in message


@pytest.mark.usefixtures("no_lar_env")
def test_allow_unauthenticated_lets_it_through_with_a_warning(pki: Pki, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        check_bind({"http": PUBLIC}, server_tls(pki), AuthSettings(allow_unauthenticated=True))
    (record,) = caplog.records
    assert record.levelno == logging.WARNING and "http on 0.0.0.0" in record.getMessage()
    assert "WITHOUT AUTHENTICATION" in record.getMessage()


@pytest.mark.usefixtures("no_lar_env")
def test_auth_required_and_tls_beyond_loopback_pass_silently(pki: Pki, tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        check_bind({"generator": PUBLIC}, server_tls(pki), keyed(tmp_path))
        check_bind({"generator": LOOPBACK_V4}, TlsSettings(), AuthSettings())  # loopback: neither needed
    assert not caplog.records


@pytest.mark.usefixtures("no_lar_env")
def test_serve_refuses_a_public_host_with_tls_and_auth_off(pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    # `serve draftcache` on 0.0.0.0 with certificates and no [auth]: exit 2 with one line, nothing served
    # (were the check missing, the stubbed signal wait would return at once and serve would exit 0)
    from lookahead_rag.services import serve

    async def no_wait() -> None:
        return None

    monkeypatch.setattr(serve, "_wait_for_signal", no_wait)
    monkeypatch.setattr(serve, "setup_logging", lambda *a, **k: None)
    monkeypatch.setenv("LAR_DRAFTCACHE_HOST", PUBLIC)
    monkeypatch.setenv("LAR_DRAFTCACHE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("LAR_TLS_CERT_FILE", str(pki.server_cert))
    monkeypatch.setenv("LAR_TLS_KEY_FILE", str(pki.server_key))
    assert serve.main(["draftcache", "--port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lookahead-rag serve: [auth] refusing to serve draftcache on 0.0.0.0") and "\n" not in err


# --- 9: DNS rebinding and bodies that are not JSON -------------------------------------------------


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def loopback() -> AsyncIterator[tuple[HttpServer, StandInGenerator]]:
    """The endpoint as demo --serve runs it: loopback, auth off, a default tenant."""
    engine = StandInGenerator()
    settings = HttpSettings(host=LOOPBACK_V4, port=0, default_tenant=TENANT, allowed_hosts=[CONFIGURED])
    server = await HttpServer.start(engine, settings, port=0)  # type: ignore[arg-type]
    try:
        yield server, engine
    finally:
        await server.stop()


def url(server: HttpServer) -> str:
    return f"http://{LOOPBACK_V4}:{server.port}"


@module_loop
async def test_a_foreign_host_is_refused_on_a_loopback_auth_off_endpoint(
        loopback: tuple[HttpServer, StandInGenerator]) -> None:
    server, engine = loopback
    async with httpx2.AsyncClient(base_url=url(server), timeout=TIMEOUT_S) as http:
        calls = engine.calls
        for path in ("/health", "/v1/models", "/metrics", "/"):
            assert_openai_error(await http.get(path, headers={"host": FOREIGN}), HTTPStatus.MISDIRECTED_REQUEST)
        refused = await http.post("/v1/chat/completions", json=body(), headers={"host": f"{FOREIGN}:{server.port}"})
        assert_openai_error(refused, HTTPStatus.MISDIRECTED_REQUEST)
        assert FOREIGN in refused.json()["error"]["message"] and "allowed_hosts" in refused.json()["error"]["message"]
        assert engine.calls == calls  # nothing reached the generator
        for host in ("localhost", f"localhost:{server.port}", f"127.0.0.1:{server.port}", "[::1]",
                     f"[::1]:{server.port}", CONFIGURED, f"{CONFIGURED}:{server.port}"):
            assert (await http.get("/health", headers={"host": host})).status_code == HTTPStatus.OK, host
        answered = await http.post("/v1/chat/completions", json=body(), headers={"host": f"localhost:{server.port}"})
        assert answered.status_code == HTTPStatus.OK, answered.text


@module_loop
async def test_a_foreign_host_is_left_to_auth_when_auth_is_on(tmp_path: Path) -> None:
    # with keys required the rebinding page has no key: the Host check is not what refuses it
    auth, tokens = keyed_auth(tmp_path)
    server = await HttpServer.start(StandInGenerator(), HttpSettings(host=LOOPBACK_V4, port=0),  # type: ignore[arg-type]
                                    port=0, auth=auth)
    try:
        async with httpx2.AsyncClient(base_url=url(server), timeout=TIMEOUT_S) as http:
            assert (await http.get("/health", headers={"host": FOREIGN})).status_code == HTTPStatus.OK
            refused = await http.post("/v1/chat/completions", json=body(), headers={"host": FOREIGN})
            assert_openai_error(refused, HTTPStatus.UNAUTHORIZED)
            keyed_call = await http.post("/v1/chat/completions", json=body(),
                                         headers={"host": FOREIGN, "authorization": f"Bearer {tokens['web']}"})
            assert keyed_call.status_code == HTTPStatus.OK, keyed_call.text
    finally:
        await server.stop()


@module_loop
async def test_a_body_without_a_json_content_type_is_refused_by_our_guard(
        loopback: tuple[HttpServer, StandInGenerator]) -> None:
    server, engine = loopback
    payload = b'{"model": "", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}'
    async with httpx2.AsyncClient(base_url=url(server), timeout=TIMEOUT_S) as http:
        calls = engine.calls
        for headers in ({}, {"content-type": "text/plain"}, {"content-type": "application/x-www-form-urlencoded"}):
            for path in ("/v1/chat/completions", "/v1/documents"):
                refused = await http.post(path, content=payload, headers=headers)
                assert_openai_error(refused, HTTPStatus.UNSUPPORTED_MEDIA_TYPE)
                assert "Content-Type: application/json" in refused.json()["error"]["message"]
        assert engine.calls == calls
        answered = await http.post("/v1/chat/completions", content=payload,
                                   headers={"content-type": "Application/JSON; charset=utf-8"})
        assert answered.status_code == HTTPStatus.OK, answered.text
