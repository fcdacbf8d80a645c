"""A renamed setting is still read under its old name, with a warning: ``[generator] draft_budget`` (the
tokens of tenant continuations fetched per request) is now ``continuation_tokens``; a step's draft budget
is another thing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lookahead_rag.services.common.ports import CONFIG_ENV
from lookahead_rag.services.common.settings import load_settings
from lookahead_rag.services.generator.settings import GeneratorSettings

OLD_ENV, NEW_ENV = "LAR_GENERATOR_DRAFT_BUDGET", "LAR_GENERATOR_CONTINUATION_TOKENS"


@pytest.fixture(autouse=True)
def no_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """No file nor LAR_GENERATOR_* variable of the caller's leaks in."""
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    for var in list(os.environ):
        if var.upper().startswith("LAR_GENERATOR_"):
            monkeypatch.delenv(var)


def load(tmp_path: Path, table: str = "") -> GeneratorSettings:
    config = tmp_path / "lar.toml"
    config.write_text(f"[generator]\n{table}\n")
    return load_settings(GeneratorSettings, "generator", config)


def test_the_old_name_in_a_file_is_read_as_the_new_one(tmp_path: Path) -> None:
    with pytest.warns(DeprecationWarning, match="draft_budget is renamed continuation_tokens"):
        assert load(tmp_path, "draft_budget = 7").continuation_tokens == 7
    with pytest.warns(DeprecationWarning):  # both given: the new name wins
        assert load(tmp_path, "draft_budget = 7\ncontinuation_tokens = 8").continuation_tokens == 8


def test_the_old_variable_is_read_as_the_new_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(OLD_ENV, "9")
    with pytest.warns(DeprecationWarning, match=f"{OLD_ENV} is renamed {NEW_ENV}"):
        assert load(tmp_path).continuation_tokens == 9
    monkeypatch.setenv(NEW_ENV, "10")
    with pytest.warns(DeprecationWarning):
        assert load(tmp_path).continuation_tokens == 10


def test_the_old_name_as_an_argument() -> None:
    with pytest.warns(DeprecationWarning):
        assert GeneratorSettings(draft_budget=5).continuation_tokens == 5  # type: ignore[call-arg]
    assert GeneratorSettings(continuation_tokens=6).continuation_tokens == 6
