"""Where a step's time goes (opt-in: ``StepScheduler.profile``; ``bench ... --profile`` reads it).

Phases, in a step's order (seconds summed over the profiled steps):

- ``draft``: plan the step (every decode's proposers build its tree; budgets are split);
- ``pack``: lay the plan out in one row and build the attention masks;
- ``layers``: the forward minus attention and the LM head (Linear layers, norms, rotary, embedding);
- ``attention``: ragged attention (each request's KV write, view and sdpa, layer by layer);
- ``lm_head``: the output projection of the kept rows;
- ``choose``: the token after every kept row (argmax, or each request's processors and draws);
- ``accept``: each path's acceptance and KV compaction, the Jacobi windows' guesses, prefix-cache puts;
- ``emit``: trim at EOS / length / stop strings (detokenizing) and hand the tokens to the caller.

``report`` adds ``other`` (a step's time outside those phases: expiry, admission, locks) and ``between``
(the engine's time between two steps while it had requests running: its loop, and waiting for the
cores and the GIL that the service's other threads hold: streaming, retrieval, feedback). Decode-only
steps and steps that also prefill a prompt chunk are reported apart.

Against the memory-bandwidth floor: each step's forward must read every weight once and the K/V of
every cache entry it attends over, so ``report`` also gives the MB of weights and of KV read per step,
the forward's effective GB/s (those bytes over layers + attention + lm_head), the machine's read
bandwidth measured with the engine's threads when it calibrated (``forward.bandwidth``), and the
floor those bytes set at that bandwidth.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ..forward.bandwidth import floor_seconds, kv_bytes_per_entry, latest, weight_bytes
from ..forward.step_layout import PLAN_KWARG, StepLayout

PHASES = ("draft", "pack", "layers", "attention", "lm_head", "choose", "accept", "emit")
FORWARD = ("layers", "attention", "lm_head")  # the phases of the forward itself (what the bytes are read in)
READS = ("weights", "kv")  # bytes a forward reads: every weight once, the K/V of every entry attended over
MB = 1e6  # bytes per MB in the report
DECODE, PREFILL = "decode", "prefill"  # steps of decode trees only; steps that also prefill a prompt chunk
KINDS = (DECODE, PREFILL)


@dataclass
class PhaseTimes:
    """Seconds by phase over the steps of one kind."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    steps: int = 0  # steps of this kind
    tokens: int = 0  # tokens in their forwards
    emitted: int = 0  # tokens they emitted
    busy: float = 0.0  # seconds from each step's start to its end (phases + the step's own overhead)
    between: float = 0.0  # seconds between a step and the one before it while requests were running
    read: dict[str, float] = field(default_factory=lambda: dict.fromkeys(READS, 0.0))  # bytes read, by kind

    def report(self) -> dict[str, Any]:
        """Milliseconds per step by phase, ``other`` (the step's time outside its phases) and ``between``
        (the engine's time between steps while it had work), tokens per forward and emitted per step,
        and the forward against the bandwidth floor (``floor``)."""
        n = max(self.steps, 1)
        ms = {k: 1000.0 * v / n for k, v in self.seconds.items()}
        ms["other"] = max(0.0, 1000.0 * self.busy / n - sum(ms.values()))
        ms["between"] = 1000.0 * self.between / n
        return {"steps": self.steps, "ms_per_step": ms, "tokens_per_forward": self.tokens / n,
                "emitted_per_step": self.emitted / n, "floor": self.floor()}

    def floor(self) -> dict[str, float | None]:
        """Per step: MB of weights and KV read, the forward's ms and effective GB/s, the machine's measured
        read GB/s, the floor's ms at it and the forward's ratio to it (None where not measured)."""
        n = max(self.steps, 1)
        nbytes = sum(self.read.values()) / n
        forward_s = sum(self.seconds[k] for k in FORWARD) / n
        machine = latest()
        floor_s = floor_seconds(nbytes, machine) if machine is not None else None
        return {"weights_mb": self.read["weights"] / n / MB, "kv_mb": self.read["kv"] / n / MB,
                "forward_ms": 1000.0 * forward_s, "gb_per_s": nbytes / forward_s / 1e9 if forward_s > 0 else None,
                "machine_gb_per_s": machine.gb_per_s if machine is not None else None,
                "floor_ms": 1000.0 * floor_s if floor_s is not None else None,
                "x_floor": forward_s / floor_s if floor_s else None}


@dataclass
class StepProfile:
    """Per-phase seconds of the steps an engine ran while it was attached: decode-only steps apart from
    steps that also carry a prompt chunk (``KINDS``)."""

    kinds: dict[str, PhaseTimes] = field(default_factory=lambda: {k: PhaseTimes() for k in KINDS})
    current: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))  # this step's
    reading: dict[str, float] = field(default_factory=lambda: dict.fromkeys(READS, 0.0))  # this step's bytes
    _last_end: float | None = None  # when the previous step ended, if it left requests running
    _inner: list[float] = field(default_factory=list)  # per open phase: seconds of the phases inside it

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as ``name`` of the step under way; a phase timed inside it is taken out of its
        seconds (``emit`` inside ``accept``)."""
        t0 = time.perf_counter()
        self._inner.append(0.0)
        try:
            yield
        finally:
            spent = time.perf_counter() - t0
            self.current[name] += spent - self._inner.pop()
            if self._inner:
                self._inner[-1] += spent

    def forward(self, seconds: float, attention: float) -> None:
        """The step's forward took ``seconds``, ``attention`` of them in attention (the LM head is hooked)."""
        self.current["layers"] += seconds - attention
        self.current["attention"] += attention

    def step(self, started: float, prefill: bool, tokens: int, emitted: int, running: bool) -> None:
        """The step under way (begun at ``started``, perf_counter; ``prefill``: it carried a prompt chunk)
        ended now; ``running``: requests are still running after it."""
        now = time.perf_counter()
        kind = self.kinds[PREFILL if prefill else DECODE]
        for name, spent in self.current.items():
            kind.seconds[name] += spent
        for name, nbytes in self.reading.items():
            kind.read[name] += nbytes
        self.current = dict.fromkeys(PHASES, 0.0)
        self.reading = dict.fromkeys(READS, 0.0)
        kind.steps += 1
        kind.tokens += tokens
        kind.emitted += emitted
        kind.busy += now - started
        if self._last_end is not None:
            kind.between += max(0.0, started - self._last_end)
        self._last_end = now if running else None

    def report(self) -> dict[str, dict[str, Any]]:
        """``PhaseTimes.report()`` of each kind that ran."""
        return {name: kind.report() for name, kind in self.kinds.items() if kind.steps}


