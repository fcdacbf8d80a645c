"""The real Qwen2.5-Coder-0.5B-Instruct (qwen2: biased q/k/v, untied 151,936-row lm_head): every mode and a
batched scheduler give exactly stock greedy's tokens.

The model is never fetched here: these tests run when `lookahead-rag models fetch qwen2.5-coder-0.5b-instruct`
has put it in the cache, and skip with that command as the reason otherwise.
"""

from __future__ import annotations

import os

import pytest
from lookahead_core import DecodingConfig, DraftMode
from lookahead_core.catalog import converted_dir, gguf_of
from lookahead_core.engine.decoder import LookaheadDecoder
from lookahead_core.engine.scheduler import SchedulerConfig, StepScheduler
from lookahead_core.models import load_model
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tests.core.helpers import MODES, greedy, serve_mixed_modes
from tests.core.test_core_real_model import grounded_prompts

QWEN = "qwen2.5-coder-0.5b-instruct"  # the built-in under test
MAX_NEW = 24  # tokens per answer (a 0.5B model on 2 cores: keep CI time modest)
PROMPTS = 4  # grounded prompts of test_core_real_model used here


def _cached() -> bool:
    try:
        gguf = gguf_of(QWEN)
    except FileNotFoundError:
        return False
    return gguf is not None and (converted_dir(gguf) / "config.json").exists()


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not _cached(), reason=f"{QWEN} is not in the model cache: `lookahead-rag models fetch {QWEN}`"),
]


@pytest.fixture(scope="module")
def qwen() -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return load_model(QWEN)


@pytest.fixture(scope="module")
def cases(qwen: tuple[PreTrainedModel, PreTrainedTokenizerBase]) -> list[tuple[list[int], list[int]]]:
    """(prompt, stock greedy's answer) for each grounded prompt used here."""
    return [(p, greedy(qwen[0], p, MAX_NEW)) for p in grounded_prompts(qwen[1])[:PROMPTS]]


def test_qwen_is_the_untied_biased_family(qwen: tuple[PreTrainedModel, PreTrainedTokenizerBase]) -> None:
    # what makes it differ from llama: biases on q/k/v and an lm_head of its own
    model = qwen[0]
    attn = model.model.layers[0].self_attn
    assert model.config.model_type == "qwen2"
    assert attn.q_proj.bias is not None and attn.o_proj.bias is None
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()


@pytest.mark.parametrize("mode", MODES)
def test_qwen_every_mode_equals_greedy(
    mode: str, qwen: tuple[PreTrainedModel, PreTrainedTokenizerBase], cases: list[tuple[list[int], list[int]]]
) -> None:
    # each prompt alone through the engine at one request
    dec = LookaheadDecoder(qwen[0], qwen[1], DecodingConfig(mode=DraftMode(mode), max_new_tokens=MAX_NEW))
    for i, (prompt, want) in enumerate(cases):
        assert dec.generate(prompt).output_ids == want, f"prompt {i}"


def test_qwen_batched_scheduler_equals_greedy(
    qwen: tuple[PreTrainedModel, PreTrainedTokenizerBase], cases: list[tuple[list[int], list[int]]]
) -> None:
    # every prompt at once (and one again: a prefix-cache hit), modes mixed, chunked prefill
    sched = StepScheduler(qwen[0], qwen[1], SchedulerConfig(max_running=4, prefill_chunk=96,
                                                            calibration_counts=(1, 8), calibration_repeats=1))
    order = [*range(len(cases)), 1]
    reqs = serve_mixed_modes(sched, [cases[i][0] for i in order], MAX_NEW)
    assert [r.output for r in reqs] == [cases[i][1] for i in order]
    assert reqs[-1].stats.prefix_hit_tokens == len(cases[1][0]) - 1
