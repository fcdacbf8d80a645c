"""Forward backends: what runs a packed step's one forward and owns its KV (``base.Backend``).

``cpu.CpuBackend`` is the CPU's (kernel twins chosen by measurement, C++ kernels, ragged attention, a cache per
request); ``generic.TorchBackend`` runs on any device with torch ops only (a preallocated KV pool, one attention
call per layer, optional ``exact_numerics``). ``choice.make_backend`` is the one place that picks one.
"""

from .base import Backend, BackendSpec, KVTooLong, check_fits
from .choice import make_backend

__all__ = ["Backend", "BackendSpec", "KVTooLong", "check_fits", "make_backend"]
