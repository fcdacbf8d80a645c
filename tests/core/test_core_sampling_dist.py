"""Lookahead sampling draws from the model's exact distribution (chi-square over 20,000 seeds).

A tiny 8-token model with a peaked distribution and a fixed prompt: the first 3 tokens of a sampled run
(temperature 0.9, top-k 6) have an exact distribution, the product of the processed next-token
probabilities. Logits depend only on the prefix, so they are computed once for every prefix (585 rows);
each seed then runs the lookahead loop itself (draft a tree, choose after every node with the request's
``TokenChooser``, ``accept_longest``, emit) on those cached rows. The loop matches the real decoder and
the reference on a subset of seeds, its empirical distribution matches the exact one with a natural
and with a deliberately biased drafter, and a broken verifier that always accepts the draft fails.
"""

from __future__ import annotations

import copy
import functools
import itertools
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace

import pytest
import torch
from lookahead_core.config import DecodingConfig
from lookahead_core.drafting.draft import DraftTree
from lookahead_core.drafting.verify import accept_longest
from lookahead_core.engine.decoder import LookaheadDecoder
from lookahead_core.sampling import TokenChooser, build_processors, generate_sampled
from transformers import LogitsProcessorList, PreTrainedModel

from tests.core.helpers import StubTokenizer, eos_as, node_paths, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 8  # tokens of the model: 512 possible 3-token outputs
PROMPT = [1, 2, 3, 4, 5]
N_TOKENS = 3  # output tokens whose joint distribution is checked
N_SEEDS = 20_000
N_BROKEN = 5_000  # seeds for the broken verifier: it fails by a wide margin (p ~ 0), no need for more
LOGIT_SCALE = 12.0  # sharpens the random model's near-uniform distribution (a few likely tokens, a long tail)
CONFIG = DecodingConfig(temperature=0.9, top_k=6, max_new_tokens=N_TOKENS, decoding_length=8)
MIN_EXPECTED = 5.0  # chi-square cells expecting fewer draws are merged into one
P_MIN = 1e-3  # the test fails below this p-value

Tree = Callable[[Sequence[int]], DraftTree]  # output so far -> this step's draft
Accept = Callable[[Sequence[int], Sequence[int], Sequence[int]], list[int]]


@functools.cache
def model() -> PreTrainedModel:
    m = copy.deepcopy(tiny_model("llama", vocab=VOCAB))
    with torch.no_grad():
        m.lm_head.weight.mul_(LOGIT_SCALE)
    m.generation_config.eos_token_id = None  # fixed-length runs
    return m


@functools.cache
def prefix_logits() -> dict[tuple[int, ...], torch.Tensor]:
    """Logits [VOCAB] after the prompt and every output prefix of 0..N_TOKENS tokens (one forward per length)."""
    out: dict[tuple[int, ...], torch.Tensor] = {}
    for n in range(N_TOKENS + 1):
        prefixes = list(itertools.product(range(VOCAB), repeat=n))
        ids = torch.tensor([PROMPT + list(p) for p in prefixes])  # [VOCAB^n, prompt + n]
        with torch.inference_mode():
            logits = model()(input_ids=ids).logits[:, -1]  # [VOCAB^n, VOCAB]
        out.update(zip(prefixes, logits, strict=True))
    return out


@functools.cache
def processors() -> LogitsProcessorList:
    """CONFIG's processors on the model: temperature and top-k."""
    return build_processors(model().generation_config, CONFIG, len(PROMPT))


def processed_probs(row: torch.Tensor) -> torch.Tensor:
    """The exact next-token distribution [VOCAB] under CONFIG: temperature, then top-k, then softmax."""
    scaled = row.double() / CONFIG.temperature
    kth = scaled.topk(CONFIG.top_k).values[-1]
    return scaled.masked_fill(scaled < kth, -math.inf).softmax(-1)


@functools.cache
def exact() -> dict[tuple[int, ...], float]:
    """P(first N_TOKENS tokens) for every sequence: the product of the processed conditionals."""
    logits = prefix_logits()
    probs = {p: processed_probs(row) for p, row in logits.items() if len(p) < N_TOKENS}
    return {seq: math.prod(float(probs[seq[:i]][seq[i]]) for i in range(N_TOKENS))
            for seq in itertools.product(range(VOCAB), repeat=N_TOKENS)}


# ---- the lookahead loop on cached logits ---------------------------------------------------------------
def run_seed(seed: int, draft: Tree, accept: Accept = accept_longest) -> tuple[int, ...]:
    """The first N_TOKENS tokens of one seed's lookahead run (drafts from ``draft``, verified by ``accept``)."""
    logits = prefix_logits()
    chooser = TokenChooser(processors(), seed)  # for_request's, built once (processors are stateless)
    out = chooser.choose(logits[()][None], PROMPT, position=0)  # the prefill's token
    while len(out) < N_TOKENS:
        tree = draft(out)
        rows = torch.stack([logits[tuple(out + path)] for path in [[], *node_paths(tree)]])  # [q, VOCAB]
        predicted = chooser.choose(rows, PROMPT + out, tree.parents, tree.tokens, len(out))
        path = accept(tree.tokens, tree.parents, predicted)
        out += [tree.tokens[i - 1] for i in path[1:]] + [predicted[path[-1]]]
    return tuple(out[:N_TOKENS])


