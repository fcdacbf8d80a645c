"""Configuration: defaults < TOML file < environment, one-line errors, `config show` / `config table`.

Checked on a small test class and on every real service settings class that exists (the others
are skipped until their module lands).
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import ClassVar

import pytest
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from lookahead_rag.services import config_cli
from lookahead_rag.services.common import settings
from lookahead_rag.services.common.ports import CONFIG_ENV
from lookahead_rag.services.common.settings import ConfigError, LoggingSettings, ServiceSettings, load_settings
from lookahead_rag.services.config import SECTIONS, AllSettings

REPO = Path(__file__).resolve().parents[2]
SECTION = "opstest"


class DemoSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="LAR_OPSTEST_")
    section: ClassVar[str] = SECTION

    workers: int = Field(4, ge=1, description="worker count")
    name: str = Field("default-name", description="a name")
    ratio: float = Field(0.5, description="a ratio nobody sets")


@pytest.fixture
def demo(monkeypatch: pytest.MonkeyPatch) -> type[DemoSettings]:
    """DemoSettings registered as section [opstest]; no LAR_* variables leak in from the caller."""
    for var in list(os.environ):
        if var.upper().startswith("LAR_"):
            monkeypatch.delenv(var)
    monkeypatch.setitem(SECTIONS, SECTION, DemoSettings)
    return DemoSettings


def write(tmp_path: Path, text: str, name: str = "config.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def error_of(cls: type[BaseSettings], section: str, path: Path | None) -> str:
    with pytest.raises(ConfigError) as info:
        load_settings(cls, section, path)
    message = str(info.value)
    assert "\n" not in message, message
    return message


# --- precedence -------------------------------------------------------------------------------------


def test_defaults_then_file_then_environment(demo, tmp_path, monkeypatch) -> None:
    assert load_settings(demo, SECTION, None).workers == 4
    path = write(tmp_path, f'[{SECTION}]\nworkers = 8\nname = "from-file"\n')
    from_file = load_settings(demo, SECTION, path)
    assert (from_file.workers, from_file.name, from_file.ratio) == (8, "from-file", 0.5)
    monkeypatch.setenv("LAR_OPSTEST_WORKERS", "16")
    both = load_settings(demo, SECTION, path)
    assert (both.workers, both.name, both.ratio) == (16, "from-file", 0.5)
    assert type(both) is demo  # the caller's class itself, not a loader subclass


def test_config_env_names_the_file_and_config_flag_beats_it(demo, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(CONFIG_ENV, str(write(tmp_path, f"[{SECTION}]\nworkers = 5\n", "env.toml")))
    assert load_settings(demo, SECTION).workers == 5
    assert demo().workers == 5  # the ServiceSettings base reads $LAR_CONFIG by itself too
    flag = write(tmp_path, f"[{SECTION}]\nworkers = 6\n", "flag.toml")
    assert load_settings(demo, SECTION, flag).workers == 6


def test_other_tables_do_not_leak_into_a_section(demo, tmp_path) -> None:
    path = write(tmp_path, f'[kafka]\nbootstrap_servers = "k:9092"\n[{SECTION}]\nname = "mine"\n')
    loaded = load_settings(demo, SECTION, path)
    assert loaded.name == "mine" and loaded.workers == 4


# --- errors -----------------------------------------------------------------------------------------


def test_unknown_field_in_file_is_named(demo, tmp_path) -> None:
    path = write(tmp_path, f"[{SECTION}]\nworkerz = 3\n")
    message = error_of(demo, SECTION, path)
    assert "workerz" in message and "unknown field" in message and "did you mean workers" in message


def test_ill_typed_file_value_names_field_and_file(demo, tmp_path) -> None:
    path = write(tmp_path, f'[{SECTION}]\nworkers = "many"\n')
    message = error_of(demo, SECTION, path)
    assert message.startswith(f"[{SECTION}] workers = 'many'") and str(path) in message


def test_ill_typed_env_value_names_the_variable(demo, monkeypatch) -> None:
    monkeypatch.setenv("LAR_OPSTEST_WORKERS", "0")
    message = error_of(demo, SECTION, None)
    assert "workers" in message and "LAR_OPSTEST_WORKERS" in message and "greater than or equal" in message


def test_misspelt_env_variable_is_refused(demo, monkeypatch) -> None:
    monkeypatch.setenv("LAR_OPSTEST_WORKRS", "3")
    message = error_of(demo, SECTION, None)
    assert "LAR_OPSTEST_WORKRS" in message and "LAR_OPSTEST_WORKERS" in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[opstest\nworkers = 2\n", "invalid TOML"),
        ("opstest = 3\n", "must be a table"),
    ],
)
def test_bad_file_is_one_line(demo, tmp_path, text: str, expected: str) -> None:
    assert expected in error_of(demo, SECTION, write(tmp_path, text))


def test_unknown_table_is_refused_where_the_sections_are_known(demo, tmp_path, capsys) -> None:
    typo = write(tmp_path, "[generater]\nport = 1\n")
    with pytest.raises(ConfigError, match=r"unknown table \[generater\] \(did you mean generator\?\)"):
        AllSettings.load(typo)
    assert config_cli.main(["show", "--config", str(write(tmp_path, "[opstes]\nworkers = 2\n"))]) == 2
    assert "unknown table [opstes]" in capsys.readouterr().err


def test_missing_config_file(demo, tmp_path) -> None:
    assert "not found" in error_of(demo, SECTION, tmp_path / "nope.toml")


# --- the real settings classes ----------------------------------------------------------------------


def int_field_that_loads(cls: type[BaseSettings], section: str, tmp_path: Path) -> tuple[str, int]:
    """An int field whose default + 1 is a valid value (constraints and cross-field checks allow it)."""
    for name, field in cls.model_fields.items():
        if field.annotation is not int or not isinstance(field.default, int):
            continue
        try:
            load_settings(cls, section, write(tmp_path, f"[{section}]\n{name} = {field.default + 1}\n"))
        except ConfigError:
            continue
        return name, field.default
    pytest.skip(f"{cls.__name__} has no plain int field to exercise")


@pytest.mark.parametrize("section", list(SECTIONS))
def test_real_settings_precedence_and_errors(section: str, tmp_path, monkeypatch) -> None:
    cls = SECTIONS[section]
    for var in list(os.environ):
        if var.upper().startswith("LAR_"):
            monkeypatch.delenv(var)
    name, default = int_field_that_loads(cls, section, tmp_path)
    assert getattr(load_settings(cls, section, None), name) == default
    path = write(tmp_path, f"[{section}]\n{name} = {default + 1}\n")
    assert getattr(load_settings(cls, section, path), name) == default + 1
    monkeypatch.setenv(settings.env_name(cls, name), str(default + 2))
    assert getattr(load_settings(cls, section, path), name) == default + 2
    monkeypatch.setenv(settings.env_name(cls, name), "not-a-number")
    assert name in error_of(cls, section, path)
    monkeypatch.delenv(settings.env_name(cls, name))
    unknown = write(tmp_path, f"[{section}]\nno_such_field_xyz = 1\n", "unknown.toml")
    assert "no_such_field_xyz" in error_of(cls, section, unknown)


@pytest.mark.parametrize("section", list(SECTIONS))
def test_every_field_has_a_default_and_a_one_line_description(section: str) -> None:
    cls = SECTIONS[section]
    for name, field in cls.model_fields.items():
        assert not field.is_required(), f"{cls.__name__}.{name} has no default"
        assert field.description and "\n" not in field.description, f"{cls.__name__}.{name}: no description"


def test_logging_settings_from_env(monkeypatch) -> None:
    monkeypatch.setenv("LAR_LOG_LEVEL", "DEBUG")
    assert load_settings(LoggingSettings, "logging").level == "DEBUG"
    monkeypatch.setenv("LAR_LOG_LEVEL", "LOUD")
    assert "LAR_LOG_LEVEL" in error_of(LoggingSettings, "logging", None)


# --- lookahead-rag config show / table --------------------------------------------------------------


def test_config_show_prints_effective_values_with_descriptions(demo, tmp_path, monkeypatch, capsys) -> None:
    path = write(tmp_path, f'[{SECTION}]\nname = "from-file"\n')
    monkeypatch.setenv("LAR_OPSTEST_WORKERS", "9")
    assert config_cli.main(["show", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    parsed = tomllib.loads(out)  # the output is a valid config file
    assert parsed[SECTION] == {"workers": 9, "name": "from-file", "ratio": 0.5}
    assert "# worker count\nworkers = 9  # from env LAR_OPSTEST_WORKERS" in out
    assert f'name = "from-file"  # from {path} [{SECTION}]' in out
    for section, cls in SECTIONS.items():
        for name in cls.model_fields:
            assert f"\n{name} = " in out or f"\n# {name} = (unset)" in out, f"[{section}] {name} missing"


def test_config_show_one_section_and_bad_config(demo, tmp_path, capsys) -> None:
    assert config_cli.main(["show", "--section", SECTION]) == 0
    assert set(tomllib.loads(capsys.readouterr().out)) == {SECTION}
    bad = write(tmp_path, f"[{SECTION}]\nworkers = -1\n")
    assert config_cli.main(["show", "--config", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lookahead-rag config: [opstest] workers = -1") and "\n" not in err


def test_config_table_lists_every_field(demo, capsys) -> None:
    assert config_cli.main(["table"]) == 0
    out = capsys.readouterr().out
    assert "| `[opstest]` | `workers` | `LAR_OPSTEST_WORKERS` | int | `4` | worker count |" in out
    for cls in SECTIONS.values():
        for name in cls.model_fields:
            assert f"| `{settings.env_name(cls, name)}` |" in out


def test_deploy_config_md_is_the_generated_table() -> None:
    committed = (REPO / "deploy" / "CONFIG.md").read_text()
    assert committed == config_cli.table(), (
        "deploy/CONFIG.md is stale: run `lookahead-rag config table > deploy/CONFIG.md`"
    )
