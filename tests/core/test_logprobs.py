"""Logprobs of the emitted tokens (DecodingConfig.logprobs) equal plain decoding's, whatever the drafts.

The reference is transformers' own greedy ``generate`` with ``output_logits=True``: one token per forward,
its raw logits at every step; our engine verifies drafted trees that accept several tokens a step, and the
logprob of each emitted token (and the top-N alternatives) must be the log_softmax of the same logits.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
import torch
from lookahead_core import DecodingConfig, DraftMode
from lookahead_core.config import MAX_TOP_LOGPROBS
from lookahead_core.engine.decoder import LookaheadDecoder
from lookahead_core.engine.request import ServeRequest
from lookahead_core.sampling import generate_sampled
from lookahead_core.sampling.logprobs import TokenLogprob
from transformers import PreTrainedModel

from tests.core.helpers import StubTokenizer, eos_as, forking_drafter, greedy, oracle_drafter, random_prompt, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

TOL = 1e-4  # absolute tolerance on a logprob (fp32 forwards of different shapes round differently)
TOP = 5  # top_logprobs asked in these tests
MAX_NEW = 24  # tokens per run
SEEDS = range(4)  # random prompts per test


def plain_logits(model: PreTrainedModel, prompt: Sequence[int], max_new: int) -> tuple[list[int], torch.Tensor]:
    """Plain greedy decoding (transformers' generate): its tokens and each step's raw logits [n, vocab]."""
    ids = torch.tensor([list(prompt)], dtype=torch.long)  # [1, prompt]
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new,
                             pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    tokens = out.sequences[0, len(prompt):].tolist()
    return tokens, torch.cat(list(out.logits)).float()  # [n, vocab]


def run(model: PreTrainedModel, prompt: Sequence[int], config: DecodingConfig, drafter: object = None
        ) -> ServeRequest:
    """One request through the engine (batch-1 decoder), to the end."""
    dec = LookaheadDecoder(model, StubTokenizer(), config, kernels="stock")  # type: ignore[arg-type]
    req, _ = dec.request(prompt, config=config, drafter=drafter)  # type: ignore[arg-type]
    for _ in dec.steps(req):
        pass
    return req


def assert_logprobs_equal(got: Sequence[TokenLogprob], tokens: Sequence[int], logits: torch.Tensor,
                          top: int) -> None:
    """``got`` holds, for each of ``tokens``, its logprob and the top-``top`` of log_softmax(``logits`` row)."""
    logp = torch.log_softmax(logits, dim=-1)  # [n, vocab]
    assert [g.token_id for g in got] == list(tokens)
    for i, g in enumerate(got):
        assert abs(g.logprob - logp[i, tokens[i]].item()) < TOL, (i, g.logprob, logp[i, tokens[i]].item())
        want_values, want_ids = logp[i].topk(top)
        assert len(g.top) == top
        # values equal in order; ids equal wherever the value is not tied with a neighbour (within TOL)
        assert all(abs(v - w) < TOL for (_, v), w in zip(g.top, want_values.tolist(), strict=True))
        for k, ((tid, v), wid) in enumerate(zip(g.top, want_ids.tolist(), strict=True)):
            near = ((logp[i] - v).abs() < TOL).nonzero()[:, 0].tolist()  # ids tied with it
            assert tid == wid or tid in near, (i, k, tid, wid)
        assert list(g.top) == sorted(g.top, key=lambda p: -p[1])  # most likely first


@pytest.mark.parametrize("seed", SEEDS)
def test_greedy_logprobs_with_accepted_drafts_equal_plain(seed: int) -> None:
    model = tiny_model("llama")
    prompt = random_prompt(random.Random(seed))
    with eos_as(model, None):
        tokens, logits = plain_logits(model, prompt, MAX_NEW)
        # the oracle's drafts are all accepted: several tokens a step, each with its own row's logprob
        config = DecodingConfig(max_new_tokens=MAX_NEW, decoding_length=6, logprobs=True, top_logprobs=TOP)
        req = run(model, prompt, config, oracle_drafter(len(prompt), tokens))
    assert req.output == tokens
    assert max(req.stats.accepted_per_step) > 1  # the trees accepted several tokens in one step
    assert_logprobs_equal(req.logprobs, tokens, logits, TOP)


def test_forking_trees_give_the_accepted_branch_rows() -> None:
    # a tree with a wrong sibling beside the true chain: each token's logprob comes from its own path's row
    model = tiny_model("llama")
    prompt = random_prompt(random.Random(7))
    with eos_as(model, None):
        tokens, logits = plain_logits(model, prompt, MAX_NEW)
        config = DecodingConfig(max_new_tokens=MAX_NEW, decoding_length=8, logprobs=True, top_logprobs=TOP)
        req = run(model, prompt, config, forking_drafter(len(prompt), tokens))
    assert req.output == tokens and max(req.stats.accepted_per_step) > 1
    assert_logprobs_equal(req.logprobs, tokens, logits, TOP)


def test_trie_drafts_and_a_length_cut_keep_one_logprob_per_token() -> None:
    # the request's own trie (hierarchical mode) drafts; a step cut at max_new_tokens keeps only its tokens' logprobs
    model = tiny_model("llama")
    prompt = random_prompt(random.Random(3)) * 2
    with eos_as(model, None):
        tokens, logits = plain_logits(model, prompt, MAX_NEW - 1)
        config = DecodingConfig(mode=DraftMode.HIERARCHICAL, max_new_tokens=MAX_NEW - 1, logprobs=True)
        req = run(model, prompt, config)
    assert req.output == tokens
    assert_logprobs_equal(req.logprobs, tokens, logits, 0)
    assert all(g.top == () for g in req.logprobs)  # top_logprobs 0: no alternatives


def test_sampled_logprobs_are_the_raw_distribution_not_the_processed_one() -> None:
    # temperature and top_k change which token is drawn, never the logprob reported for it
    model = tiny_model("llama")
    prompt = random_prompt(random.Random(11))
    config = DecodingConfig(max_new_tokens=MAX_NEW, temperature=0.7, top_k=5, seed=1234, logprobs=True,
                            top_logprobs=TOP)
    with eos_as(model, None):
        tokens = generate_sampled(model, StubTokenizer(), prompt, config)  # type: ignore[arg-type]
        req = run(model, prompt, config, oracle_drafter(len(prompt), tokens))
        with torch.inference_mode():
            full = model(torch.tensor([prompt + tokens])).logits[0].float()  # [prompt + n, vocab]
    assert req.output == tokens
    assert_logprobs_equal(req.logprobs, tokens, full[len(prompt) - 1 : -1], TOP)


def test_a_request_without_logprobs_pays_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    # no logprobs asked: the log_softmax is never computed and nothing is recorded
    import lookahead_core.engine.active as active

    def refuse(*_args: object) -> list[TokenLogprob]:
        raise AssertionError("token_logprobs ran for a request that did not ask")

    monkeypatch.setattr(active, "token_logprobs", refuse)
    model = tiny_model("llama")
    prompt = random_prompt(random.Random(5))
    with eos_as(model, None):
        req = run(model, prompt, DecodingConfig(max_new_tokens=8))
    assert req.output == greedy(model, prompt, 8) and req.logprobs == []


@pytest.mark.parametrize(("fields", "words"), [
    ({"logprobs": True, "top_logprobs": MAX_TOP_LOGPROBS + 1}, "top_logprobs must be in 0..20"),  # OpenAI's bound
    ({"logprobs": True, "top_logprobs": -1}, "top_logprobs must be in 0..20"),  # negative
    ({"top_logprobs": 3}, "top_logprobs needs logprobs"),  # alternatives without the logprobs themselves
])
def test_config_refuses_bad_top_logprobs(fields: dict[str, object], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        DecodingConfig(**fields)  # type: ignore[arg-type]