def most_likely_chain(out: Sequence[int], length: int) -> list[int]:
    chain: list[int] = []
    for _ in range(length):
        chain.append(int(prefix_logits()[tuple(out) + tuple(chain)].argmax()))
    return chain


def natural_tree(out: Sequence[int]) -> DraftTree:
    """What a good drafter proposes: the most likely chain, and the runner-up first token with its best next."""
    depth = N_TOKENS - len(out)  # nodes up to the last checked position, never past the cached prefixes
    tree = DraftTree()
    tree.add_chain(most_likely_chain(out, depth), merge=True)
    second = int(prefix_logits()[tuple(out)].topk(2).indices[1])
    tree.add_chain([second, *most_likely_chain([*out, second], depth - 1)], merge=True)
    return tree


def biased_tree(out: Sequence[int]) -> DraftTree:
    """A deliberately lopsided drafter: the most likely chain first, then chains of tail tokens 7 and 6."""
    depth = N_TOKENS - len(out)
    tree = DraftTree()
    tree.add_chain(most_likely_chain(out, depth), merge=False)
    tree.add_chain([VOCAB - 1] * depth, merge=False)
    tree.add_chain([VOCAB - 2, VOCAB - 1][:depth], merge=False)
    return tree


def accept_first_chain(tokens: Sequence[int], parents: Sequence[int], predicted: Sequence[int]) -> list[int]:
    """A broken verifier: it takes the first chain of the draft whatever the model chose."""
    path = [0]
    for node, parent in enumerate(parents, start=1):
        if parent == path[-1]:
            path.append(node)
    return path


# ---- the check -------------------------------------------------------------------------------------
def chi_square_p(samples: Counter[tuple[int, ...]], n: int) -> float:
    """p-value of the samples under ``exact()``; a sample of probability 0 fails at once (p = 0)."""
    probs = exact()
    if any(probs[seq] == 0.0 for seq in samples):
        return 0.0
    cells = sorted(probs, key=probs.__getitem__, reverse=True)
    big = [c for c in cells if probs[c] * n >= MIN_EXPECTED]
    rest_p = 1.0 - sum(probs[c] for c in big)
    observed = [samples[c] for c in big] + [n - sum(samples[c] for c in big)]
    expected = [probs[c] * n for c in big] + [rest_p * n]
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True) if e > 0)
    dof = len(observed) - 1
    half = torch.tensor([dof / 2, stat / 2], dtype=torch.float64)
    return float(torch.special.gammaincc(half[0], half[1]))  # the chi-square survival function


def empirical(draft: Tree, first_seed: int, n: int, accept: Accept = accept_longest) -> Counter[tuple[int, ...]]:
    """First tokens of ``n`` runs, seeds first_seed, first_seed + 1, ..."""
    return Counter(run_seed(seed, draft, accept) for seed in range(first_seed, first_seed + n))


def test_the_distribution_is_not_trivial() -> None:
    # the check has teeth: many cells carry weight, and top-k leaves some sequences impossible
    probs = exact()
    assert abs(sum(probs.values()) - 1.0) < 1e-9
    assert sum(p * N_SEEDS >= MIN_EXPECTED for p in probs.values()) >= 20
    assert max(probs.values()) < 0.5 and min(probs.values()) == 0.0


@pytest.mark.parametrize("draft", [natural_tree, biased_tree], ids=["natural", "biased"])
def test_the_cached_loop_is_the_real_decoder(draft: Tree) -> None:
    # on 40 seeds the loop above gives the tokens of the real LookaheadDecoder (fed the same drafts) and
    # of the one-token-per-forward reference: the distribution below is the decoder's
    m = model()
    with eos_as(m, None):
        dec = LookaheadDecoder(m, StubTokenizer(), kernels="stock")  # type: ignore[arg-type]

        def drafter(context: list[int], budget: int, max_depth: int) -> DraftTree:
            out = context[len(PROMPT) :]
            return draft(out) if len(out) < N_TOKENS else DraftTree()  # past the checked tokens: no drafts

        for seed in range(40):
            cfg = replace(CONFIG, seed=seed)
            want = run_seed(seed, draft)
            assert tuple(generate_sampled(m, StubTokenizer(), PROMPT, cfg)) == want  # type: ignore[arg-type]
            assert tuple(dec.generate(PROMPT, config=replace(cfg, max_new_tokens=N_TOKENS + 2),
                                      drafter=drafter).output_ids[:N_TOKENS]) == want


@pytest.mark.parametrize(("draft", "first_seed"), [(natural_tree, 0), (biased_tree, 10**6)], ids=["natural", "biased"])
def test_lookahead_sampling_matches_the_exact_distribution(draft: Tree, first_seed: int) -> None:
    # 20,000 seeds (other seeds for each drafter): the first 3 tokens follow the processed distribution
    assert chi_square_p(empirical(draft, first_seed, N_SEEDS), N_SEEDS) > P_MIN


def test_a_verifier_that_always_accepts_fails_the_check() -> None:
    # the same check on a sampler that keeps the (biased) draft instead of verifying it: rejected
    assert chi_square_p(empirical(biased_tree, 10**6, N_BROKEN, accept_first_chain), N_BROKEN) < P_MIN
