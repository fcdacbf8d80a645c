"""Run single requests through the serving engine's step scheduler (the product path) for `bench`.

One scheduler per mode, each with its own prefix cache, sharing the process's one calibrated
ragged KernelSet: a question is submitted alone and the caller's thread drives the engine's steps
until it is done. Every mode and the HF baselines thus run their forwards on the bench's one thread
(several threads with OpenMP pools would slow each other: ``lookahead_core.threads``). This is the
engine at concurrency 1 (prefix-KV reuse included: a repeated prompt, or one sharing a document with an
earlier prompt, skips that part of its prefill, for every mode alike, ``none`` included).
"""

from __future__ import annotations

from typing import Any

from lookahead_core import DecodingConfig, TokenTrie
from lookahead_core.engine.request import Phase, ServeRequest, ServeStats
from lookahead_core.engine.scheduler import SchedulerConfig, StepScheduler
from lookahead_core.forward.shared import shared_kernels

TENANT = "bench"  # every bench prompt belongs to one tenant (its prefix cache is per tenant)


class SchedulerRunner:
    """``runner(ids) -> (output ids, forward steps, stats)`` for one mode."""

    def __init__(self, model: Any, tokenizer: Any, config: DecodingConfig, trie: TokenTrie | None,
                 scheduler: SchedulerConfig | None = None) -> None:
        self.config = config
        self.trie = trie  # shared across questions (accumulate / warm / repeat); None = fresh per question
        self.scheduler = StepScheduler(model, tokenizer, scheduler, kernels=shared_kernels(model)).start(thread=False)

    def __call__(self, ids: list[int]) -> tuple[list[int], int, ServeStats]:
        req = ServeRequest(ids, self.config, tenant=TENANT, trie=self.trie)
        self.scheduler.submit(req)
        while req.phase is not Phase.DONE:
            self.scheduler.step()
        if req.error is not None:
            raise req.error
        return req.output, req.stats.forward_steps, req.stats

    def close(self) -> None:
        self.scheduler.close()
