"""API keys at rest, the ``keys`` command and the Authenticator's decisions (no server here:
tests/services/test_auth_grpc.py and tests/pipeline/test_auth_pipeline.py serve them)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from lookahead_rag.services import keys_cli
from lookahead_rag.services.common.auth.callers import Authenticator, bearer_metadata, bearer_token
from lookahead_rag.services.common.auth.keys import KEY_PREFIX, KeyFile, KeyFileError, KeyStore, digest
from lookahead_rag.services.common.auth.settings import AuthSettings
from lookahead_rag.services.common.errors import PermissionDenied, Unauthenticated
from lookahead_rag.services.common.settings import ConfigError, load_settings

MIN_KEY_CHARS = 40  # "lar_" + 43 urlsafe characters of 32 random bytes


@pytest.fixture
def keys(tmp_path: Path) -> KeyFile:
    return KeyFile(tmp_path / "keys.json")


def auth_for(keys: KeyFile, **settings: object) -> Authenticator:
    return Authenticator(AuthSettings(mode="required", keys_file=keys.path, **settings))  # type: ignore[arg-type]


# --- the key file ------------------------------------------------------------------------------------

def test_a_key_is_random_and_only_its_digest_is_stored(keys: KeyFile) -> None:
    record, token = keys.add(["acme"], name="web")
    other, token2 = keys.add(["acme"])
    # high-entropy, recognisable, different each time
    assert token.startswith(KEY_PREFIX) and len(token) >= MIN_KEY_CHARS and token != token2
    raw = keys.path.read_text()
    # the file holds the digest, never the key
    assert token not in raw and token2 not in raw and digest(token) in raw
    assert json.loads(raw)["keys"][0] == {"id": record.id, "name": "web", "tenants": ["acme"],
                                          "created": record.created, "revoked": False, "sha256": digest(token),
                                          "scopes": ["answer"]}  # a new key's default scope
    # only the owner may read the file
    assert stat.S_IMODE(os.stat(keys.path).st_mode) == 0o600
    assert record.id != other.id


def test_store_finds_live_keys_and_rereads_the_file_when_it_changes(keys: KeyFile) -> None:
    store = KeyStore(keys.path)
    # no file yet: no key
    assert store.find("lar_nothing") is None
    record, token = keys.add(["acme", "beta"])
    # added after the store was made: found without a restart
    assert store.find(token) == record
    keys.revoke(record.id)
    # revoked: refused on the next lookup
    assert store.find(token) is None
    assert [k.revoked for k in keys.load()] == [True]


def test_a_broken_keys_file_lets_no_key_in(keys: KeyFile) -> None:
    store = KeyStore(keys.path)
    _, token = keys.add(["acme"])
    assert store.find(token) is not None
    keys.path.write_text("{not json")
    # unreadable: every key refused (never the last good copy, which might hold a revoked key)
    assert store.find(token) is None
    keys.path.write_text(json.dumps({"version": 99, "keys": []}))
    assert store.find(token) is None
    with pytest.raises(KeyFileError, match="version"):
        keys.load()


def test_revoking_an_unknown_id_and_adding_without_tenants_are_errors(keys: KeyFile) -> None:
    with pytest.raises(KeyFileError, match="no key with id"):
        keys.revoke("k00000000")
    with pytest.raises(KeyFileError, match="at least one tenant"):
        keys.add([])


# --- the keys command ---------------------------------------------------------------------------------

def test_keys_cli_add_list_revoke(keys: KeyFile, capsys: pytest.CaptureFixture[str]) -> None:
    file = ["--keys-file", str(keys.path)]
    assert keys_cli.main(["add", "--tenant", "acme", "--tenant", "beta", "--name", "acme-web", *file]) == 0
    out = capsys.readouterr()
    token = out.out.strip()
    # the key alone on stdout, once; where it went on stderr
    assert token.startswith(KEY_PREFIX) and "cannot be shown again" in out.err
    assert keys_cli.main(["add", "--all-tenants", "--name", "svc", *file]) == 0
    capsys.readouterr()
    assert keys_cli.main(["list", *file]) == 0
    listing = capsys.readouterr().out
    # ids, names, tenants and state; never the key
    (web,) = [k for k in keys.load() if k.name == "acme-web"]
    assert f"{web.id}  acme-web" in listing and "acme,beta" in listing and "*" in listing
    assert token not in listing and web.sha256 not in listing
    assert keys_cli.main(["revoke", web.id, *file]) == 0
    capsys.readouterr()
    assert keys_cli.main(["list", *file]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(web.id))
    assert row.endswith("yes")
    assert KeyStore(keys.path).find(token) is None


def test_keys_cli_errors_are_one_line(keys: KeyFile, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("LAR_AUTH_KEYS_FILE", raising=False)
    monkeypatch.delenv("LAR_CONFIG", raising=False)
    # no keys file anywhere
    assert keys_cli.main(["list"]) == keys_cli.EXIT_ERROR
    assert "no keys file" in capsys.readouterr().err
    # the file from the environment, and an id it does not hold
    monkeypatch.setenv("LAR_AUTH_KEYS_FILE", str(keys.path))
    assert keys_cli.main(["revoke", "k12345678"]) == keys_cli.EXIT_ERROR
    err = capsys.readouterr().err.strip()
    assert "no key with id 'k12345678'" in err and "\n" not in err


# --- settings -----------------------------------------------------------------------------------------

def test_auth_is_off_by_default_and_required_needs_a_source_of_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in [v for v in os.environ if v.startswith("LAR_")]:
        monkeypatch.delenv(var)
    assert load_settings(AuthSettings, "auth").mode == "off"
    monkeypatch.setenv("LAR_AUTH_MODE", "required")
    with pytest.raises(ConfigError, match="needs keys_file or cert_subjects"):
        load_settings(AuthSettings, "auth")
    monkeypatch.setenv("LAR_AUTH_SERVICE_KEY", "lar_secret-value")
    monkeypatch.setenv("LAR_AUTH_CERT_SUBJECTS", '{"batch": ["acme"]}')
    loaded = load_settings(AuthSettings, "auth")
    # the service key never shows in the settings' text
    assert "lar_secret-value" not in repr(loaded) and loaded.cert_subjects == {"batch": ["acme"]}


# --- the decisions ------------------------------------------------------------------------------------

def test_every_bad_credential_is_refused_with_its_code(keys: KeyFile) -> None:
    auth = auth_for(keys, cert_subjects={"batch-job": ["acme"], "ops": ["*"]})
    acme, acme_token = keys.add(["acme"])
    _, admin_token = keys.add(["*"])
    revoked, revoked_token = keys.add(["acme"])
    keys.revoke(revoked.id)
    unauthenticated = {
        "missing": (None, None),
        "wrong scheme": (f"Basic {acme_token}", None),
        "no key after the scheme": ("Bearer ", None),
        "two words as the key": (f"Bearer {acme_token} extra", None),
        "unknown key": ("Bearer lar_" + "A" * 43, None),
        "tampered key": (f"Bearer {acme_token[:-1]}", None),
        "revoked key": (f"Bearer {revoked_token}", None),
        "unknown certificate subject": (None, "intruder"),
    }
    for case, (bearer, subject) in unauthenticated.items():
        with pytest.raises(Unauthenticated) as err:
            auth.check(bearer, subject, "acme")
        # no key in the message, whatever was sent
        assert acme_token not in str(err.value) and revoked_token not in str(err.value), case
    denied = {
        "other tenant's key": (f"Bearer {acme_token}", None, "beta"),
        "look-alike tenant name": (f"Bearer {acme_token}", None, "ACME"),
        "call across every tenant with a one-tenant key": (f"Bearer {acme_token}", None, ""),
        "certificate of another tenant": (None, "batch-job", "beta"),
    }
    for case, (bearer, subject, tenant) in denied.items():
        with pytest.raises(PermissionDenied):
            auth.check(bearer, subject, tenant)
        assert case
    # the right credentials
    assert auth.check(f"Bearer {acme_token}", None, "acme").name == f"key {acme.id}"
    assert auth.check(f"bearer {admin_token}", None, "").all_tenants  # the scheme in any case; * for admin
    assert auth.check(None, "batch-job", "acme").name == "cert CN=batch-job"
    # a key wins over a certificate: a bad key is not rescued by a good certificate
    with pytest.raises(Unauthenticated):
        auth.check("Bearer lar_unknown", "ops", "acme")


def test_bearer_helpers() -> None:
    assert bearer_token(None) is None and bearer_token("Bearer  abc ") == "abc"
    assert bearer_metadata(None) == () and bearer_metadata("k") == (("authorization", "Bearer k"),)
    with pytest.raises(Unauthenticated):
        bearer_token("abc")
