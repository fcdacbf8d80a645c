"""The process's kernel sets: every engine on one model shares its twins, packed weights and calibration.

    kernels = shared_kernels(model)            # "auto": the sharing kernels, measured once, the faster per size
    kernels = shared_kernels(model, "stock")   # one twin forced (not measured)
    calibrate_once(kernels, probe, counts, 3)  # the first engine to start measures; later ones reuse it
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence

import torch
from torch import nn

from .bandwidth import read_bandwidth
from .kernels import KERNELS, SHARING, KernelSet
from .ragged import RAGGED_ATTENTION

AUTO = "auto"  # the kernels that share the model's weights, the one measured faster at each size runs it
CHOICES = (AUTO, *KERNELS)  # what shared_kernels (and LookaheadDecoder's kernels=) accept
_SHARED: weakref.WeakKeyDictionary[nn.Module, dict[tuple[str, int], KernelSet]] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def shared_kernels(model: nn.Module, choice: str = AUTO, threads: int | None = None) -> KernelSet:
    """The process's ragged-attention KernelSet of ``model`` for ``choice``: "auto" holds the kernels that
    share the model's weights (``kernels.SHARING``); a kernel's name forces that twin alone (engines then
    skip the measurement). ``threads``: the intra-op threads its forwards run with (None: this thread's)."""
    if choice not in CHOICES:
        raise ValueError(f"kernels must be one of {CHOICES} or a KernelSet, not {choice!r}")
    with _LOCK:
        sets = _SHARED.setdefault(model, {})
        key = (choice, torch.get_num_threads() if threads is None else threads)
        if key not in sets:
            sets[key] = KernelSet(model, RAGGED_ATTENTION, SHARING if choice == AUTO else (choice,), key[1])
        return sets[key]


def calibrate_once(kernels: KernelSet, probe: Callable[[nn.Module, int], None], counts: Sequence[int],
                   repeats: int) -> bool:
    """Measure ``kernels`` unless it already has a curve (engines sharing a set measure it once), and the
    machine's read bandwidth with the same threads (``bandwidth.latest()``: the step profile's floor);
    returns whether this call measured."""
    with _LOCK:
        if kernels.curve is not None:
            return False
        read_bandwidth()
        kernels.calibrate(probe, counts, repeats)
        return True
