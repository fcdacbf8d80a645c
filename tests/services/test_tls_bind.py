"""Transport security: `serve` refuses a plaintext listener beyond loopback unless allow_insecure, and
the [tls] settings refuse half pairs and unreadable files."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from lookahead_rag.services.common.auth.settings import AuthSettings
from lookahead_rag.services.common.auth.tls import (
    InsecureBindError,
    TlsSettings,
    check_bind,
    is_loopback,
    server_credentials,
)
from lookahead_rag.services.common.settings import ConfigError, load_settings
from tests.services.tls_helpers import LOOPBACK_V4, Pki, server_tls

pytestmark = pytest.mark.usefixtures("no_lar_env")


def keyed() -> AuthSettings:
    """Auth on: only TLS is in question in these tests (the auth rule: test_hostile_round4_doors.py)."""
    return AuthSettings(mode="required", keys_file=Path("keys.json"))


# --- where a server may listen -------------------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost", "LOCALHOST"])
def test_loopback_needs_no_tls(host: str, caplog: pytest.LogCaptureFixture) -> None:
    # the embedded demo and the tests: loopback without TLS passes silently
    with caplog.at_level(logging.WARNING):
        check_bind({"retriever": host}, TlsSettings(), AuthSettings())
    assert is_loopback(host) and not caplog.records


@pytest.mark.parametrize("host", ["0.0.0.0", "", "::", "[::]", "10.1.2.3", "192.168.0.7", "retriever.internal"])
def test_non_loopback_without_tls_is_refused(host: str) -> None:
    # any other address in plaintext is refused, in one line that says how to fix it
    with pytest.raises(InsecureBindError) as err:
        check_bind({"draftcache": LOOPBACK_V4, "generator": host}, TlsSettings(), AuthSettings())
    message = str(err.value)
    assert "\n" not in message and "generator" in message and "draftcache" not in message  # loopback is fine
    assert "allow_insecure" in message and "LAR_TLS_CERT_FILE" in message


def test_allow_insecure_lets_it_through_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    # allow_insecure = true: no error, but a WARNING naming what is exposed
    with caplog.at_level(logging.WARNING):
        check_bind({"http": "0.0.0.0"}, TlsSettings(allow_insecure=True), keyed())
    (record,) = caplog.records
    assert record.levelno == logging.WARNING and "http on 0.0.0.0" in record.getMessage()
    assert "WITHOUT TLS" in record.getMessage()


def test_non_loopback_with_tls_is_allowed(pki: Pki, caplog: pytest.LogCaptureFixture) -> None:
    # server TLS on (and auth required): any address, no warning
    with caplog.at_level(logging.WARNING):
        check_bind({"generator": "0.0.0.0", "http": "0.0.0.0"}, server_tls(pki), keyed())
    assert not caplog.records


def test_serve_refuses_a_public_host_without_tls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # `serve draftcache` on 0.0.0.0 without [tls]: exit 2 with one line on stderr, nothing served
    # (were the check missing, the stubbed signal wait would return at once and serve would exit 0)
    from lookahead_rag.services import serve

    async def no_wait() -> None:
        return None

    monkeypatch.setattr(serve, "_wait_for_signal", no_wait)
    monkeypatch.setattr(serve, "setup_logging", lambda *a, **k: None)
    monkeypatch.setenv("LAR_DRAFTCACHE_HOST", "0.0.0.0")
    monkeypatch.setenv("LAR_DRAFTCACHE_DATA_DIR", str(tmp_path))
    assert serve.main(["draftcache", "--port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lookahead-rag serve: [tls] refusing to serve draftcache on 0.0.0.0") and "\n" not in err


# --- settings ------------------------------------------------------------------------------------


def test_tls_settings_load_from_env_and_refuse_half_pairs(pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    # LAR_TLS_* fill the section; a certificate without its key is a one-line ConfigError
    monkeypatch.setenv("LAR_TLS_CERT_FILE", str(pki.server_cert))
    monkeypatch.setenv("LAR_TLS_KEY_FILE", str(pki.server_key))
    monkeypatch.setenv("LAR_TLS_ALLOW_INSECURE", "true")
    loaded = load_settings(TlsSettings, "tls")
    assert loaded.server_enabled and loaded.allow_insecure and loaded.client_enabled
    monkeypatch.delenv("LAR_TLS_KEY_FILE")
    with pytest.raises(ConfigError, match="cert_file and key_file must be set together"):
        load_settings(TlsSettings, "tls")
    with pytest.raises(ConfigError, match="client_ca_file"):
        load_settings(TlsSettings, "tls", cert_file=None, client_ca_file=str(pki.ca))


def test_unreadable_certificate_is_a_config_error(tmp_path: Path) -> None:
    # a missing file is named in one line, not a gRPC stack trace
    tls = TlsSettings(cert_file=tmp_path / "missing.crt", key_file=tmp_path / "missing.key")
    with pytest.raises(ConfigError, match="missing"):
        server_credentials(tls)
