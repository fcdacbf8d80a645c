"""The library's serving face (torch): what a server that runs the engine imports from ``lookahead_core``,
so that it depends on these names and not on the engine's insides. The torch-free face is the package
itself (``lookahead_core``: configuration, trie, vocabulary checks, the text streamer).

    model, tokenizer = load_model(name)
    scheduler = StepScheduler(model, tokenizer, SchedulerConfig(), kernels=shared_kernels(model)).start()
    scheduler.submit(ServeRequest(prompt_ids, DecodingConfig(), tenant="acme", on_tokens=..., on_done=...))
"""

from __future__ import annotations

from .engine.admission import QueueFull
from .engine.request import Phase, RequestExpired, ServeRequest, ServeStats
from .engine.scheduler import SchedulerClosed, SchedulerConfig, StepScheduler
from .forward.backend import KVTooLong
from .forward.shared import shared_kernels
from .models import load_model
from .threads import usable_cores

__all__ = [
    "KVTooLong",
    "Phase",
    "QueueFull",
    "RequestExpired",
    "SchedulerClosed",
    "SchedulerConfig",
    "ServeRequest",
    "ServeStats",
    "StepScheduler",
    "load_model",
    "shared_kernels",
    "usable_cores",
]
