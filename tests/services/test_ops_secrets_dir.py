"""Secrets from files (services.common.settings): with $LAR_SECRETS_DIR set, a file named like a
field's env variable sets it, as a Kubernetes Secret mounted as a volume provides it; precedence
default < TOML < secrets file < env < overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from lookahead_rag.services.common.auth.settings import AuthSettings
from lookahead_rag.services.common.ports import SECRETS_DIR_ENV
from lookahead_rag.services.common.settings import ConfigError, load_settings, origins
from lookahead_rag.services.events.kafka.settings import KafkaSettings

PASSWORD_FILE = "LAR_KAFKA_SASL_PLAIN_PASSWORD"  # the env variable's name is the file's name
SASL_ENV = {"LAR_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "LAR_KAFKA_SASL_PLAIN_USERNAME": "lar"}

pytestmark = pytest.mark.usefixtures("no_lar_env")


@pytest.fixture
def secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A secrets directory holding the Kafka password (trailing newline, as `kubectl create secret
    --from-file` keeps it), named by $LAR_SECRETS_DIR; the SASL protocol and user from env."""
    directory = tmp_path / "secrets"
    directory.mkdir()
    (directory / PASSWORD_FILE).write_text("from-file\n")
    monkeypatch.setenv(SECRETS_DIR_ENV, str(directory))
    for var, value in SASL_ENV.items():
        monkeypatch.setenv(var, value)
    return directory


def kafka_password() -> str | None:
    password = load_settings(KafkaSettings, "kafka").sasl_plain_password
    return None if password is None else password.get_secret_value()


def test_a_secret_is_read_from_its_file(secrets: Path) -> None:
    # the Kafka SASL password comes from the file, stripped of its newline
    assert kafka_password() == "from-file"
    # where it came from is reported (config show) without the value
    assert origins(KafkaSettings, "kafka", None)["sasl_plain_password"] == f"secrets file {secrets / PASSWORD_FILE}"


def test_env_overrides_the_file_and_the_file_overrides_toml(
        secrets: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "lar.toml"
    config.write_text('[kafka]\nsasl_plain_password = "from-toml"\n')
    monkeypatch.setenv("LAR_CONFIG", str(config))
    # the file beats the TOML file
    assert kafka_password() == "from-file"
    # an env variable beats the file
    monkeypatch.setenv(PASSWORD_FILE, "from-env")
    assert kafka_password() == "from-env"


def test_file_names_match_in_any_case_and_other_files_are_ignored(secrets: Path) -> None:
    (secrets / PASSWORD_FILE).unlink()
    (secrets / PASSWORD_FILE.lower()).write_text("lower-case")
    (secrets / "service-key").write_text("not a field's name")  # another key of the same Secret
    (secrets / "..data").mkdir()  # what a Kubernetes Secret volume holds besides its keys
    # matched like env variables (case-insensitive); files naming no field change nothing
    assert kafka_password() == "lower-case"


def test_the_generator_service_key_from_a_file(secrets: Path) -> None:
    (secrets / "LAR_AUTH_SERVICE_KEY").write_text("lar_key_from_file")
    key = load_settings(AuthSettings, "auth").service_key
    # the [auth] service key, mounted from its Secret, is read the same way
    assert key is not None and key.get_secret_value() == "lar_key_from_file"


def test_nothing_is_read_without_the_variable(secrets: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SECRETS_DIR_ENV)
    # no directory is read implicitly: the password is missing, a one-line error says so
    with pytest.raises(ConfigError, match="needs sasl_plain_username and sasl_plain_password"):
        kafka_password()


def test_a_missing_directory_is_a_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRETS_DIR_ENV, str(tmp_path / "nowhere"))
    # a typo in the mount path is refused, not silently ignored
    with pytest.raises(ConfigError, match=rf"secrets directory .*nowhere not found \(from \${SECRETS_DIR_ENV}\)"):
        load_settings(KafkaSettings, "kafka")
