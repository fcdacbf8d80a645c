"""``[model] name = "auto"``: the largest built-in on this machine that it can run (issue 45, item 5), its
weights counted in the format they are served in and kept only at a usable estimated speed (issue 50, item 6).

``pick`` is tested on hand-made machines and model lists; the settings and the CLI on planted states
(which models are "present" is patched; nothing is fetched); the demo's fetch decision on fakes (nothing
is downloaded: the fetch itself is a fake)."""

from __future__ import annotations

import pytest
from lookahead_core.catalog import BUILTINS
from lookahead_core.defaults import DEFAULT_MODEL

from lookahead_rag.services.common import model_choice
from lookahead_rag.services.common.model_choice import (
    AUTO,
    Limits,
    Machine,
    candidate,
    parameter_count,
    pick,
    read_rate,
)
from lookahead_rag.services.common.model_settings import ModelSettings

GB = 10**9
MB = 10**6
LIMITS = Limits(memory_share=0.5, working_set_factor=1.5, min_tokens_per_s=15)
# the three built-ins' shapes: parameters and GGUF file bytes (the 135M's Q4_1, the Qwens' Q4_K_M)
SHAPES = [("small", 135_000_000, 92 * MB), ("mid", 494_000_000, 491 * MB), ("large", 1_540_000_000, 1_117 * MB)]
QWEN_05B = "qwen2.5-coder-0.5b-instruct"
QWEN_15B = "qwen2.5-coder-1.5b-instruct"


def models(weights: str = "file", dtype: str = "float32", on_cpu: bool = True) -> list[model_choice.Candidate]:
    return [candidate(name, params, size, weights, dtype, on_cpu) for name, params, size in SHAPES]


def cpu(memory: int, cores: int) -> Machine:
    """A CPU machine with ``memory`` bytes free and ``cores`` cores, reading weights at the modelled rate."""
    return Machine(memory, cores, on_cpu=True, read_bytes_per_s=read_rate(cores))


def test_parameter_counts_as_people_quote_them() -> None:
    assert parameter_count("135M") == 135_000_000  # M: millions
    assert parameter_count("1.54B") == 1_540_000_000  # B: billions, with a fraction
    with pytest.raises(ValueError, match="does not end"):
        parameter_count("135")  # no suffix: refused, not read as 135 parameters


def test_served_bytes_follow_the_weights_setting() -> None:
    mid = dict(name="mid", params=494_000_000, file_bytes=491 * MB, on_cpu=True)
    assert candidate(**mid, weights="file", dtype="float32").served_bytes == 491 * MB  # the file's blocks
    assert candidate(**mid, weights="float32", dtype="float32").served_bytes == 494_000_000 * 4  # dense fp32
    assert candidate(**mid, weights="float32", dtype="bfloat16").served_bytes == 494_000_000 * 2  # dtype says
    assert candidate(**mid, weights="bfloat16", dtype="float32").served_bytes == 494_000_000 * 2
    assert candidate(**mid, weights="int8", dtype="float32").served_bytes == 494_000_000  # a byte a weight
    # file off a CPU is the dense dtype (models.served_weights); a quantized load peaks at the fp32 model too
    assert candidate(**{**mid, "on_cpu": False}, weights="file", dtype="bfloat16").served_bytes == 494_000_000 * 2
    assert candidate(**mid, weights="file", dtype="float32").load_bytes == 494_000_000 * 4 + 491 * MB


def test_a_two_core_machine_takes_the_mid_model_from_its_file() -> None:
    # 2 cores read 10 GB/s: the mid file (491 MB) ~20 tok/s; the large one (1.1 GB) ~9 tok/s, under 15
    choice = pick(models(), cpu(16 * GB, 2), LIMITS)
    assert choice.name == "mid"
    # the reason says the bytes, the estimated speed, the rule, and why the larger one is not served
    assert "491 MB" in choice.reason and "~20 tok/s" in choice.reason and ">= 15 tok/s" in choice.reason
    assert "large: ~9.0 tok/s < 15" in choice.reason


def test_dense_weights_are_slower_so_two_cores_keep_the_small_model() -> None:
    # fp32: the mid model reads 1.98 GB a token, ~5 tok/s on 2 cores; the small one's 540 MB ~18.5 tok/s
    assert pick(models("float32"), cpu(16 * GB, 2), LIMITS).name == "small"


def test_more_cores_take_the_large_model() -> None:
    # 4 cores read 20 GB/s: the large file ~18 tok/s
    assert pick(models(), cpu(24 * GB, 4), LIMITS).name == "large"
    # the read rate stops growing past a socket's: 64 cores read no faster than 10
    assert read_rate(64) == read_rate(10)


