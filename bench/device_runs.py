"""The runs the device benchmark (``bench/device.py``) times: plain transformers and the engine, on prompt ids.

Every function takes the model, its tokenizer and prompt id lists, runs one way over all of them and returns the
outputs (token ids after each prompt) with the engine's forward steps where it has them; the caller times it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from lookahead_core import DecodingConfig, TokenTrie
from lookahead_core.engine.request import Phase, ServeRequest
from lookahead_core.engine.sched_config import SchedulerConfig
from lookahead_core.engine.scheduler import StepScheduler
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

PLD_TOKENS = 10  # HF prompt lookup's n-gram continuation length (``prompt_lookup_num_tokens``)
COST_CACHE = 512  # cached entries behind HF's timed forwards in ``hf_forward_ms``


@dataclass
class Outputs:
    """One way's outputs, in prompt order, and the engine's forward steps (0 for plain transformers)."""

    ids: list[list[int]]
    steps: int = 0

    @property
    def tokens(self) -> int:
        return sum(len(o) for o in self.ids)


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a CUDA call returns before it ends)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _eos(model: PreTrainedModel) -> set[int]:
    eos = model.generation_config.eos_token_id
    return set(eos if isinstance(eos, list) else [] if eos is None else [eos])


def hf_generate(model: PreTrainedModel, prompts: Sequence[Sequence[int]], max_new: int, lookup: bool) -> Outputs:
    """Batch-1 ``generate`` (greedy; ``lookup``: with prompt lookup), one prompt after another."""
    out = []
    for ids in prompts:
        x = torch.tensor([list(ids)], device=model.device)  # [1, n]
        extra = {"prompt_lookup_num_tokens": PLD_TOKENS} if lookup else {}
        with torch.inference_mode():
            y = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=max_new, **extra)
        out.append(y[0, x.shape[1] :].tolist())
    return Outputs(out)


def hf_static_batches(model: PreTrainedModel, tok: PreTrainedTokenizerBase, prompts: Sequence[Sequence[int]],
                      max_new: int, batch: int) -> Outputs:
    """Left-padded ``generate`` of ``batch`` prompts at a time (what a plain transformers server does); each
    output cut after its first end-of-sequence token."""
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    eos, out = _eos(model), []
    for i in range(0, len(prompts), batch):
        group = [list(p) for p in prompts[i : i + batch]]
        width = max(len(p) for p in group)
        x = torch.tensor([[pad] * (width - len(p)) + p for p in group], device=model.device)  # [B, width]
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group], device=model.device)  # [B, width]
        with torch.inference_mode():
            y = model.generate(x, attention_mask=mask, do_sample=False, max_new_tokens=max_new, pad_token_id=pad)
        for row in y[:, width:].tolist():
            end = next((j + 1 for j, t in enumerate(row) if t in eos), len(row))
            out.append(row[:end])
    return Outputs(out)


def engine(model: PreTrainedModel, tok: PreTrainedTokenizerBase, config: SchedulerConfig) -> StepScheduler:
    """An engine driven from the caller's thread (``serve``), its cost curve measured now."""
    return StepScheduler(model, tok, config).start(thread=False)


def serve(sched: StepScheduler, prompts: Sequence[Sequence[int]], config: DecodingConfig, at_once: bool,
          trie: TokenTrie | None = None) -> Outputs:
    """``prompts`` through ``sched``: all submitted at once (``at_once``: continuous batching up to its
    max_running) or one after another (a single stream); ``trie`` shared by every request (a repeat pass)."""
    reqs = [ServeRequest(list(p), config, tenant="bench", trie=trie) for p in prompts]
    for group in ([reqs] if at_once else [[r] for r in reqs]):
        for r in group:
            sched.submit(r)
        while any(r.phase is not Phase.DONE for r in group):
            sched.step()
    failed = [r.error for r in reqs if r.error is not None]
    if failed:
        raise RuntimeError(f"{len(failed)} requests failed: {failed[0]!r}")
    return Outputs([list(r.output) for r in reqs], sum(r.stats.forward_steps for r in reqs))


def hf_forward_ms(model: PreTrainedModel, widths: Sequence[int], repeats: int) -> dict[int, float]:
    """Median ms of HF's own forward of n new tokens over a ``COST_CACHE``-entry cache, for each n."""
    dev, out = model.device, {}
    vocab = model.get_input_embeddings().num_embeddings
    ids = torch.randint(0, vocab, (1, COST_CACHE), device=dev)  # [1, COST_CACHE]
    with torch.inference_mode():
        for n in widths:
            times = []
            for _ in range(repeats):
                cache = DynamicCache()
                model(ids, cache=cache, use_cache=True)
                x = torch.randint(0, vocab, (1, n), device=dev)  # [1, n]
                sync(dev)
                t0 = time.perf_counter()
                model(x, cache=cache, use_cache=True)
                sync(dev)
                times.append(time.perf_counter() - t0)
            out[n] = sorted(times)[len(times) // 2] * 1e3
    return out


def equal(outs: Outputs, refs: Outputs) -> dict[str, object]:
    """How many outputs equal their reference, and where the first few that differ part."""
    same = sum(o == r for o, r in zip(outs.ids, refs.ids, strict=True))
    parts = [next((i for i, (a, b) in enumerate(zip(o, r, strict=False)) if a != b), min(len(o), len(r)))
             for o, r in zip(outs.ids, refs.ids, strict=True) if o != r]
    return {"equal": same, "of": len(refs.ids), "first_differences": parts[:8]}