class Phases:
    """The profiler around one step's phases, a no-op without a profile: the step reads

        with phases("draft"): ...                 # any phase by name (a phase inside another leaves it)
        with phases.forward(packed.attention): ...  # layers and attention (the LM head by hooks)
        with phases.applying(outputs): ...        # accept, less the emits inside; ``outputs()``: the step's
        phases.step(started, prefill, tokens, running)  # requests' output tokens, read before and after
    """

    def __init__(self, profile: StepProfile | None) -> None:
        self.profile = profile
        self.emitted = 0  # tokens the step emitted (``applying``)

    def __call__(self, name: str) -> AbstractContextManager[None]:
        return self.profile.phase(name) if self.profile is not None else nullcontext()

    def forward(self, attention: StepLayout) -> AbstractContextManager[None]:
        """Time the forward over ``attention`` (its attention calls timed apart) as layers and attention."""
        return self._forward(self.profile, attention) if self.profile is not None else nullcontext()

    @staticmethod
    @contextmanager
    def _forward(profile: StepProfile, attention: StepLayout) -> Iterator[None]:
        attention.timed = True
        t0 = time.perf_counter()
        with running(profile):
            yield
        profile.forward(time.perf_counter() - t0, attention.attention_s)

    def applying(self, outputs: Callable[[], int]) -> AbstractContextManager[None]:
        """Time applying the step as ``accept`` (its emits as ``emit``) and count the tokens it emitted."""
        return self._applying(self.profile, outputs) if self.profile is not None else nullcontext()

    @contextmanager
    def _applying(self, profile: StepProfile, outputs: Callable[[], int]) -> Iterator[None]:
        before = outputs()
        with profile.phase("accept"):
            yield
        self.emitted = outputs() - before

    def step(self, started: float, prefill: bool, tokens: int, running: bool) -> float:
        """Book the step begun at ``started`` (``StepProfile.step``); the time it ended (perf_counter)."""
        ended = time.perf_counter()
        if self.profile is not None:
            self.profile.step(started, prefill, tokens, self.emitted, running)
        return ended


# The LM head's time goes to the profile of the forward running on this thread (twins are shared by
# every engine on a model, so the hooks are registered once and look the profile up).
_RUNNING = threading.local()
_WATCHED: weakref.WeakSet[nn.Module] = weakref.WeakSet()
_WATCH_LOCK = threading.Lock()


def watch_heads(twins: Iterable[nn.Module]) -> None:
    """Hook every twin once: its LM head, so a profiled forward (``running``) books its time as ``lm_head``;
    the twin, so the forward's bytes of weights and KV read are booked too."""
    with _WATCH_LOCK:
        for twin in twins:
            if twin not in _WATCHED:
                per_step, per_entry = weight_bytes(twin), kv_bytes_per_entry(twin)
                twin.register_forward_pre_hook(
                    lambda _m, _a, kw, w=per_step, e=per_entry: _reads(kw, w, e), with_kwargs=True)
                _WATCHED.add(twin)
            head = twin.get_output_embeddings()
            if head is None or head in _WATCHED:
                continue
            head.register_forward_pre_hook(lambda *_: _head(start=True))
            head.register_forward_hook(lambda *_: _head(start=False))
            _WATCHED.add(head)


def _reads(kwargs: dict[str, Any], weights: int, per_entry: int) -> None:
    """Book a profiled forward's reads: every weight once, and each segment's past + own entries' K/V."""
    profile: StepProfile | None = getattr(_RUNNING, "profile", None)
    plan = kwargs.get(PLAN_KWARG)
    layout = plan if isinstance(plan, StepLayout) else getattr(plan, "plan", None)  # a backend's own metadata
    if profile is None or not isinstance(layout, StepLayout):
        return
    profile.reading["weights"] += weights
    profile.reading["kv"] += per_entry * sum(seg.past + seg.q for seg in layout.segments)


def _head(start: bool) -> None:
    profile: StepProfile | None = getattr(_RUNNING, "profile", None)
    if profile is None:
        return
    now = time.perf_counter()
    if start:
        _RUNNING.head_started = now
        return
    spent = now - _RUNNING.head_started
    profile.current["lm_head"] += spent
    profile.current["layers"] -= spent  # the whole forward is booked to layers (and attention) first


@contextmanager
def running(profile: StepProfile) -> Iterator[None]:
    """The forward in this block is ``profile``'s (its LM head's time is booked there)."""
    _RUNNING.profile = profile
    try:
        yield
    finally:
        _RUNNING.profile = None
