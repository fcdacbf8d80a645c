"""A request as its caller sees it: what it asks, what it got so far, its stats; cancel it any time.

The caller builds a ``ServeRequest`` and submits it; the engine builds the running state whole when it
admits it (``active.Active``: cache, chooser, proposers) and reports through the callbacks, from its
one thread. Phases: ``WAITING`` (queued) -> ``PREFILL`` (prompt chunks ride in the step forwards) ->
``DECODE`` (a draft tree per step) -> ``DONE`` (ended: finished, cancelled, expired or failed), moved by
``advance`` only, which the engine calls from scheduler.py; why decoding stopped is set by ``finish`` only.
"""

from __future__ import annotations

import enum
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..config import DecodingConfig
from ..drafting.draft import Drafter
from ..drafting.trie import TokenTrie
from ..observer import StepObserver
from ..proposers.base import Proposer
from ..sampling.chooser import resolve_seed
from ..sampling.logprobs import TokenLogprob
from ..stats import DecodeStats


class Phase(enum.Enum):
    """Where a request is in its life."""

    WAITING = "waiting"
    PREFILL = "prefill"
    DECODE = "decode"
    DONE = "done"


# The moves a request's life allows: forward only, and from any phase but DONE to DONE (it finished,
# was cancelled, expired or failed).
NEXT: dict[Phase, frozenset[Phase]] = {
    Phase.WAITING: frozenset({Phase.PREFILL, Phase.DONE}),
    Phase.PREFILL: frozenset({Phase.DECODE, Phase.DONE}),
    Phase.DECODE: frozenset({Phase.DONE}),
    Phase.DONE: frozenset(),
}


@dataclass
class ServeStats(DecodeStats):
    """Decoding counts plus what the engine did for this request and when (the service reports these).

    ``sampled`` and ``seed`` (from DecodeStats) are set when the request is built: the seed a
    sampled request runs with, its own or a random one, so the caller can replay it.
    """

    queue_wait_s: float = 0.0  # submitted -> admitted to run
    prefill_s: float = 0.0  # admitted -> prompt in the cache (first token verified)
    first_token_s: float = 0.0  # submitted -> first token verified
    wall_s: float = 0.0  # submitted -> released (done, cancelled or failed)
    prefix_hit_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    batch_sizes: list[int] = field(default_factory=list)  # requests in each forward this request rode in
    forward_tokens: list[int] = field(default_factory=list)  # tokens in each of those forwards
    budgets: list[int] = field(default_factory=list)  # draft budget granted at each decode step
    kernels: set[str] = field(default_factory=set)  # kernels the engine's measurement chose for them

    @property
    def mean_batch_size(self) -> float:
        return sum(self.batch_sizes) / len(self.batch_sizes) if self.batch_sizes else 0.0

    @property
    def mean_tokens_per_forward(self) -> float:
        return sum(self.forward_tokens) / len(self.forward_tokens) if self.forward_tokens else 0.0

    @property
    def mean_budget(self) -> float:
        return sum(self.budgets) / len(self.budgets) if self.budgets else 0.0


# Called from the scheduler thread: (request, verified token ids). Must not block.
OnTokens = Callable[["ServeRequest", list[int]], None]
# Called once from the scheduler thread when the request ends: (request, error or None).
OnDone = Callable[["ServeRequest", BaseException | None], None]


class RequestExpired(Exception):
    """The request's deadline passed while it waited in the queue: it never ran."""


class ServeRequest:
    """A request's ticket: built by the caller, filled in by the engine."""

    def __init__(
        self,
        prompt_ids: Sequence[int],
        config: DecodingConfig,
        *,
        tenant: str = "",
        trie: TokenTrie | None = None,
        references: Sequence[Sequence[int]] = (),
        deadline: float | None = None,
        on_tokens: OnTokens | None = None,
        on_done: OnDone | None = None,
        drafter: Drafter | None = None,
        observer: StepObserver | None = None,
        prefix_epoch: int | None = None,
    ) -> None:
        if not prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        self.prompt_ids = list(prompt_ids)
        self.config = config  # as asked; at admission, with its Jacobi window resolved (what it runs with)
        self.tenant = tenant
        self.trie = trie or TokenTrie(config.trie)
        self.references = [list(r) for r in references]
        self.deadline = deadline  # time.monotonic() value; past it the request ends
        self.on_tokens = on_tokens
        self.on_done = on_done
        self.drafter = drafter  # replaces every proposer (tests feed adversarial trees through it)
        self.observer = observer  # sees every verified tree and its accepted path (benchmarks)
        self.prefix_epoch = prefix_epoch  # the tenant's prefix cache epoch when the prompt was built (None: unchecked)
        self.id = uuid.uuid4().hex
        self.owner = f"req-{self.id}"  # whose prompt branches they are in the trie (removed when it ends)
        self.trie_filled = False  # the prompt's and references' windows are in the trie (``fill_trie``)
        self._phase = Phase.WAITING  # written by ``advance`` only
        self.output: list[int] = []
        # config.logprobs: one per output token, appended before on_tokens announces them (else empty)
        self.logprobs: list[TokenLogprob] = []
        # The seed is resolved now (a random one when sampling without one), so callers can read it at once.
        self.stats = ServeStats(sampled=config.sampling, seed=resolve_seed(config), unverified=config.lossy)
        self.proposers: tuple[Proposer, ...] = ()  # the draft sources the engine built at admission
        self.cancelled = threading.Event()
        self.error: BaseException | None = None
        self.submitted = time.perf_counter()

    def fill_trie(self) -> None:
        """Put the prompt's and the references' windows in the request's trie (what its drafts come from).
        The engine does it at admission when the caller has not; a caller with large references does it
        on its own thread before ``submit`` (``asyncio.to_thread``), so the engine's thread, and every
        other tenant's step, never waits on one request's trie."""
        if self.trie_filled:
            return
        self.trie.insert_prompt(self.prompt_ids, self.owner)
        for ref in self.references:
            self.trie.insert_prompt(ref, self.owner)
        self.trie_filled = True

    @property
    def phase(self) -> Phase:
        """Where the request is in its life (``advance`` moves it)."""
        return self._phase

    def advance(self, phase: Phase) -> None:
        """Move the request to ``phase``: the one writer of its phase (the engine calls it from
        scheduler.py: admitted, prompt in the cache, ended); a move ``NEXT`` does not allow raises."""
        if phase not in NEXT[self._phase]:
            raise RuntimeError(f"request {self.id} cannot go from {self._phase.value} to {phase.value}")
        self._phase = phase

    def finish(self, reason: str) -> None:
        """Decoding is over for ``reason`` ("eos", "stop", "length", "cancelled"): the one writer of
        ``stats.finish_reason``; the first reason stays. The engine ends a finished request (DONE) once."""
        if not self.stats.finish_reason:
            self.stats.finish_reason = reason

    @property
    def finished(self) -> bool:
        """Ended, or its decoding is over (``finish``) and the engine ends it after this step."""
        return self._phase is Phase.DONE or bool(self.stats.finish_reason)

    def cancel(self) -> None:
        """Ask the engine to stop this request (thread-safe; effective within one step)."""
        self.cancelled.set()

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now > self.deadline
