"""One request inside the serving engine: its trie, drafts, output, cache and stats.

The scheduler (scheduler.py) owns the model and calls these methods from its one thread: the
request never runs a forward itself. Phases: ``WAITING`` (queued) -> ``PREFILL`` (prompt chunks
ride in the step forwards) -> ``DECODE`` (a draft tree per step) -> ``DONE``.
"""

from __future__ import annotations

import enum
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch

from .chooser import TokenChooser, resolve_seed
from .config import DecodingConfig, DraftMode
from .draft import Drafter, DraftTree, retrieve_draft
from .draft_model import DraftModelProposer, DraftModels, merge_into, proposer_for, trie_is_weak
from .finish import trim_step
from .gains import Step
from .jacobi_branch import JacobiBranch, branch_for, branch_tokens, resolve_window
from .kvstore import RequestKV
from .mjsd_model import MjsdProposer, mjsd_for
from .observer import StepObserver
from .stats import GenerationStats
from .trie import OutputCursor, TokenTrie
from .verify import accept_longest


class Phase(enum.Enum):
    """Where a request is in its life."""

    WAITING = "waiting"
    PREFILL = "prefill"
    DECODE = "decode"
    DONE = "done"


@dataclass
class ServeStats(GenerationStats):
    """Decoding counts plus what the engine did for this request and when (the service reports these).

    ``sampled`` and ``seed`` (from GenerationStats) are set when the request is built: the seed a
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
    """A request's state; built by the caller, driven by the scheduler."""

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
        self.config = config
        self.tenant = tenant
        self.trie = trie or TokenTrie(config.trie)
        self.references = [list(r) for r in references]
        self.deadline = deadline  # time.monotonic() value; past it the request ends
        self.on_tokens = on_tokens
        self.on_done = on_done
        self.drafter = drafter
        self.observer = observer  # sees every verified tree and its accepted path (benchmarks)
        self.prefix_epoch = prefix_epoch  # the tenant's prefix cache epoch when the prompt was built (None: unchecked)
        self.id = uuid.uuid4().hex
        self.phase = Phase.WAITING
        self.output: list[int] = []
        # The seed is resolved now (a random one when sampling without one), so callers can read it at once.
        self.stats = ServeStats(sampled=config.sampling, seed=resolve_seed(config), unverified=config.lossy)
        self.chooser: TokenChooser | None = None  # set by start(): the model's processors + the seed
        self.kv: RequestKV | None = None
        self.branch: JacobiBranch | None = None  # set by start(): the Jacobi lookahead branch, if configured
        self.proposer: DraftModelProposer | None = None  # set by start(): mode draft-model's draft and its KV
        self.beams: MjsdProposer | None = None  # set by start(): mode mjsd's beam search (lossy)
        self.joint_path: list[int] = [0]  # mode mjsd: the path the last forward accepted by joint likelihood
        self.prefilled = 0  # prompt tokens whose KV is in the cache
        self.history: list[Step] = []  # (accepted path indices, nodes drafted) of every decode step
        self.cancelled = threading.Event()
        self.error: BaseException | None = None
        self.submitted = time.perf_counter()
        self._cursor: OutputCursor | None = None
        self._owner = f"req-{self.id}"
        self._eos: frozenset[int] = frozenset()
        self._decode: Callable[[list[int]], str] = lambda ids: ""

    # ---- lifecycle (scheduler thread) -----------------------------------------------------------
    def start(
        self, kv: RequestKV, eos: frozenset[int], decode: Callable[[list[int]], str], chooser: TokenChooser,
        drafts: DraftModels | None = None, cost: Callable[[int], float] | None = None,
    ) -> None:
        """Admitted: take a cache and a token chooser, fill the trie with the prompt and references;
        ``cost`` (the engine's measured forward cost) sizes a default Jacobi window (``resolve_window``)."""
        self.kv, self._eos, self._decode, self.chooser = kv, eos, decode, chooser
        self.config = resolve_window(self.config, cost)
        if self.drafter is None:  # tests' drafters stand alone
            self.branch = branch_for(self.config, self.prompt_ids, eos)
            self.proposer = proposer_for(self.config, drafts)
            self.beams = mjsd_for(self.config, drafts)
        self.phase = Phase.PREFILL
        self.stats.queue_wait_s = time.perf_counter() - self.submitted
        self.trie.insert_prompt(self.prompt_ids, self._owner)
        for ref in self.references:
            self.trie.insert_prompt(ref, self._owner)
        if self.config.insert_output:
            self._cursor = self.trie.output_cursor()

    def release(self) -> None:
        """Drop the cache and the request's prompt branches (idempotent)."""
        self.kv = None
        if self.phase is not Phase.WAITING:
            self.trie.remove_owner(self._owner)
        if self._cursor is not None:
            self._cursor.close()
            self._cursor = None
        self.phase = Phase.DONE
        self.stats.new_tokens = len(self.output)
        self.stats.wall_s = time.perf_counter() - self.submitted

    @property
    def finished(self) -> bool:
        return bool(self.stats.finish_reason)

    @property
    def capacity(self) -> int:
        """Cache entries this request can ever need: prompt, output and one tree (and window) beyond it."""
        cfg = self.config
        tree = max(cfg.decoding_length, cfg.max_decoding_length) + 1
        return len(self.prompt_ids) + cfg.max_new_tokens + tree + branch_tokens(cfg)

    # ---- steps ----------------------------------------------------------------------------------
    def context(self) -> list[int]:
        """Prompt and output so far: what the chooser's processors see before this step's tree."""
        return self.prompt_ids + self.output

    def root(self) -> int:
        """The last emitted token: verified, not yet in the cache; every tree hangs below it."""
        return self.output[-1]

    def max_budget(self) -> int:
        """Most draft tokens worth asking for now (never past max_new_tokens)."""
        cfg = self.config
        if cfg.mode is DraftMode.NONE:
            return 0
        return max(0, min(cfg.decoding_length, cfg.max_new_tokens - len(self.output) - 1))

    def draft(self, budget: int, extend_to: int) -> DraftTree:
        """This step's tree: ``budget`` best nodes, confident copies may grow it to ``extend_to``."""
        cfg = self.config
        room = cfg.max_new_tokens - len(self.output) - 1
        if budget <= 0 or room <= 0:
            return DraftTree()
        if self.drafter is not None:
            return self.drafter(self.prompt_ids + self.output, budget, room)
        if self.beams is not None:  # mode mjsd: the draft's beams alone
            return self.beams.propose(self.context(), budget, room, self._eos)
        step_cfg = cfg if extend_to == cfg.max_decoding_length else replace(cfg, max_decoding_length=extend_to)
        context = self.prompt_ids[-cfg.max_match :] + self.output
        tree = retrieve_draft(self.trie, context, step_cfg, budget=budget, max_depth=room, banned=self._eos)
        if self.branch is not None:  # the pool's n-grams fill what the trie left of the budget
            self.branch.draft(tree, self.root(), room, budget)
        if self.proposer is not None and trie_is_weak(tree, budget, self.proposer.depth):  # so does the draft's tree
            merge_into(tree, self.proposer.propose(self.context(), budget - len(tree), room, self._eos))
        return tree

    def judge(self, rows: torch.Tensor, tree: DraftTree) -> None:
        """Mode mjsd: keep the path the target's logits for ``tree`` accept by joint likelihood
        ([1 + len(tree), vocab], root first); ``accept_path`` returns it."""
        assert self.beams is not None
        self.joint_path = self.beams.accept(rows, tree)

    def accept_path(self, tree: DraftTree, predicted: Sequence[int]) -> list[int]:
        """The accepted path (node indices, root first): the greedy match, or mode mjsd's judged path."""
        if self.beams is not None:
            return self.joint_path
        return accept_longest(tree.tokens, tree.parents, predicted)

    def branch_tokens(self) -> int:
        """Window tokens this request's next step carries (0 without a branch)."""
        return self.branch.tokens if self.branch is not None else 0

    def harvest(self, guesses: Sequence[int]) -> int:
        """The branch's guesses (the target's next token after each of its last row's tokens; the rows
        after the request's tree rows in the step's output): advance the window. Returns the rows used."""
        if self.branch is None:
            return 0
        w = self.branch.config.window
        self.branch.harvest(guesses[:w])
        return w

    def emit(self, new: list[int]) -> list[int]:
        """Trim a step's verified tokens (EOS, length, stop strings), append and announce them."""
        kept, reason = trim_step(
            self.output, new, self._eos, self.config.max_new_tokens, self.config.stop_strings, self._decode
        )
        if reason:
            self.stats.finish_reason = reason
        self.output.extend(kept)
        if self._cursor is not None and kept:
            self._cursor.feed(kept)
        if kept and not self.stats.first_token_s:
            self.stats.first_token_s = time.perf_counter() - self.submitted
        if kept and self.on_tokens is not None:
            self.on_tokens(self, kept)
        return kept

    def verified(self, tree: DraftTree, accepted: tuple[int, ...], budget: int, new: list[int]) -> None:
        """A decode step verified ``tree`` (``budget`` granted): record it, then emit its ``new`` tokens.

        ``accepted``: the accepted node indices, root excluded (what ``gains`` and the observer read).
        """
        st = self.stats
        self.history.append((accepted, len(tree)))
        st.forward_steps += 1
        st.draft_tokens += len(tree)
        st.budgets.append(budget)
        if self.observer is not None:
            self.observer.on_step(tree, accepted)
        st.accepted_per_step.append(len(self.emit(new)))

    def rode(self, batch: int, tokens: int, kernel: str) -> None:
        """This request rode in a forward of ``batch`` requests and ``tokens`` tokens, run by ``kernel``."""
        self.stats.batch_sizes.append(batch)
        self.stats.forward_tokens.append(tokens)
        self.stats.kernels.add(kernel)

    def cancel(self) -> None:
        """Ask the scheduler to stop this request (thread-safe; effective within one step)."""
        self.cancelled.set()

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now > self.deadline
