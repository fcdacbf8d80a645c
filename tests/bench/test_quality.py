"""lookahead_rag.bench.quality.answer_logprob: the target's log-likelihood of an answer, the measure of mjsd's cost."""

from __future__ import annotations

import pytest
import torch

from lookahead_rag.bench.quality import answer_logprob
from tests.core.helpers import tiny_model


def stepwise(model: torch.nn.Module, prompt: list[int], answer: list[int]) -> float:
    total = 0.0
    for i, token in enumerate(answer):  # one fresh forward per token: the definition, slowly
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([prompt + answer[:i]])).logits[0, -1]  # [vocab]
        total += float(logits.float().log_softmax(-1)[token])
    return total


def test_answer_logprob_is_the_sum_of_each_tokens_log_probability() -> None:
    model = tiny_model("llama")
    prompt, answer = [5, 9, 14, 3], [7, 7, 21, 100]
    assert answer_logprob(model, prompt, answer) == pytest.approx(stepwise(model, prompt, answer), abs=1e-4)
    assert answer_logprob(model, prompt, []) == 0.0  # no answer: nothing to score


def test_greedy_tokens_score_higher_than_any_other_first_token() -> None:
    # the greedy first token is the most likely one: replacing it must lower the score
    model = tiny_model("llama")
    prompt = [5, 9, 14, 3]
    with torch.inference_mode():
        best = int(model(input_ids=torch.tensor([prompt])).logits[0, -1].argmax())
    other = (best + 1) % model.config.vocab_size
    assert answer_logprob(model, prompt, [best]) > answer_logprob(model, prompt, [other])
