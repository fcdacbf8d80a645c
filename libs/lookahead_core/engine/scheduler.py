"""The engine: one owner of the model runs every request's step, as plan -> pack -> run -> apply.

    plan = plan_step(...)          # plan.py: who runs, each tree and budget, the prefill chunks (a value)
    packed = pack_step(plan)       # pack.py: the one packed row and where each request's rows are
    logits = forward(...)          # run.py: ONE forward for every request; choose() the token after each row
    apply_step(plan, packed, ...)  # apply.py: accept each path, the backend keeps its KV, emit; finish prefills

Continuous batching: requests join and leave between steps; waiting requests sit in a bounded queue with fair
share by tenant. Draft budgets adapt to load: each request's expected tokens per step for every budget comes from
its own recent accepted paths, a forward's cost from a measurement at start-up, and ``split_budget`` picks the
budgets that maximize tokens per second. ``start()`` runs the steps on the engine's own thread (the service);
``start(thread=False)`` leaves them to callers of ``step()`` (the batch-1 ``LookaheadDecoder``).
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..forward.backend import Backend, BackendSpec, KVTooLong, check_fits, make_backend
from ..kv.prefix_cache import PrefixCacheConfig, PrefixKVCache
from ..proposers.build import DraftingSpec, build_drafting, drafting_spec
from ..proposers.draft_model import DraftModels
from ..sampling.chooser import TokenChooser
from ..threads import CallQueue, T, start_compute_thread
from ..vocab import check_in_vocab
from .active import Active, Emitting
from .admission import FairQueue, QueueFull, SchedulerClosed, SchedulerState
from .apply import Forward, apply_step
from .finish import eos_ids
from .gains import GainsModel
from .isolate import isolate
from .lending import admission_round
from .pack import PackedStep, pack_step
from .plan import StepLimits, StepPlan, plan_step
from .profile import Phases, StepProfile, watch_heads
from .request import Phase, RequestExpired, ServeRequest
from .run import choose
from .sched_config import MIB, SchedulerConfig
from .usage import TenantUsage, step_tokens

log = logging.getLogger(__name__)

# Called from the scheduler thread after each forward: (tokens in it, requests in it). Must not block.
OnForward = Callable[[int, int], None]


class StepScheduler:
    """Continuous batching over one model; thread-safe ``submit`` / ``cancel`` / ``state`` / ``step``."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        config: SchedulerConfig | None = None,
        kernels: object | None = None,
        prefix_cache: PrefixKVCache | None = None,
        on_forward: OnForward | None = None,
        draft_model: PreTrainedModel | None = None,
    ) -> None:
        self.config = cfg = config or SchedulerConfig()
        self.model = model
        self.tokenizer = tokenizer
        self.threads = cfg.threads or torch.get_num_threads()  # the engine thread's intra-op threads
        self.backend: Backend = make_backend(model, BackendSpec(  # ``kernels``: a caller's twins, for the CPU one
            choice=cfg.backend, threads=self.threads, twins=kernels, slots=cfg.max_running,
            slot_tokens=cfg.kv_slot_tokens, exact_numerics=cfg.exact_numerics, tile_rows=cfg.exact_tile_rows,
            kv_dtype=cfg.kv_dtype))
        self.device = next(model.parameters()).device
        self.eos = eos_ids(model, tokenizer)
        self.generation_config = copy.deepcopy(model.generation_config)  # each request's processors start here
        self.prefix_cache = prefix_cache or PrefixKVCache(
            PrefixCacheConfig(max_bytes=cfg.prefix_cache_bytes, min_tokens=cfg.prefix_min_tokens,
                              tenant_share=cfg.prefix_tenant_share)
        )
        self.gains = GainsModel()
        self.usage = TenantUsage(cfg.usage_half_life_s)  # each tenant's recent engine time (fair prefill)
        self.drafts = DraftModels(model, draft_model)  # mode draft-model: the given draft, else self-drafts
        self.vocab_size = model.get_input_embeddings().num_embeddings  # ids the forward can embed
        self.limits = StepLimits(cfg.max_tokens_per_forward, cfg.prefill_chunk, cfg.ttft_target_s, self.vocab_size,
                                 cfg.prefill_tree_share, cfg.prefill_lead_s)
        # Every request passes through the queue, even onto a free running place: room for both.
        self.queue: FairQueue[ServeRequest] = FairQueue(cfg.max_waiting + cfg.max_running)
        self.running: list[Active] = []
        self.forwards = 0
        self.prefix_hit_tokens = 0
        self.forward_sizes: Counter[int] = Counter()  # tokens per forward -> forwards
        self.on_forward = on_forward
        self.profile: StepProfile | None = None  # time every step's phases (``start_profile``)
        self._cv = threading.Condition()
        self._stepping = threading.Lock()  # one step at a time, whoever drives it
        self._admitting = 0  # requests popped from the queue, not yet running
        self._closed = False
        self._thread: threading.Thread | None = None
        self._calls = CallQueue()  # other threads' callables for the engine's thread (``call``)

    # ---- public (any thread) --------------------------------------------------------------------
    def start(self, thread: bool = True) -> StepScheduler:
        """Measure kernels (once) and, with ``thread``, run the steps on the engine's own thread (which
        measures there, with ``threads`` intra-op threads: see ``lookahead_core.threads``); without,
        the caller's thread measures now and drives ``step()``."""
        if thread:
            self._thread = start_compute_thread(self._calibrate, self._loop, self.threads, "step-scheduler")
        else:
            self._calibrate()
        return self

    def _calibrate(self) -> None:
        cfg = self.config
        counts = [n for n in cfg.calibration_counts if n <= cfg.max_tokens_per_forward]
        if cfg.calibrate and self.backend.calibrate(counts, cfg.calibration_repeats, cfg.calibration_past):
            log.info("%s", self.backend.describe())

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the engine's thread between two steps (e.g. a baseline timed beside the engine:
        lookahead_core.threads); blocks until it is done. Without a thread of its own, on the caller's."""
        if self._thread is None:
            return fn()
        with self._cv:
            future = self._calls.push(fn)
            self._cv.notify()
        return future.result()

    def submit(self, req: ServeRequest) -> None:
        """Queue a request; raises QueueFull at once past the queue, SchedulerClosed when closing, KVTooLong when
        its KV could never fit a tenant's share of the engine's KV budget."""
        capacity = Active.capacity(req, self._spec(req))
        check_fits(capacity, self.backend.max_capacity)  # longer than a pool slot: refused before it queues
        need, most = self.backend.kv_bytes(capacity), self.config.tenant_kv_bytes  # the backend's figure
        if need > most:
            raise KVTooLong(f"the request needs {need / MIB:.0f} MiB of KV (prompt + max_new_tokens + a step) but a "
                            f"tenant's running requests may hold {most / MIB:.0f} MiB: shorten it")
        with self._cv:
            if self._closed:
                raise SchedulerClosed("the engine is shutting down")
            if not self._room():
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
            req.finish("cancelled")
            self._end(req)

    def has_room(self) -> bool:
        """Whether one more request would be queued now (not refused with QueueFull)."""
        with self._cv:
            return self._room()

    def prefix_epoch(self, tenant: str) -> int:
        """The tenant's prefix-cache epoch: read it before building a prompt, pass it to the request
        (a forget in between makes the prompt's KV stale, and it is not kept)."""
        return self.prefix_cache.epoch(tenant)

    def forgets_to(self) -> PrefixKVCache:
        """What a forget of cached prompt KV reaches (the generator's forget consumer attaches it)."""
        return self.prefix_cache

    def start_profile(self) -> StepProfile:
        """Time every following step's phases into a new ``StepProfile`` (returned; ``report()`` reads it)."""
        watch_heads(self.backend.modules())
        self.profile = StepProfile()
        return self.profile

    def holds(self, req: ServeRequest) -> bool:
        """Whether the engine still holds ``req``'s running state (its KV cache, proposers, trie branches)."""
        with self._cv:
            return any(active.req is req for active in self.running)

    def state(self) -> SchedulerState:
        with self._cv:
            running, waiting = list(self.running), len(self.queue)
        kv = sum(self.backend.kv_bytes(r.kv.capacity) for r in running)
        return SchedulerState(waiting, len(running) + self._admitting, kv, self.forwards, self.prefix_hit_tokens)

    def close(self, timeout: float = 10.0) -> None:
        """Stop taking requests, cancel what is queued or running, and join the thread."""
        with self._cv:
            self._closed = True
            waiting: list[ServeRequest] = []
            while (req := self.queue.pop({})) is not None:
                waiting.append(req)
            self._cv.notify()
        for req in waiting:
            req.finish("cancelled")
            self._end(req)
        if self._thread is not None:
            self._thread.join(timeout)
        else:
            with self._stepping:
                self._cancel_running()

    def step(self) -> bool:
        """One engine iteration: expire and admit waiting requests, then plan -> pack -> run -> apply.
        Returns whether requests are still running or waiting."""
        with self._stepping:
            with self._cv:
                self._expire_waiting()
                admitted = self._pop_admissible()
            for req in admitted:
                self._admit(req)
            try:
                self._step()
            except Exception as exc:  # a failed forward fails its requests, never the engine
                log.exception("step failed; failing the requests in it")
                for active in self._take_running():
                    active.req.error = exc
                    self._end(active.req, active)
            with self._cv:
                return bool(self.running) or len(self.queue) > 0

    # ---- the loop (the engine's thread) ---------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._closed and not self.running and not len(self.queue) and not len(self._calls):
                    self._cv.wait(self.config.idle_poll_s)
                    self._expire_waiting()
                if self._closed:
                    break
            self._calls.run_pending()
            self.step()
        with self._stepping:
            self._cancel_running()

    def _cancel_running(self) -> None:
        for active in self._take_running():
            active.req.finish("cancelled")  # a reason it finished with stays
            self._end(active.req, active)

    def _room(self) -> bool:
        free = max(0, self.config.max_running - len(self.running) - self._admitting)
        return len(self.queue) < self.config.max_waiting + free

    def _expire_waiting(self) -> None:
        for req in self.queue.expire(time.monotonic()):
            req.error = RequestExpired("the deadline passed while the request waited in the queue")
            self._end(req)

    def _pop_admissible(self) -> list[ServeRequest]:
        """Waiting requests that may start now, fairest tenant first, within each tenant's places and KV share
        (``lending.admission_round``: a tenant alone fills every place, paused back when another waits)."""
        held: Counter[str] = Counter()  # KV bytes by tenant (the backend's figures): running, then popped
        for r in self.running:
            held[r.req.tenant] += self.backend.kv_bytes(r.kv.capacity)
        plan = admission_round(self.running, self.queue, held, self._kv_need, self.config)
        for active in plan.pause:
            active.paused = True
        for active in plan.resume:
            active.paused = False
        self._admitting = len(plan.admit)
        return plan.admit

    def _kv_need(self, req: ServeRequest) -> int:
        """Bytes of KV ``req`` holds once admitted: what the backend says a cache of its capacity (prompt, answer,
        one step) costs."""
        return self.backend.kv_bytes(Active.capacity(req, self._spec(req)))

    def _spec(self, req: ServeRequest) -> DraftingSpec:
        """``req``'s drafting: its budget widened where the measured cost is flat, but back at its configured
        width where the widened step would not fit the backend's slot (the widening never refuses a request)."""
        cost, most = self.backend.curve.cost if self.backend.curve is not None else None, self.backend.max_capacity
        spec = drafting_spec(req.config, cost, self.backend.widest_tree)
        return spec if most is None or Active.capacity(req, spec) <= most else drafting_spec(req.config, cost)

    def _take_running(self) -> list[Active]:
        with self._cv:
            taken = list(self.running)
            self.running.clear()
        return taken

    def _admit(self, req: ServeRequest) -> None:
        """Build the request's running state whole (its window resolved before its KV is sized); a request
        that cannot be built fails alone. Its cached prompt prefix is looked up in ``_step``, the one place."""
        try:
            check_in_vocab(req.prompt_ids, self.vocab_size)
            spec = self._spec(req)  # a default Jacobi window sized by measured cost
            chooser = TokenChooser.for_request(self.generation_config, spec.config, len(req.prompt_ids),
                                               req.stats.seed, self.device)
            drafting = build_drafting(spec, req.prompt_ids, req.trie, self.eos, self.drafts, req.drafter)
            kv = self.backend.kv_for(Active.capacity(req, spec))  # the backend may refuse it (too long, no room)
            active = Active(req, spec, drafting, kv, self.backend, chooser, self.eos)
            req.advance(Phase.PREFILL)
        except Exception as exc:  # e.g. a generation_config the chooser refuses: this request fails
            req.error, active = exc, None
        with self._cv:
            self._admitting -= 1
            self.running += [active] if active is not None else []
        if active is None:
            self._end(req)

    def _end(self, req: ServeRequest, active: Active | None = None) -> None:
        """Free a request's place and cache, and tell its caller (exactly once)."""
        if req.phase is Phase.DONE:
            return
        if active is not None:
            active.release()
            self.backend.release(active.kv)
            with self._cv:
                if active in self.running:
                    self.running.remove(active)
        elif req.trie_filled:  # it never ran: its prompt branches still leave a shared trie
            req.trie.remove_owner(req.owner)
        req.advance(Phase.DONE)
        req.stats.new_tokens = len(req.output)
        req.stats.wall_s = time.perf_counter() - req.submitted
        if req.on_done is not None:
            req.on_done(req, req.error)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    # ---- one step: plan -> pack -> run -> apply ---------------------------------------------------
    def _step(self) -> None:
        now = time.monotonic()
        live: list[Active] = []
        for active in list(self.running):
            if active.req.cancelled.is_set() or active.req.expired(now):
                active.req.finish("cancelled")
                self._end(active.req, active)
            elif not active.paused:
                live.append(active)
        # the prefix cache's one lookup: before a prompt's first chunk, and again until that chunk runs (a
        # prompt prefilled since may cover more of it)
        for active in live:
            if active.req.phase is Phase.PREFILL:
                self.prefix_hit_tokens += active.take_prefix(self.prefix_cache)
        try:
            self._step_phases(live)
        except Exception as exc:  # one request's input failed the shared forward: find it, step the rest
            log.warning("step of %d requests failed (%s); stepping them apart", len(live), type(exc).__name__)
            for active, error in isolate(live, self._step_phases, exc):
                log.error("request %s failed its step: %s: %s", active.req.id, type(error).__name__, error)
                active.req.error = error
                self._end(active.req, active)

    def _step_phases(self, live: Sequence[Active]) -> None:
        """plan -> pack -> run -> apply for ``live``, each phase under the profiler (a no-op unless profiling);
        raises, having changed nothing, when the forward fails."""
        phases, started, curve = Phases(self.profile), time.perf_counter(), self.backend.curve
        adaptive = self.config.adaptive and curve is not None
        with phases("draft"):
            plan = plan_step(live, self.limits, self.gains if adaptive else None,
                             curve.cost if adaptive and curve is not None else None, started, self.usage.at(started))
        if plan.empty:
            return
        step = {active.id: active for active in live}  # the plan names its requests by id
        with phases("pack"):
            packed = pack_step(plan, {i: active.kv for i, active in step.items()})
        with phases.forward(packed.attention):
            logits = self.backend.run(packed)  # [K, vocab]
        with phases("choose"):
            predicted = choose(logits, plan, packed, {i: active.chooser for i, active in step.items()})  # [K]
        with phases.applying(lambda: sum(step[i].emitted for i in plan.ids)):
            self._apply(plan, packed, logits, predicted, step, Emitting(self._decode, phases))
        ended = phases.step(started, bool(plan.chunks), len(packed), bool(self.running))
        self.usage.charge(step_tokens(plan, lambda i: step[i].req.tenant), ended - started, ended)

    def _apply(self, plan: StepPlan, packed: PackedStep, logits: torch.Tensor, predicted: list[int],
               step: dict[str, Active], out: Emitting) -> None:
        """Count the forward, apply its results (apply.py) to the step's requests (by id), end those finished."""
        ran = Forward(len(packed), len(plan.ids), self.backend.kernel_name(len(packed)))
        self.forwards += 1
        self.forward_sizes[ran.tokens] += 1
        if self.on_forward is not None:
            self.on_forward(ran.tokens, ran.batch)
        for active, error in apply_step(plan, packed, logits, predicted, ran, step, self.gains, self.prefix_cache,
                                        out):
            log.error("request %s failed applying its step: %s: %s", active.req.id, type(error).__name__, error)
            active.req.error = error
            self._end(active.req, active)
        for i in plan.ids:
            if step[i].req.finished:
                self._end(step[i].req, step[i])
        for c in plan.chunks:  # a prompt now in the cache decodes from the next step on
            if c.last and step[c.id].req.phase is Phase.PREFILL:
                step[c.id].req.advance(Phase.DECODE)
