"""The serving engine's step scheduler: one thread owns the model and runs every request's step.

Each step packs, into ONE forward (ragged_step.py), the draft tree of every decoding request and a
chunk of the prompt of requests still prefilling (continuous batching: requests join and leave
between steps). The forward returns the model's choice after every tree node; each request accepts its
longest agreeing path, gathers those KV entries into place, and gets its verified tokens through
its ``on_tokens`` callback. Waiting requests sit in a bounded queue with fair share by tenant.

Draft budgets adapt to load: each request's expected tokens per step for every budget comes from
its own recent accepted paths, the cost of a forward of n tokens comes from a measurement on this
machine at start-up, and ``split_budget`` picks the budgets that maximize tokens per second.

The per-request ``DecodeRun`` (decoder.py) stays the batch-1 path and the tests' oracle.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .admission import FairQueue, QueueFull
from .budget import split_budget
from .chooser import TokenChooser
from .draft import DraftTree
from .draft_model import DraftModels
from .finish import eos_ids
from .gains import GainsModel
from .kernels import KernelSet
from .kvstore import KVShape, RequestKV, compact, export_prefix, load_prefix
from .prefix_cache import PrefixCacheConfig, PrefixKVCache
from .ragged import PLAN_KWARG, RAGGED_ATTENTION
from .ragged_step import Chunk, RaggedProbe, choose_step, pack_step
from .serve_request import Phase, RequestExpired, ServeRequest
from .support import check_supported

log = logging.getLogger(__name__)

MIB = 1 << 20


@dataclass(frozen=True)
class SchedulerConfig:
    """How the engine batches, queues, caches and measures."""

    max_running: int = 16  # requests decoding at once (all verified in each step's one forward)
    max_waiting: int = 64  # requests queued beyond those; one more is refused at once (QueueFull)
    max_tokens_per_forward: int = 512  # tokens in one forward: drafts, roots and prefill chunks together
    prefill_chunk: int = 256  # prompt tokens prefilled per forward, so running streams keep streaming
    prefix_cache_bytes: int = 256 * MIB  # KV of shared prompt prefixes kept per engine (LRU past it)
    prefix_min_tokens: int = 16  # shorter prefix matches are not worth copying
    adaptive: bool = True  # split each step's draft budget by measured acceptance and cost
    calibrate: bool = True  # measure kernels and the forward cost curve at start-up
    calibration_counts: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # forward sizes timed
    calibration_past: int = 256  # cache entries behind the timed forwards (a typical RAG prompt)
    calibration_repeats: int = 3  # timings per size and kernel (the median is kept)
    idle_poll_s: float = 0.05  # an idle loop wakes this often to expire waiting deadlines

    def __post_init__(self) -> None:
        if self.max_running < 1 or self.max_waiting < 0:
            raise ValueError("need max_running >= 1 and max_waiting >= 0")
        if self.max_tokens_per_forward < self.max_running + 1:
            raise ValueError("max_tokens_per_forward must exceed max_running (one token per request and room)")
        if not 1 <= self.prefill_chunk <= self.max_tokens_per_forward:
            raise ValueError("need 1 <= prefill_chunk <= max_tokens_per_forward")


@dataclass
class SchedulerState:
    """A snapshot for metrics and tests."""

    waiting: int  # requests in the queue
    running: int  # requests admitted (prefilling or decoding)
    kv_bytes: int  # bytes of KV buffers held by running requests
    forwards: int  # forwards run since start
    prefix_hit_tokens: int  # prompt tokens served from the prefix cache since start


class SchedulerClosed(RuntimeError):
    """The engine is shutting down and takes no new requests."""


_SHARED: weakref.WeakKeyDictionary[torch.nn.Module, KernelSet] = weakref.WeakKeyDictionary()
_SHARED_LOCK = threading.Lock()


def shared_kernels(model: torch.nn.Module) -> KernelSet:
    """The process's one ragged-attention KernelSet of ``model``: engines on one model share its twins
    (and the packed weights) and its calibration, which the first engine to start measures."""
    with _SHARED_LOCK:
        kernels = _SHARED.get(model)
        if kernels is None:
            kernels = _SHARED[model] = KernelSet(model, RAGGED_ATTENTION)
        return kernels


# Called from the scheduler thread after each forward: (tokens in it, requests in it). Must not block.
OnForward = Callable[[int, int], None]


class StepScheduler:
    """Continuous batching over one model; thread-safe ``submit`` / ``cancel`` / ``state``."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        config: SchedulerConfig | None = None,
        kernels: KernelSet | None = None,
        prefix_cache: PrefixKVCache | None = None,
        on_forward: OnForward | None = None,
        draft_model: PreTrainedModel | None = None,
    ) -> None:
        check_supported(model)
        self.config = cfg = config or SchedulerConfig()
        self.model = model
        self.tokenizer = tokenizer
        self.kernels = kernels or KernelSet(model, RAGGED_ATTENTION)
        self.shape = KVShape.of(model)
        self.device = self.shape.device
        self.eos = eos_ids(model, tokenizer)
        self.generation_config = copy.deepcopy(model.generation_config)  # each request's processors start here
        self.prefix_cache = prefix_cache or PrefixKVCache(
            PrefixCacheConfig(max_bytes=cfg.prefix_cache_bytes, min_tokens=cfg.prefix_min_tokens)
        )
        self.gains = GainsModel()
        self.drafts = DraftModels(model, draft_model)  # mode draft-model: the given draft, else self-drafts
        # Every request passes through the queue, even onto a free running place: room for both.
        self.queue: FairQueue[ServeRequest] = FairQueue(cfg.max_waiting + cfg.max_running)
        self.running: list[ServeRequest] = []
        self.forwards = 0
        self.prefix_hit_tokens = 0
        self.forward_sizes: Counter[int] = Counter()  # tokens per forward -> forwards
        self.on_forward = on_forward
        self._cv = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    # ---- public (any thread) --------------------------------------------------------------------
    def start(self) -> StepScheduler:
        """Measure kernels (once) and start the scheduler thread."""
        with _SHARED_LOCK:  # engines sharing a KernelSet calibrate it once
            if self.config.calibrate and self.kernels.curve is None:
                counts = [n for n in self.config.calibration_counts if n <= self.config.max_tokens_per_forward]
                probe = RaggedProbe(self.shape, self.config.calibration_past)
                self.kernels.calibrate(probe, counts, self.config.calibration_repeats)
                log.info("kernels by forward size: %s", self.kernels.describe())
        self._thread = threading.Thread(target=self._loop, name="step-scheduler", daemon=True)
        self._thread.start()
        return self

    def submit(self, req: ServeRequest) -> None:
        """Queue a request; raises QueueFull at once past the queue, SchedulerClosed when closing."""
        with self._cv:
            if self._closed:
                raise SchedulerClosed("the engine is shutting down")
            free = max(0, self.config.max_running - len(self.running))
            if len(self.queue) >= self.config.max_waiting + free:
                raise QueueFull(f"waiting queue is full ({self.config.max_waiting} requests waiting)")
            self.queue.push(req.tenant, req, req.deadline)
            self._cv.notify()

    def cancel(self, req: ServeRequest) -> None:
        """Stop a request: a waiting one leaves the queue now, a running one within one step."""
        req.cancel()
        with self._cv:
            removed = self.queue.remove(req)
            self._cv.notify()
        if removed:
            req.stats.finish_reason = "cancelled"
            self._end(req)

    def has_room(self) -> bool:
        """Whether one more request would be queued now (not refused with QueueFull)."""
        with self._cv:
            free = max(0, self.config.max_running - len(self.running))
            return len(self.queue) < self.config.max_waiting + free

    def prefix_epoch(self, tenant: str) -> int:
        """The tenant's prefix-cache epoch: read it before building a prompt, pass it to the request
        (a forget in between makes the prompt's KV stale, and it is not kept)."""
        return self.prefix_cache.epoch(tenant)

    def forgets_to(self) -> PrefixKVCache:
        """What a forget of cached prompt KV reaches (the generator's forget consumer attaches it)."""
        return self.prefix_cache

    def state(self) -> SchedulerState:
        with self._cv:
            running = list(self.running)
            waiting = len(self.queue)
        kv = sum(cache.nbytes for r in running if (cache := r.kv) is not None)  # read once: _end may free it
        return SchedulerState(waiting, len(running), kv, self.forwards, self.prefix_hit_tokens)

    def close(self, timeout: float = 10.0) -> None:
        """Stop taking requests, cancel what is queued or running, and join the thread."""
        with self._cv:
            self._closed = True
            waiting: list[ServeRequest] = []
            while (req := self.queue.pop({})) is not None:
                waiting.append(req)
            self._cv.notify()
        for req in waiting:
            req.stats.finish_reason = "cancelled"
            self._end(req)
        if self._thread is not None:
            self._thread.join(timeout)

    # ---- the loop (scheduler thread) ------------------------------------------------------------
    def _loop(self) -> None:
        doomed: list[ServeRequest] = []
        while True:
            admitted: list[ServeRequest] = []
            with self._cv:
                while True:
                    self._expire_waiting()
                    admitted = self._pop_admissible()
                    if self._closed or self.running or admitted:
                        break
                    self._cv.wait(self.config.idle_poll_s)
                if self._closed:
                    doomed = list(self.running)
                    self.running.clear()
                    break
            for req in admitted:
                try:
                    self._start(req)
                except Exception as exc:  # e.g. a generation_config the chooser refuses: this request fails
                    req.error = exc
                    self._end(req)
            try:
                self._step()
            except Exception as exc:  # a failed forward fails its requests, never the engine
                log.exception("step failed; failing the requests in it")
                for req in self._take_running():
                    req.error = exc
                    self._end(req)
        for req in [*doomed, *admitted]:
            req.stats.finish_reason = req.stats.finish_reason or "cancelled"
            self._end(req)

    def _expire_waiting(self) -> None:
        for req in self.queue.expire(time.monotonic()):
            req.error = RequestExpired("the deadline passed while the request waited in the queue")
            self._end(req)

    def _pop_admissible(self) -> list[ServeRequest]:
        out: list[ServeRequest] = []
        while len(self.running) < self.config.max_running:
            per_tenant = Counter(r.tenant for r in self.running)
            req = self.queue.pop(per_tenant)
            if req is None:
                break
            self.running.append(req)
            out.append(req)
        return out

    def _take_running(self) -> list[ServeRequest]:
        with self._cv:
            taken = list(self.running)
            self.running.clear()
        return taken

    def _start(self, req: ServeRequest) -> None:
        """Give an admitted request its cache, reusing a cached prefix of its prompt."""
        chooser = TokenChooser.for_request(
            self.generation_config, req.config, len(req.prompt_ids), req.stats.seed, self.device
        )
        kv = RequestKV(self.shape, req.capacity)
        curve = self.kernels.curve  # sizes a default Jacobi window by measured cost
        req.start(kv, self.eos, self._decode, chooser, self.drafts, curve.cost if curve is not None else None)
        # Leave at least one prompt token to run: its logits give the first output token.
        hit, prefix = self.prefix_cache.lookup(req.tenant, req.prompt_ids, max_tokens=len(req.prompt_ids) - 1)
        if prefix is not None and hit:
            load_prefix(kv, prefix, hit)
            req.prefilled = hit
            req.stats.prefix_hit_tokens = hit
            self.prefix_hit_tokens += hit

    def _end(self, req: ServeRequest) -> None:
        """Free a request's place and cache, and tell its caller (exactly once)."""
        if req.phase is Phase.DONE:
            return
        req.release()  # first: once state() stops counting it, its cache is already free
        with self._cv:
            if req in self.running:
                self.running.remove(req)
        if req.on_done is not None:
            req.on_done(req, req.error)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    # ---- one step ---------------------------------------------------------------------------------
    def _step(self) -> None:
        cfg = self.config
        now = time.monotonic()
        live: list[ServeRequest] = []
        for req in list(self.running):
            if req.cancelled.is_set() or req.expired(now):
                req.stats.finish_reason = "cancelled"
                self._end(req)
            else:
                live.append(req)
        decoding = [r for r in live if r.phase is Phase.DECODE]
        chunks: list[Chunk] = []  # (request, first, end) prompt positions
        room = min(cfg.prefill_chunk, cfg.max_tokens_per_forward - len(decoding))
        for req in (r for r in live if r.phase is Phase.PREFILL):
            if room <= 0:
                break
            end = min(len(req.prompt_ids), req.prefilled + room)
            chunks.append((req, req.prefilled, end))
            room -= end - req.prefilled
        if not decoding and not chunks:
            return
        base = sum(end - first for _, first, end in chunks)
        # Draft every request's full tree first (best-first, so a budget of q keeps its first q
        # nodes), then split the forward's tokens by expected gain against measured cost.
        spare = cfg.max_tokens_per_forward - base - sum(1 + r.branch_tokens() for r in decoding)
        full = []
        for req in decoding:
            cap = min(req.max_budget(), max(0, spare))
            extend = min(req.config.max_decoding_length, max(cap, spare)) if cap == req.max_budget() else cap
            tree = req.draft(cap, extend)
            spare -= len(tree)
            full.append(tree)
        budgets = self._budgets(decoding, full, base)
        trees = [tree.prefix(q) for tree, q in zip(full, budgets, strict=True)]
        self._forward_and_accept(decoding, trees, budgets, chunks)

    def _budgets(self, decoding: Sequence[ServeRequest], trees: Sequence[DraftTree], base: int) -> list[int]:
        sizes = [len(t) for t in trees]
        curve = self.kernels.curve
        if not self.config.adaptive or curve is None or not decoding:
            return sizes
        gains = [self.gains.expected(r.history, t.probs) for r, t in zip(decoding, trees, strict=True)]
        return split_budget(gains, curve.cost, base, self.config.max_tokens_per_forward)

    def _forward_and_accept(
        self,
        decoding: list[ServeRequest],
        trees: list[DraftTree],
        budgets: list[int],
        chunks: list[Chunk],
    ) -> None:
        step = pack_step(decoding, trees, chunks)
        total = len(step.ids)
        step.plan.finalize(self.shape.dtype, self.device)
        runner = self.kernels.runner(total)
        kernel = self._kernel_name(total)
        with torch.inference_mode():
            input_ids = torch.tensor([step.ids], dtype=torch.long, device=self.device)  # [1, T]
            position_ids = torch.tensor([step.positions], dtype=torch.long, device=self.device)  # [1, T]
            keep_idx = torch.tensor(step.keep, dtype=torch.long, device=self.device)  # [K]
            logits = runner(
                input_ids=input_ids, position_ids=position_ids, use_cache=False, logits_to_keep=keep_idx,
                **{PLAN_KWARG: step.plan},
            ).logits  # logits: [1, K, vocab]
            predicted = choose_step(logits[0], decoding, trees, chunks)  # [K]: each request's chooser
        self.forwards += 1
        self.forward_sizes[total] += 1
        batch = len(decoding) + len(chunks)
        if self.on_forward is not None:
            self.on_forward(total, batch)
        at = 0
        for req, tree, q in zip(decoding, trees, budgets, strict=True):
            n = len(tree) + 1
            self._accept(req, tree, predicted[at : at + n], q)
            at += n
            at += req.harvest(predicted[at:])  # its Jacobi window's guesses follow its tree's rows
            req.rode(batch, total, kernel)
        for req, _first, end in chunks:
            req.prefilled = end
            assert req.kv is not None
            req.kv.length = end
            req.rode(batch, total, kernel)
            if end == len(req.prompt_ids):
                self._prefilled(req, predicted[at])
                at += 1
        for req in [*decoding, *(r for r, _, _ in chunks)]:
            if req.finished:
                self._end(req)

    def _accept(self, req: ServeRequest, tree: DraftTree, predicted: list[int], budget: int) -> None:
        assert req.kv is not None
        path = req.accept_path(tree, predicted)
        past = req.kv.length
        compact(req.kv, past, path)
        accepted = tuple(path[1:])
        self.gains.observe(accepted, len(tree))
        new = [tree.tokens[i - 1] for i in path[1:]] + [predicted[path[-1]]]
        req.verified(tree, accepted, budget, new)

    def _prefilled(self, req: ServeRequest, first: int) -> None:
        """The prompt is in the cache: keep its KV for later prompts and emit the first token."""
        assert req.kv is not None
        n = len(req.prompt_ids)
        if req.stats.prefix_hit_tokens < n - 1:  # nothing new to keep when a repeat's prefix covered it
            # a prompt built before a forget of its tenant (stale epoch) is not kept
            self.prefix_cache.put(req.tenant, req.prompt_ids, export_prefix(req.kv, n), epoch=req.prefix_epoch)
        req.phase = Phase.DECODE
        req.stats.prefill_s = time.perf_counter() - req.submitted - req.stats.queue_wait_s
        req.emit([first])

    def _kernel_name(self, n: int) -> str:
        curve, names = self.kernels.curve, self.kernels.names
        return curve.best(n) if curve is not None and len(names) > 1 else names[0]
