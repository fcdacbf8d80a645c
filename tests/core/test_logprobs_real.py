"""The real SmolLM2-135M-Instruct (fp32, CPU): logprobs of a lookahead run, trees accepting several tokens a
step, equal those of transformers' plain greedy decoding of the same prompt (its raw logits, step by step)."""

from __future__ import annotations

import inspect
import json

import pytest
from lookahead_core import DecodingConfig, DraftMode
from lookahead_core.engine.decoder import LookaheadDecoder
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tests.core.test_logprobs import assert_logprobs_equal, plain_logits

pytestmark = pytest.mark.slow

MAX_NEW = 40  # tokens generated
TOP = 5  # top_logprobs asked
DOC_CHARS = 400  # the document the answer copies from


def copy_prompt(tok: PreTrainedTokenizerBase) -> list[int]:
    """A chat prompt whose answer copies its document: the prompt's trie drafts accept long spans."""
    doc = inspect.cleandoc(json.dumps.__doc__ or "")[:DOC_CHARS]
    messages = [{"role": "user", "content": f"Repeat this text exactly, word for word:\n\n{doc}"}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids if isinstance(ids, list) else ids["input_ids"])


@pytest.mark.parametrize("mode", [DraftMode.HIERARCHICAL, DraftMode.PARALLEL])
def test_real_model_logprobs_equal_plain_decoding(
    smollm: tuple[PreTrainedModel, PreTrainedTokenizerBase], mode: DraftMode
) -> None:
    model, tok = smollm
    prompt = copy_prompt(tok)
    tokens, logits = plain_logits(model, prompt, MAX_NEW)
    config = DecodingConfig(mode=mode, max_new_tokens=MAX_NEW, logprobs=True, top_logprobs=TOP)
    dec = LookaheadDecoder(model, tok, config)
    req, _ = dec.request(prompt)
    for _ in dec.steps(req):
        pass
    # the same tokens as plain decoding, several accepted in one step
    assert req.output == tokens[: len(req.output)] and req.stats.finish_reason in ("eos", "length")
    assert max(req.stats.accepted_per_step) > 1
    # each token's logprob and its top-5: plain decoding's log_softmax of the same position's logits
    assert_logprobs_equal(req.logprobs, req.output, logits[: len(req.output)], TOP)
