"""Shared helpers for the decoding-core tests (tests/core/).

Tiny random models of two families, a stub tokenizer, greedy references, brute-force oracles
for the trie, hand-built draft trees and adversarial drafters (fixtures are in conftest.py).
Nothing here reads ../shared.
"""

from __future__ import annotations

import copy
import functools
import os
import random
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from lookahead_core.config import DecodingConfig, DraftMode
from lookahead_core.drafting.draft import Drafter, DraftTree
from lookahead_core.drafting.trie import Node, TokenTrie
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedModel, Qwen2Config

if TYPE_CHECKING:
    from lookahead_core.engine.request import ServeRequest
    from lookahead_core.engine.scheduler import StepScheduler

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TINY_VOCAB = 256  # vocabulary of the tiny random models
FAMILIES = ("llama", "qwen2")  # two model families with different attention code
ATTNS = ("sdpa", "eager")  # sdpa takes the float mask as is; eager adds it to the scores
MODES = ("hierarchical", "parallel", "llma", "none")
WAIT_S = 120.0  # a scheduled request that never finishes fails the test instead of hanging it


# ---- trie oracles ------------------------------------------------------------------------------
def ngram_counts(seqs: Sequence[Sequence[int]], max_n: int) -> Counter[tuple[int, ...]]:
    """Brute force: occurrences of every n-gram (1 <= n <= max_n) over all sequences."""
    counts: Counter[tuple[int, ...]] = Counter()
    for seq in seqs:
        for start in range(len(seq)):
            for n in range(1, max_n + 1):
                if start + n <= len(seq):
                    counts[tuple(seq[start : start + n])] += 1
    return counts


def trie_table(trie: TokenTrie) -> dict[tuple[int, ...], tuple[int, int]]:
    """Every node of the trie (root excluded) by path: (freq, pfreq)."""
    out: dict[tuple[int, ...], tuple[int, int]] = {}
    stack: list[tuple[tuple[int, ...], Node]] = [((), trie.root)]
    while stack:
        path, node = stack.pop()
        for token, child in node.children.items():
            out[(*path, token)] = (child.freq, child.pfreq)
            stack.append(((*path, token), child))
    return out


def freq_table(trie: TokenTrie) -> dict[tuple[int, ...], int]:
    """Output counts of the nodes that have any."""
    return {path: f for path, (f, _) in trie_table(trie).items() if f}


def pfreq_table(trie: TokenTrie) -> dict[tuple[int, ...], int]:
    """Prompt counts of the nodes that have any."""
    return {path: p for path, (_, p) in trie_table(trie).items() if p}


# ---- draft trees -------------------------------------------------------------------------------
def tree_from(spec: Sequence[tuple[int, int]]) -> DraftTree:
    """A DraftTree from (parent, token) pairs in flattened order, never merged."""
    tree = DraftTree()
    for parent, token in spec:
        tree.add(parent, token, merge=False)
    return tree


def node_paths(tree: DraftTree) -> list[list[int]]:
    """For every node 1..len(tree), its token path from the root (the root's token excluded)."""
    paths: list[list[int]] = [[]]  # paths[0]: the root
    for parent, token in zip(tree.parents, tree.tokens, strict=True):
        paths.append([*paths[parent], token])  # parents precede children
    return paths[1:]


def check_tree_shape(tree: DraftTree) -> None:
    """Structural invariants of any DraftTree: parents precede children, depths consistent."""
    assert len(tree.tokens) == len(tree.parents) == len(tree.depths)
    for i, (parent, depth) in enumerate(zip(tree.parents, tree.depths, strict=True), start=1):
        assert 0 <= parent < i, f"node {i} has parent {parent} that does not precede it"
        assert depth == (1 if parent == 0 else tree.depths[parent - 1] + 1)


def draft_cap(config: DecodingConfig, budget: int) -> int:
    """Most draft tokens retrieve_draft may return for ``budget``.

    Hierarchical trees (draft-model's trie part too) may grow confident nodes past the budget, up to
    ``max_decoding_length`` (read with getattr: older configs have no such field and never extend).
    """
    if config.mode in (DraftMode.HIERARCHICAL, DraftMode.DRAFT_MODEL):
        return max(budget, getattr(config, "max_decoding_length", budget))
    return budget


# ---- tiny models -------------------------------------------------------------------------------
def _tiny_config(family: str, vocab: int) -> Any:
    common: dict[str, Any] = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,  # grouped-query attention: the K/V expansion path is exercised
        "vocab_size": vocab,
        "max_position_embeddings": 1024,
    }
    if family == "llama":
        return LlamaConfig(**common)
    if family == "qwen2":
        return Qwen2Config(**common)
    raise ValueError(family)


@functools.cache
def _base_model(family: str, vocab: int, seed: int) -> PreTrainedModel:
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(_tiny_config(family, vocab), attn_implementation="sdpa")
    return model.float().eval()


