"""The process's kernel sets: every engine on one model shares its twins, packed weights and calibration.

    kernels = shared_kernels(model)            # "auto": every kernel, measured once, the faster per size
    kernels = shared_kernels(model, "stock")   # one twin forced (not measured)
    calibrate_once(kernels, probe, counts, 3)  # the first engine to start measures; later ones reuse it
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence

from torch import nn

from .kernels import KERNELS, KernelSet
from .ragged import RAGGED_ATTENTION

AUTO = "auto"  # every kernel, the one measured faster at each forward size runs it
CHOICES = (AUTO, *KERNELS)  # what shared_kernels (and LookaheadDecoder's kernels=) accept
_SHARED: weakref.WeakKeyDictionary[nn.Module, dict[str, KernelSet]] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def shared_kernels(model: nn.Module, choice: str = AUTO) -> KernelSet:
    """The process's ragged-attention KernelSet of ``model`` for ``choice``: "auto" holds every kernel; a
    kernel's name forces that twin alone (engines then skip the measurement)."""
    if choice not in CHOICES:
        raise ValueError(f"kernels must be one of {CHOICES} or a KernelSet, not {choice!r}")
    with _LOCK:
        sets = _SHARED.setdefault(model, {})
        if choice not in sets:
            sets[choice] = KernelSet(model, RAGGED_ATTENTION, KERNELS if choice == AUTO else (choice,))
        return sets[choice]


def calibrate_once(kernels: KernelSet, probe: Callable[[nn.Module, int], None], counts: Sequence[int],
                   repeats: int) -> bool:
    """Measure ``kernels`` unless it already has a curve (engines sharing a set measure it once);
    returns whether this call measured."""
    with _LOCK:
        if kernels.curve is not None:
            return False
        kernels.calibrate(probe, counts, repeats)
        return True
