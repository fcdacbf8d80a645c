"""The batch-1 API over the one engine: ``LookaheadDecoder`` is the scheduler at one request.

    dec = LookaheadDecoder(model, tokenizer, DecodingConfig(max_new_tokens=64))
    dec.generate(prompt_ids).output_ids            # the tokens plain decoding gives, fewer forwards
    for text in dec.stream(prompt_ids): ...        # text as tokens are verified

There is no second decoding path: a run submits a ``ServeRequest`` to a ``StepScheduler`` with
``max_running=1`` and no thread of its own, and the caller's thread drives ``step()`` until its request
is done (several threads may share one decoder: each drives the engine, which runs one request at a
time and queues the rest).
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..config import DecodingConfig
from ..drafting.draft import Drafter
from ..drafting.trie import TokenTrie
from ..forward.kernels import KERNELS, KernelSet
from ..forward.ragged import RAGGED_ATTENTION
from ..observer import StepObserver
from ..stats import GenerationStats
from .detok import TextStreamer
from .request import Phase, ServeRequest
from .scheduler import SchedulerConfig, StepScheduler, shared_kernels

AUTO = "auto"  # every kernel, the faster one per forward size by measurement (the engine's shared set)
CHOICES = (AUTO, *KERNELS)  # what LookaheadDecoder(kernels=...) accepts as a string
ONE_REQUEST = SchedulerConfig(max_running=1)  # the batch-1 engine: one request runs, others queue

_FORCED: weakref.WeakKeyDictionary[nn.Module, dict[str, KernelSet]] = weakref.WeakKeyDictionary()
_FORCED_LOCK = threading.Lock()


def engine_kernels(model: nn.Module, choice: str = AUTO) -> KernelSet:
    """The engine's kernels for ``choice``: "auto" is the process's shared set (measured at start-up); a
    named kernel is a set of that twin alone, built once per model and not measured."""
    if choice not in CHOICES:
        raise ValueError(f"kernels must be one of {CHOICES} or a KernelSet, not {choice!r}")
    if choice == AUTO:
        return shared_kernels(model)
    with _FORCED_LOCK:
        sets = _FORCED.setdefault(model, {})
        if choice not in sets:
            sets[choice] = KernelSet(model, RAGGED_ATTENTION, (choice,))
        return sets[choice]


@dataclass
class GenerationResult:
    """Token ids (without the prompt), their text and the stats."""

    output_ids: list[int]
    text: str
    stats: GenerationStats


class LookaheadDecoder:
    """Lossless lookahead decoding over any Hugging Face causal LM, one request at a time.

    Greedy output is token-for-token that of ``model.generate(do_sample=False)`` (the model's
    generation_config processors included); sampled output is that of ``sampling.generate_sampled``
    with the same seed, in every lossless mode. ``trie`` (optional) is shared by every run: outputs
    accumulate in it. ``kernels``: "auto" (measured), "stock" or "packed" (forced), or a KernelSet.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        config: DecodingConfig | None = None,
        trie: TokenTrie | None = None,
        kernels: KernelSet | str = AUTO,
        draft_model: PreTrainedModel | None = None,
        engine: SchedulerConfig = ONE_REQUEST,
    ) -> None:
        self.kernels = kernels if isinstance(kernels, KernelSet) else engine_kernels(model, kernels)
        measured = kernels == AUTO or isinstance(kernels, KernelSet)
        config_ = engine if measured else SchedulerConfig(**{**engine.__dict__, "calibrate": False})
        self.engine = StepScheduler(model, tokenizer, config_, kernels=self.kernels, draft_model=draft_model)
        self.engine.start(thread=False)
        self.model = model
        self.tokenizer = tokenizer
        self.config = config or DecodingConfig()
        self.trie = trie  # shared trie (outputs accumulate); None = a fresh trie per request

    def generate(self, prompt_ids: Sequence[int], **kwargs: object) -> GenerationResult:
        """Decode to the end; see ``steps`` for the arguments."""
        run = self.steps(prompt_ids, **kwargs)  # type: ignore[arg-type]
        ids: list[int] = []
        for new in run:
            ids.extend(new)
        streamer = TextStreamer(self.tokenizer, run.config.stop_strings)
        text = streamer.push(ids) + streamer.finish()  # cut before a stop string
        return GenerationResult(ids, text, run.stats)

    def stream(self, prompt_ids: Sequence[int], **kwargs: object) -> Iterator[str]:
        """Yield text as tokens are verified: whole characters, never past a stop string."""
        run = self.steps(prompt_ids, **kwargs)  # type: ignore[arg-type]
        streamer = TextStreamer(self.tokenizer, run.config.stop_strings)
        for new in run:
            text = streamer.push(new)
            if text:
                yield text
        tail = streamer.finish()
        if tail:
            yield tail

    def steps(
        self,
        prompt_ids: Sequence[int],
        config: DecodingConfig | None = None,
        trie: TokenTrie | None = None,
        references: Sequence[Sequence[int]] = (),
        should_stop: Callable[[], bool] | None = None,
        drafter: Drafter | None = None,
        observer: StepObserver | None = None,
    ) -> DecodeRun:
        """A run that yields the token ids verified by each step.

        ``references`` (token id lists: retrieved documents, past answers) are inserted like the
        prompt; ``should_stop`` is polled once per decoding step (client cancel, deadline); ``drafter``
        replaces every proposer (tests feed adversarial trees through it); ``observer`` sees every
        verified tree and its accepted path (benchmarks).
        """
        req = ServeRequest(prompt_ids, config or self.config, trie=trie or self.trie, references=references,
                           drafter=drafter, observer=observer)
        return DecodeRun(self.engine, req, should_stop)


class DecodeRun:
    """One request on the engine, as an iterator of per-step token lists (see ``LookaheadDecoder.steps``)."""

    def __init__(self, engine: StepScheduler, req: ServeRequest, should_stop: Callable[[], bool] | None) -> None:
        self.engine = engine
        self.req = req
        self.should_stop = should_stop
        self._new: deque[list[int]] = deque()  # verified steps not yet yielded
        req.on_tokens = lambda _req, ids: self._new.append(ids)
        self._submitted = False

    def __del__(self) -> None:  # abandoned mid-stream: free the engine's one running place
        if self._submitted and not self.done:
            self.engine.cancel(self.req)

    @property
    def config(self) -> DecodingConfig:
        return self.req.config

    @property
    def stats(self) -> GenerationStats:
        return self.req.stats

    @property
    def done(self) -> bool:
        return self.req.phase is Phase.DONE

    def __iter__(self) -> Iterator[list[int]]:
        return self

    def __next__(self) -> list[int]:
        if not self._submitted:
            self.engine.submit(self.req)
            self._submitted = True
        while not self._new:
            if self.done:
                if self.req.error is not None:
                    raise self.req.error
                raise StopIteration
            if self.should_stop is not None and self.req.phase is Phase.DECODE and self.should_stop():
                self.engine.cancel(self.req)
            self.engine.step()
        return self._new.popleft()
