"""``[model] name = "auto"``: the largest built-in on this machine that it can run (issue 45, item 5).

``pick`` is tested on hand-made machines and model lists; the settings and the CLI on planted states
(which models are "present" is patched; nothing is fetched)."""

from __future__ import annotations

import pytest
from lookahead_core.defaults import DEFAULT_MODEL

from lookahead_rag.services.common import model_choice
from lookahead_rag.services.common.model_choice import AUTO, Limits, Machine, parameter_count, pick
from lookahead_rag.services.common.model_settings import ModelSettings

GB = 10**9
LIMITS = Limits(memory_share=0.5, working_set_factor=1.5, params_per_core=400_000_000)
MODELS = [("small", 135_000_000), ("mid", 494_000_000), ("large", 1_540_000_000)]
QWEN_05B = "qwen2.5-coder-0.5b-instruct"
QWEN_15B = "qwen2.5-coder-1.5b-instruct"


def test_parameter_counts_as_people_quote_them() -> None:
    assert parameter_count("135M") == 135_000_000  # M: millions
    assert parameter_count("1.54B") == 1_540_000_000  # B: billions, with a fraction
    with pytest.raises(ValueError, match="does not end"):
        parameter_count("135")  # no suffix: refused, not read as 135 parameters


def test_a_two_core_machine_takes_the_mid_model() -> None:
    # 2 cores x 400M = 800M: the 1.54B is past what the cores decode at a usable speed
    assert pick(MODELS, "float32", Machine(16 * GB, 2, on_cpu=True), LIMITS) == "mid"


def test_more_cores_take_the_large_model() -> None:
    # 4 cores carry 1.6B; 1.54B x 4 bytes x 1.5 = 9.2 GB fits in half of 24 GB
    assert pick(MODELS, "float32", Machine(24 * GB, 4, on_cpu=True), LIMITS) == "large"


def test_memory_limits_the_choice() -> None:
    # 4 cores but 4 GB free: the mid model's 494M x 4 x 1.5 = 2.96 GB is past half of it; the small one fits
    assert pick(MODELS, "float32", Machine(4 * GB, 4, on_cpu=True), LIMITS) == "small"
    # the same machine in bfloat16 (2 bytes a weight): the mid model's 1.48 GB fits
    assert pick(MODELS, "bfloat16", Machine(4 * GB, 4, on_cpu=True), LIMITS) == "mid"


def test_an_accelerator_is_not_limited_by_the_cores() -> None:
    # 2 host cores, but the model decodes on the accelerator: the largest present one
    assert pick(MODELS, "bfloat16", Machine(80 * GB, 2, on_cpu=False), LIMITS) == "large"


def test_only_present_models_are_picked_and_nothing_fitting_falls_back() -> None:
    # only the small one is on the machine: it, however large the machine
    assert pick(MODELS[:1], "float32", Machine(64 * GB, 16, on_cpu=True), LIMITS) == "small"
    # nothing fits (a tiny machine): the fallback, the product's default
    assert pick(MODELS, "float32", Machine(GB // 10, 1, on_cpu=True), LIMITS) == DEFAULT_MODEL


def planted(monkeypatch: pytest.MonkeyPatch, present: set[str], memory: int = 16 * GB, cores: int = 2) -> None:
    """This machine as the choice sees it: ``present`` models, ``memory`` bytes free, ``cores`` cores."""
    monkeypatch.setattr(model_choice, "is_present", lambda m: m.name in present)
    monkeypatch.setattr(model_choice, "machine", lambda device: Machine(memory, cores, device == "cpu"))
    monkeypatch.delenv("LAR_MODEL_NAME", raising=False)  # the test suite pins the 135M (tests/conftest.py)


def test_settings_resolve_auto_to_one_name(monkeypatch: pytest.MonkeyPatch) -> None:
    # a fresh clone: only the packaged 135M is here, so auto serves it
    planted(monkeypatch, {DEFAULT_MODEL})
    assert ModelSettings().name == DEFAULT_MODEL
    # the 0.5B fetched on a 2-core machine: auto serves it (every reader sees the resolved name)
    planted(monkeypatch, {DEFAULT_MODEL, QWEN_05B, QWEN_15B})
    assert ModelSettings(name=AUTO).name == QWEN_05B
    # a named model is served as named, fetched or not
    assert ModelSettings(name=DEFAULT_MODEL).name == DEFAULT_MODEL


def test_auto_limits_are_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    # a 2-core machine with 32 GB free and 1B parameters a core allowed: the 1.5B (9.2 GB working set)
    planted(monkeypatch, {DEFAULT_MODEL, QWEN_05B, QWEN_15B}, memory=32 * GB)
    assert ModelSettings(auto_params_per_core=1_000_000_000).name == QWEN_15B
    # with 16 GB free, half of it is under the 1.5B's working set: the 0.5B
    planted(monkeypatch, {DEFAULT_MODEL, QWEN_05B, QWEN_15B}, memory=16 * GB)
    assert ModelSettings(auto_params_per_core=1_000_000_000).name == QWEN_05B


def test_upgrade_names_what_the_demo_offers(monkeypatch: pytest.MonkeyPatch) -> None:
    # only the 135M here, the 0.5B runnable: the demo offers the 0.5B (not the 1.5B the cores cannot carry)
    planted(monkeypatch, {DEFAULT_MODEL})
    better = model_choice.upgrade("float32", "cpu", LIMITS)
    assert better is not None and better.name == QWEN_05B
    # once it is fetched there is nothing to offer
    planted(monkeypatch, {DEFAULT_MODEL, QWEN_05B})
    assert model_choice.upgrade("float32", "cpu", LIMITS) is None


def test_available_memory_reads_meminfo(tmp_path: object) -> None:
    meminfo = tmp_path / "meminfo"  # type: ignore[operator]
    meminfo.write_text("MemTotal:       24000000 kB\nMemAvailable:   12000000 kB\n")
    # MemAvailable, in kB, as bytes (not MemTotal)
    assert model_choice.available_memory(str(meminfo)) == 12_000_000 * 1024


def demo_args(*argv: str) -> object:
    from lookahead_rag.services.demo import parse_args

    return parse_args(list(argv))


def test_the_demo_offers_the_better_model_and_fetches_it_on_yes(monkeypatch: pytest.MonkeyPatch, tmp_path: object,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from lookahead_rag.services import demo

    planted(monkeypatch, {DEFAULT_MODEL})
    fetched: list[str] = []
    monkeypatch.setattr(demo, "fetch", lambda name, dtype, progress: fetched.append(name))
    settings = demo.demo_settings(str(tmp_path), demo_args())
    assert settings.model.name == DEFAULT_MODEL
    # not at a terminal: one line says how, nothing is fetched
    assert not demo.offer_upgrade(settings, demo_args(), ask=False)
    assert f"lookahead-rag models fetch {QWEN_05B}" in capsys.readouterr().out and fetched == []
    # at a terminal, "n": nothing fetched
    monkeypatch.setattr("builtins.input", lambda prompt: "n")
    assert not demo.offer_upgrade(settings, demo_args(), ask=True) and fetched == []
    # at a terminal, "y": the 0.5B is fetched
    monkeypatch.setattr("builtins.input", lambda prompt: "y")
    assert demo.offer_upgrade(settings, demo_args(), ask=True) and fetched == [QWEN_05B]
    # a model named on the command line: no offer
    assert not demo.offer_upgrade(settings, demo_args("--model", DEFAULT_MODEL), ask=True)
