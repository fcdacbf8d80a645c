"""bench-serve's baseline: transformers' ``generate(do_sample=False)`` on the stock model, batch 1.

``serial_hf`` answers the prompts the ``on`` way assembled, one request at a time, back to back;
a streamer timestamps every token (TTFT: generate called -> first new token, prefill included;
no retrieval). The same function gives the greedy reference of any prompt for exact match.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import torch
from tqdm import tqdm
from transformers import StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from bench.serve_stats import EngineStats, PromptKey, RequestRecord


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


def run_serial(model: Any, prompts: list[tuple[int, list[int]]], max_new: int, stop: threading.Event,
               desc: str) -> list[RequestRecord]:
    """(sequence index, prompt ids) answered one at a time, in order; one record each."""
    records = []
    for index, ids in tqdm(prompts, desc=desc, leave=False):
        if stop.is_set():
            break
        clock = TokenClock()
        rec = RequestRecord(index, time.perf_counter(), prompt_ids=ids)
        rec.output_ids = greedy(model, ids, max_new, clock, stop)
        rec.end_s = time.perf_counter()
        rec.deltas = [(t, 1) for t in clock.times]
        n = len(rec.output_ids)
        rec.stats = EngineStats(new_tokens=n, forward_steps=n, tokens_per_forward=1.0 if n else 0.0)
        records.append(rec)
    return records


def fill_greedy(model: Any, keys: Sequence[PromptKey], max_new: int, table: dict[PromptKey, list[int]],
                stop: threading.Event) -> None:
    """Greedy references for the prompts ``table`` lacks (untimed)."""
    todo = [k for k in dict.fromkeys(keys) if k not in table]
    for key in tqdm(todo, desc="greedy references", leave=False):
        if stop.is_set():
            return
        table[key] = greedy(model, key, max_new, stop=stop)
