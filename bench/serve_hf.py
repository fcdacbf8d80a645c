"""bench-serve's baseline: transformers' ``generate(do_sample=False)`` on the stock model, batch 1,
or, with --temperature > 0, the reference sampler (``lookahead_core.sampling.generate_sampled``).

``serial_hf`` answers the prompts the ``on`` way assembled, one request at a time, back to back;
every token is timestamped (TTFT: called -> first new token, prefill included; no retrieval). The
same baseline gives the exact-match reference of any prompt (same seed for every request).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from lookahead_core import DecodingConfig
from tqdm import tqdm
from transformers import StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from lookahead_rag.bench.sampling_args import Sampling
from lookahead_rag.bench.serve_stats import EngineStats, PromptKey, RequestRecord


class TokenClock(BaseStreamer):
    """Arrival time of every new token (generate puts the prompt first, then one token per step)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.times.append(time.perf_counter())

    def tick(self) -> None:
        """One token now (the reference sampler's forward hook)."""
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


class StopFlag(StoppingCriteria):
    """Ends a generate early once ``flag`` is set (Ctrl-C while the baseline runs)."""

    def __init__(self, flag: threading.Event) -> None:
        self.flag = flag

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> bool:
        return self.flag.is_set()


def greedy(model: Any, prompt_ids: Sequence[int], max_new: int, streamer: BaseStreamer | None = None,
           stop: threading.Event | None = None) -> list[int]:
    """Batch-1 plain greedy continuation of ``prompt_ids`` (without the prompt)."""
    x = torch.tensor([list(prompt_ids)], device=model.device)  # [1, prompt]
    extra = {"stopping_criteria": StoppingCriteriaList([StopFlag(stop)])} if stop is not None else {}
    with torch.inference_mode():
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=max_new,
                             streamer=streamer, **extra)
    return out[0, x.shape[1]:].tolist()


@dataclass
class SerialBaseline:
    """The one-request-at-a-time answer of a prompt: HF greedy, or the reference sampler when sampling.

    The reference sampler (lookahead_core.sampling.generate_sampled) has no streamer: a forward hook
    on the model timestamps every forward, one token each (prefill -> the first token).
    """

    model: Any
    tokenizer: Any
    max_new: int
    sampling: Sampling = field(default_factory=Sampling)

    @property
    def name(self) -> str:
        """``hf_greedy`` or ``reference_sampler`` (the JSON's ``serial_baseline``)."""
        return "reference_sampler" if self.sampling.enabled else "hf_greedy"

    def answer(self, prompt_ids: Sequence[int], clock: TokenClock | None = None,
               stop: threading.Event | None = None) -> list[int]:
        if not self.sampling.enabled:
            return greedy(self.model, prompt_ids, self.max_new, clock, stop)
        from lookahead_core.sampling import generate_sampled

        cfg = DecodingConfig(max_new_tokens=self.max_new, **self.sampling.config_kwargs())
        hook = self.model.register_forward_hook(lambda *_: clock.tick()) if clock is not None else None
        try:
            with torch.inference_mode():
                out = list(generate_sampled(self.model, self.tokenizer, list(prompt_ids), cfg))
        finally:
            if hook is not None:
                hook.remove()
        if clock is not None:
            del clock.times[len(out):]  # a forward past the last token (if any) emits nothing
        return out


def run_serial(baseline: SerialBaseline, prompts: list[tuple[int, list[int]]], stop: threading.Event,
               desc: str) -> list[RequestRecord]:
    """(sequence index, prompt ids) answered one at a time, in order; one record each."""
    records = []
    for index, ids in tqdm(prompts, desc=desc, leave=False):
        if stop.is_set():
            break
        clock = TokenClock()
        rec = RequestRecord(index, time.perf_counter(), prompt_ids=ids)
        rec.output_ids = baseline.answer(ids, clock, stop)
        rec.end_s = time.perf_counter()
        rec.deltas = [(t, 1) for t in clock.times]
        n = len(rec.output_ids)
        rec.stats = EngineStats(new_tokens=n, forward_steps=n, tokens_per_forward=1.0 if n else 0.0)
        records.append(rec)
    return records


def fill_references(baseline: SerialBaseline, keys: Sequence[PromptKey], table: dict[PromptKey, list[int]],
                    stop: threading.Event) -> None:
    """The baseline's answers (exact-match references) for the prompts ``table`` lacks (untimed)."""
    todo = [k for k in dict.fromkeys(keys) if k not in table]
    for key in tqdm(todo, desc=f"{baseline.name} references", leave=False):
        if stop.is_set():
            return
        table[key] = baseline.answer(key, stop=stop)