def test_the_speed_floor_is_a_setting() -> None:
    # at 8 tok/s the large file qualifies on 2 cores
    assert pick(models(), cpu(16 * GB, 2), Limits(0.5, 1.5, min_tokens_per_s=8)).name == "large"


def test_memory_limits_the_choice() -> None:
    # 16 cores but 2 GB free: the mid model's fp32 load (1.98 GB + its blocks) does not fit; the small one does
    assert pick(models(), cpu(2 * GB, 16), LIMITS).name == "small"
    # bfloat16 on 3 GB: the mid model's 0.99 GB x 1.5 is within half of it (and it loads dense, no fp32 copy)
    assert pick(models("bfloat16"), Machine(3 * GB, 16, True, read_rate(16)), LIMITS).name == "mid"


def test_an_accelerator_is_not_limited_by_speed() -> None:
    # 2 host cores, but the model decodes on the accelerator: the largest present one, dense
    accelerator = Machine(80 * GB, 2, on_cpu=False, read_bytes_per_s=read_rate(2))
    assert pick(models("file", "bfloat16", on_cpu=False), accelerator, LIMITS).name == "large"


def test_only_present_models_are_picked_and_nothing_fitting_falls_back() -> None:
    # only the small one is on the machine: it, however large the machine
    assert pick(models()[:1], cpu(64 * GB, 16), LIMITS).name == "small"
    # nothing fits (a tiny machine): the fallback, the product's default, and the line says so
    choice = pick(models(), cpu(GB // 10, 1), LIMITS)
    assert choice.name == DEFAULT_MODEL and "no built-in here fits" in choice.reason


def planted(monkeypatch: pytest.MonkeyPatch, present: set[str], memory: int = 16 * GB, cores: int = 2) -> None:
    """This machine as the choice sees it: ``present`` models, ``memory`` bytes free, ``cores`` cores; the
    served weights the product's default (file)."""
    monkeypatch.setattr(model_choice, "is_present", lambda m: m.name in present)
    monkeypatch.setattr(model_choice, "machine", lambda device: Machine(memory, cores, device == "cpu",
                                                                         read_rate(cores)))
    packaged = 92 * MB  # the 135M's Q4_1 file (the Qwens' sizes are pinned in the catalog)
    monkeypatch.setattr(model_choice, "file_size", lambda m: getattr(m.source, "size", packaged))
    monkeypatch.delenv("LAR_MODEL_NAME", raising=False)  # the test suite pins the 135M (tests/conftest.py)
    monkeypatch.delenv("LAR_MODEL_WEIGHTS", raising=False)  # ... and serves fp32


def test_settings_resolve_auto_to_one_name(monkeypatch: pytest.MonkeyPatch) -> None:
    # a fresh clone: only the packaged 135M is here, so auto serves it
    planted(monkeypatch, {DEFAULT_MODEL})
    assert ModelSettings().name == DEFAULT_MODEL
    # every built-in fetched on a 2-core machine: auto serves the 0.5B from its file (every reader sees the name)
    planted(monkeypatch, {DEFAULT_MODEL, QWEN_05B, QWEN_15B})
    settings = ModelSettings(name=AUTO)
    assert settings.name == QWEN_05B
    assert settings.auto_choice is not None and "491 MB" in settings.auto_choice.reason
    # a named model is served as named, fetched or not, and no choice is recorded
    named = ModelSettings(name=DEFAULT_MODEL)
    assert named.name == DEFAULT_MODEL and named.auto_choice is None


def test_auto_limits_are_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    # 2 cores, a speed floor of 8 tok/s: the 1.5B's file (~9 tok/s estimated) qualifies
    planted(monkeypatch, {DEFAULT_MODEL, QWEN_05B, QWEN_15B}, memory=32 * GB)
    assert ModelSettings(auto_min_tokens_per_s=8).name == QWEN_15B
    # with 6 GB free the 1.5B's fp32 load (6.2 GB + its blocks) does not fit: the 0.5B
    planted(monkeypatch, {DEFAULT_MODEL, QWEN_05B, QWEN_15B}, memory=6 * GB)
    assert ModelSettings(auto_min_tokens_per_s=8).name == QWEN_05B
    # dense fp32 weights on 2 cores: the 0.5B (1.98 GB a token, ~5 tok/s) is too slow, the 135M serves
    planted(monkeypatch, {DEFAULT_MODEL, QWEN_05B, QWEN_15B})
    assert ModelSettings(weights="float32").name == DEFAULT_MODEL


def test_upgrade_names_what_the_demo_fetches(monkeypatch: pytest.MonkeyPatch) -> None:
    # only the 135M here, the 0.5B runs well: the demo fetches the 0.5B (not the 1.5B, too slow on 2 cores)
    planted(monkeypatch, {DEFAULT_MODEL})
    better = model_choice.upgrade("file", "float32", "cpu", LIMITS)
    assert better is not None and better.name == QWEN_05B
    # on 4 cores the 1.5B's file runs well: that one
    planted(monkeypatch, {DEFAULT_MODEL}, memory=32 * GB, cores=4)
    better = model_choice.upgrade("file", "float32", "cpu", LIMITS)
    assert better is not None and better.name == QWEN_15B
    # once the 0.5B is fetched on 2 cores there is nothing to fetch
    planted(monkeypatch, {DEFAULT_MODEL, QWEN_05B})
    assert model_choice.upgrade("file", "float32", "cpu", LIMITS) is None


def test_available_memory_reads_meminfo(tmp_path: object) -> None:
    meminfo = tmp_path / "meminfo"  # type: ignore[operator]
    meminfo.write_text("MemTotal:       24000000 kB\nMemAvailable:   12000000 kB\n")
    # MemAvailable, in kB, as bytes (not MemTotal)
    assert model_choice.available_memory(str(meminfo)) == 12_000_000 * 1024


def demo_args(*argv: str) -> object:
    from lookahead_rag.services.demo import parse_args

    return parse_args(list(argv))


def test_the_fetch_decision() -> None:
    from lookahead_rag.services import demo
    from lookahead_rag.services.demo import fetch_plan

    better = BUILTINS[QWEN_05B]
    online, offline = (lambda: True), (lambda: False)
    # auto chose, a better model runs well here, fetching on, online: fetch it
    assert fetch_plan(True, better, False, online).model is better
    # a model named (--model, [model] name, LAR_MODEL_NAME as in the tests) or nothing better: nothing, silently
    nothing = demo.FetchPlan()
    assert fetch_plan(False, better, False, online) == nothing == fetch_plan(True, None, False, online)
    # --no-fetch / LAR_DEMO_FETCH=0: one line says how
    off = fetch_plan(True, better, True, online)
    assert off.model is None and f"lookahead-rag models fetch {QWEN_05B}" in (off.line or "")
    # offline: one line says so and how; the model here serves
    away = fetch_plan(True, better, False, offline)
    assert away.model is None and "offline" in (away.line or "") and QWEN_05B in (away.line or "")


def test_the_environment_turns_the_demo_fetch_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAR_DEMO_FETCH", "0")  # what tests/conftest.py sets for the whole suite
    assert demo_args().no_fetch  # type: ignore[attr-defined]
    monkeypatch.delenv("LAR_DEMO_FETCH")
    assert not demo_args().no_fetch and demo_args("--no-fetch").no_fetch  # type: ignore[attr-defined]


def test_the_demo_fetches_the_better_model_at_no_prompt(monkeypatch: pytest.MonkeyPatch, tmp_path: object,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from lookahead_rag.services import demo

    planted(monkeypatch, {DEFAULT_MODEL})
    monkeypatch.delenv("LAR_DEMO_FETCH", raising=False)
    fetched: list[str] = []
    monkeypatch.setattr(demo, "fetch", lambda name, dtype, progress: fetched.append(name))  # never downloads
    settings = demo.demo_settings(str(tmp_path), demo_args())
    assert settings.model.name == DEFAULT_MODEL
    # offline: one line, nothing fetched
    assert not demo.fetch_better(settings, demo_args(), online=lambda: False) and fetched == []
    assert "offline" in capsys.readouterr().out
    # online, no terminal needed: the 0.5B is fetched
    assert demo.fetch_better(settings, demo_args(), online=lambda: True) and fetched == [QWEN_05B]
    # a model named on the command line: nothing fetched
    named = demo.demo_settings(str(tmp_path), demo_args("--model", DEFAULT_MODEL))
    assert not demo.fetch_better(named, demo_args("--model", DEFAULT_MODEL), online=lambda: True)
    assert fetched == [QWEN_05B]


def test_models_list_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    from lookahead_rag.services.models_cli import auto_line

    planted(monkeypatch, {DEFAULT_MODEL, QWEN_05B, QWEN_15B})
    line = auto_line(ModelSettings(name=AUTO))
    assert line.startswith(QWEN_05B) and "tok/s" in line and f"{QWEN_15B}: ~" in line