@functools.cache
def tiny_model(family: str, attn: str = "sdpa", vocab: int = TINY_VOCAB, seed: int = 0) -> PreTrainedModel:
    """A tiny randomly initialised model (fp32, eval); same weights for both attention kinds.

    Cached per process: callers that change ``generation_config`` must restore it (see ``eos_as``).
    """
    base = _base_model(family, vocab, seed)
    if attn == "sdpa":
        return base
    model = copy.deepcopy(base)
    model.set_attn_implementation(attn)
    return model.eval()


@functools.cache
def tok() -> Any:
    """The real SmolLM2 tokenizer (converted once from the bundled GGUF)."""
    from lookahead_core.models import load_tokenizer

    return load_tokenizer()


def text_model() -> PreTrainedModel:
    """Tiny random llama over the real tokenizer's vocabulary (EOS 2 = <|im_end|>)."""
    return tiny_model("llama", vocab=len(tok()))


@contextmanager
def eos_as(model: PreTrainedModel, eos: int | None) -> Iterator[None]:
    """Temporarily set the model's EOS (None: fixed-length runs)."""
    old = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = eos
    try:
        yield
    finally:
        model.generation_config.eos_token_id = old


@contextmanager
def generation_config_as(model: PreTrainedModel, **fields: Any) -> Iterator[None]:
    """Temporarily set fields of the model's generation_config (repetition_penalty, suppress_tokens, ...)."""
    g = model.generation_config
    old = {name: getattr(g, name) for name in fields}
    for name, value in fields.items():
        setattr(g, name, value)
    try:
        yield
    finally:
        for name, value in old.items():
            setattr(g, name, value)


class StubTokenizer:
    """The two things the decoder needs from a tokenizer, for tiny-vocabulary models."""

    eos_token_id: int | None = None

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(f"<{int(i)}>" for i in ids)


def greedy(model: PreTrainedModel, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
    """Stock transformers greedy decoding: the reference every decoder output must equal."""
    ids = torch.tensor([list(prompt)], dtype=torch.long)  # [1, prompt]
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            pad_token_id=0,
        )  # out: [1, prompt + new]
    return out[0, len(prompt) :].tolist()


def random_prompt(rng: random.Random, vocab: int = TINY_VOCAB, low: int = 3) -> list[int]:
    """A prompt of 16..60 tokens built from a few repeated phrases plus noise (so drafts match)."""
    n_phrases = rng.randint(2, 4)
    phrases = [[rng.randrange(low, vocab) for _ in range(rng.randint(3, 8))] for _ in range(n_phrases)]
    out: list[int] = []
    target = rng.randint(16, 60)
    while len(out) < target:
        if rng.random() < 0.75:
            out.extend(rng.choice(phrases))
        else:
            out.append(rng.randrange(low, vocab))
    return out


# ---- adversarial drafters (lookahead_core.drafting.draft.Drafter: LookaheadDecoder.generate's drafter=) --------


def _position(context: Sequence[int], prompt_len: int) -> int:
    return len(context) - prompt_len  # tokens already emitted


def wrong_token(tok: int, vocab: int = TINY_VOCAB, shift: int = 1) -> int:
    """A token that is certainly not ``tok``."""
    return (tok + shift) % vocab


def oracle_drafter(prompt_len: int, truth: Sequence[int]) -> Drafter:
    """Drafts the true greedy continuation (everything is accepted), respecting budget and depth."""

    def draft(context: list[int], budget: int, max_depth: int) -> DraftTree:
        t = _position(context, prompt_len)
        tree = DraftTree()
        tree.add_chain(list(truth[t : t + min(budget, max_depth)]), merge=False)
        return tree

    return draft


