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

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..config import DecodingConfig
from ..detok import TextStreamer
from ..drafting.draft import Drafter
from ..drafting.trie import TokenTrie
from ..forward.kernels import KernelSet
from ..forward.shared import AUTO, shared_kernels
from ..observer import StepObserver
from ..stats import DecodeStats
from .request import Phase, ServeRequest
from .scheduler import SchedulerConfig, StepScheduler

ONE_REQUEST = SchedulerConfig(max_running=1)  # the batch-1 engine: one request runs, others queue


@dataclass
class GenerationResult:
    """Token ids (without the prompt), their text and the stats."""

    output_ids: list[int]
    text: str
    stats: DecodeStats


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
        scheduler: SchedulerConfig = ONE_REQUEST,
    ) -> None:
        self.kernels = kernels if isinstance(kernels, KernelSet) else shared_kernels(model, kernels)
        measured = kernels == AUTO or isinstance(kernels, KernelSet)
        config_ = scheduler if measured else SchedulerConfig(**{**scheduler.__dict__, "calibrate": False})
        self.scheduler = StepScheduler(model, tokenizer, config_, kernels=self.kernels, draft_model=draft_model)
        self.scheduler.start(thread=False)
        self.model = model
        self.tokenizer = tokenizer
        self.config = config or DecodingConfig()
        self.trie = trie  # shared trie (outputs accumulate); None = a fresh trie per request

    def generate(self, prompt_ids: Sequence[int], **kwargs: object) -> GenerationResult:
        """Decode to the end; see ``request`` for the arguments."""
        req, should_stop = self.request(prompt_ids, **kwargs)  # type: ignore[arg-type]
        ids = [t for new in self.steps(req, should_stop) for t in new]
        streamer = TextStreamer(self.tokenizer, req.config.stop_strings)
        text = streamer.push(ids) + streamer.finish()  # cut before a stop string
        return GenerationResult(ids, text, req.stats)

    def stream(self, prompt_ids: Sequence[int], **kwargs: object) -> Iterator[str]:
        """Yield text as tokens are verified: whole characters, never past a stop string."""
        req, should_stop = self.request(prompt_ids, **kwargs)  # type: ignore[arg-type]
        streamer = TextStreamer(self.tokenizer, req.config.stop_strings)
        for new in self.steps(req, should_stop):
            if text := streamer.push(new):
                yield text
        if tail := streamer.finish():
            yield tail

    def request(
        self,
        prompt_ids: Sequence[int],
        config: DecodingConfig | None = None,
        trie: TokenTrie | None = None,
        references: Sequence[Sequence[int]] = (),
        should_stop: Callable[[], bool] | None = None,
        drafter: Drafter | None = None,
        observer: StepObserver | None = None,
    ) -> tuple[ServeRequest, Callable[[], bool] | None]:
        """A request for ``steps`` (and its ``should_stop``, polled once per decoding step: client cancel,
        deadline). ``references`` (token id lists: retrieved documents, past answers) are inserted like the
        prompt; ``drafter`` replaces every proposer (tests feed adversarial trees through it); ``observer``
        sees every verified tree and its accepted path (benchmarks)."""
        req = ServeRequest(prompt_ids, config or self.config, trie=trie or self.trie, references=references,
                           drafter=drafter, observer=observer)
        return req, should_stop

    def steps(self, req: ServeRequest, should_stop: Callable[[], bool] | None = None) -> Iterator[list[int]]:
        """Run ``req`` on the engine from this thread: the token ids verified by each step."""
        new: deque[list[int]] = deque()  # verified steps not yet yielded
        req.on_tokens = lambda _req, ids: new.append(ids)
        self.scheduler.submit(req)
        try:
            while new or req.phase is not Phase.DONE:
                if new:
                    yield new.popleft()
                    continue
                if should_stop is not None and req.phase is Phase.DECODE and should_stop():
                    self.scheduler.cancel(req)
                self.scheduler.step()
        finally:
            if req.phase is not Phase.DONE:  # abandoned mid-stream: free the engine's one running place
                self.scheduler.cancel(req)
        if req.error is not None:
            raise req.error