def wrong_drafter(prompt_len: int, truth: Sequence[int], vocab: int = TINY_VOCAB) -> Drafter:
    """Only wrong tokens: two wrong chains below the root, nothing can be accepted."""

    def draft(context: list[int], budget: int, max_depth: int) -> DraftTree:
        t = _position(context, prompt_len)
        tree = DraftTree()
        for shift in (1, 2):
            parent = 0
            for d in range(min(max_depth, budget // 2)):
                want = truth[t + d] if t + d < len(truth) else 0
                parent = tree.add(parent, wrong_token(want, vocab, shift), merge=False)
        return tree

    return draft


def forking_drafter(prompt_len: int, truth: Sequence[int], vocab: int = TINY_VOCAB) -> Drafter:
    """At every depth of the true path a wrong sibling (with a wrong child) comes first.

    The accepted path is then every other/third node of the flattened tree: its KV entries are not
    contiguous.
    """

    def draft(context: list[int], budget: int, max_depth: int) -> DraftTree:
        t = _position(context, prompt_len)
        tree = DraftTree()
        parent = 0
        for d in range(max_depth):
            if t + d >= len(truth) or len(tree) + 3 > budget:
                break
            wrong = tree.add(parent, wrong_token(truth[t + d], vocab), merge=False)
            tree.add(wrong, truth[t + d], merge=False)  # right token under a wrong parent
            parent = tree.add(parent, truth[t + d], merge=False)
        return tree

    return draft


def duplicate_chains_drafter(prompt_len: int, truth: Sequence[int], vocab: int = TINY_VOCAB) -> Drafter:
    """Parallel duplicate chains: the first copy goes wrong after 2 tokens, the second copy is right.

    The accepted path runs through the second chain (flattened after the first): non-contiguous.
    """

    def draft(context: list[int], budget: int, max_depth: int) -> DraftTree:
        t = _position(context, prompt_len)
        good = list(truth[t : t + min(max_depth, budget // 2)])
        tree = DraftTree()
        if len(good) >= 3:
            bad = [*good[:2], wrong_token(good[2], vocab), *good[3:]]
            tree.add_chain(bad, merge=False)
        tree.add_chain(good, merge=False)
        return tree

    return draft


def eos_drafter(prompt_len: int, truth: Sequence[int], eos: int, vocab: int = TINY_VOCAB) -> Drafter:
    """The true continuation (which runs past EOS), plus a branch with EOS at a wrong place.

    ``truth`` is the fixed-length greedy output, so the oracle branch holds EOS where greedy emits it
    and keeps going after it: the decoder must stop at EOS.
    """

    def draft(context: list[int], budget: int, max_depth: int) -> DraftTree:
        t = _position(context, prompt_len)
        tree = DraftTree()
        if max_depth >= 2 and t < len(truth) and truth[t] != eos:
            tree.add_chain([truth[t], eos], merge=False)  # EOS where greedy does not emit it
        tree.add_chain(list(truth[t : t + min(max_depth, max(1, budget - 2))]), merge=False)
        return tree

    return draft


# ---- scheduler clients ---------------------------------------------------------------------------
@dataclass
class Client:
    """Collects what the scheduler hands one request (called from the scheduler thread)."""

    streamed: list[int] = field(default_factory=list)
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)
    gate: threading.Event | None = None  # when set up, the first tokens wait for it (holds the step)

    def on_tokens(self, _req: ServeRequest, ids: list[int]) -> None:
        self.streamed.extend(ids)
        if self.gate is not None:
            self.gate.wait(WAIT_S)

    def on_done(self, _req: ServeRequest, exc: BaseException | None) -> None:
        self.error = exc
        self.done.set()



def run_all(sched: StepScheduler, reqs: list[ServeRequest], clients: list[Client]) -> None:
    for req in reqs:
        sched.submit(req)
    for client in clients:
        assert client.done.wait(WAIT_S)


def busy_engine(model: PreTrainedModel, tokenizer: Any, **config: Any) -> StepScheduler:
    """A step scheduler for the real-model tests: 8 requests running at once, prompts prefilled in 96-token
    chunks, ``config`` the other ``SchedulerConfig`` fields."""
    from lookahead_core.engine.scheduler import SchedulerConfig, StepScheduler

    return StepScheduler(model, tokenizer, SchedulerConfig(max_running=8, prefill_chunk=96, **config))


def serve_at_once(sched: StepScheduler, prompts: Sequence[Sequence[int]], configs: Sequence[DecodingConfig],
                  timeout: float = 600.0) -> list[ServeRequest]:
    """Submit every (prompt, config) to a started ``sched`` at once, wait for all, close it; each request
    ended without an error."""
    from lookahead_core.engine.request import ServeRequest  # torch: imported only by the tests that serve
    done = threading.Semaphore(0)
    reqs = [ServeRequest(p, cfg, tenant="t", on_done=lambda _r, _e: done.release())
            for p, cfg in zip(prompts, configs, strict=True)]
    try:
        for req in reqs:
            sched.submit(req)
        for _ in reqs:
            assert done.acquire(timeout=timeout)
    finally:
        sched.close()
    assert [r.error for r in reqs] == [None] * len(reqs)
    return reqs


def serve_all_greedy(sched: StepScheduler, model: PreTrainedModel, prompts: Sequence[Sequence[int]],
                     configs: Sequence[DecodingConfig]) -> list[ServeRequest]:
    """Serve every (prompt, config) at once and check each streamed output is plain greedy's."""
    from lookahead_core.engine.request import ServeRequest  # torch: imported only by the tests that serve
    clients = [Client() for _ in prompts]
    reqs = [ServeRequest(p, cfg, on_tokens=c.on_tokens, on_done=c.on_done)
            for p, cfg, c in zip(prompts, configs, clients, strict=True)]
    run_all(sched, reqs, clients)
    for p, r, c in zip(prompts, reqs, clients, strict=True):
        assert c.error is None
        assert c.streamed == r.output == greedy(model, p, r.config.max_new_tokens)
    return reqs


def serve_mixed_modes(sched: StepScheduler, prompts: Sequence[Sequence[int]], max_new: int) -> list[ServeRequest]:
    """Serve ``prompts`` at once on a not yet started ``sched``, request j in mode MODES[j % len(MODES)];
    the requests, after checking that some forward carried more than one of them."""
    configs = [DecodingConfig(mode=DraftMode(MODES[j % len(MODES)]), max_new_tokens=max_new)
               for j in range(len(prompts))]
    reqs = serve_at_once(sched.start(), prompts, configs)
    assert max(max(r.stats.batch_sizes) for r in reqs) > 1
    return reqs
