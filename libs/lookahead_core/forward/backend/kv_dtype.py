"""What the CPU backend's request caches hold: the model's dtype, or IEEE half where every forward reads them
through the attention kernel.

A cache entry of SmolLM2-135M is 46 KB in fp32 (30 layers, 3 kv heads of 64): at 16 clients of ~800 entries the
caches outweigh the Q4_1 weights six times over. Half halves it (llama.cpp's default cache type is f16 too). It is
offered only where no forward reads the cache otherwise than by ``attend.cpp`` (which widens each half entry to
fp32 exactly as it reads it, the same in every forward): a model on the block kernel, whose attention runs every
forward, one-token ones too, by ``attend.invariant_rows``' build. sdpa, the stock path of every other model,
takes no cache of another dtype than its queries'. Speculation stays exact: a request's entries are rounded once,
as they are written, whichever forward writes them, and every forward reads the same stored values.

    cache_dtype(model, "auto")      # torch.float16 for a quantized model here, else the model's dtype
    cache_dtype(model, "float16")   # ValueError where no half cache can be read here
"""

from __future__ import annotations

import torch
from torch import nn

from ...kv.kvstore import KVShape
from ..attend import invariant_rows
from ..placement import model_placement
from ..ragged import INVARIANT_ATTR

AUTO = "auto"  # half where it can be read here (``half_cache_ok``), else the model's dtype
MODEL = "model"  # the model's dtype
FLOAT16 = "float16"  # IEEE half, refused where it cannot be read here
KV_DTYPES = (AUTO, MODEL, FLOAT16)  # what [generator] kv_dtype accepts


def half_cache_ok(model: nn.Module) -> bool:
    """Whether every forward of ``model`` reads its cache through the attention kernel (which takes half): it is
    on the block kernel and a build of the kernel whose output tile divides its heads runs here."""
    if not getattr(model.config, INVARIANT_ATTR, ""):
        return False
    return invariant_rows(KVShape.of(model).head_dim, *model_placement(model)) is not None


def cache_dtype(model: nn.Module, choice: str) -> torch.dtype:
    """The dtype of ``model``'s request caches for ``[generator] kv_dtype`` = ``choice`` (one of ``KV_DTYPES``)."""
    if choice not in KV_DTYPES:
        raise ValueError(f"kv_dtype must be one of {', '.join(KV_DTYPES)}; got {choice!r}")
    dtype = model_placement(model)[1]
    if choice == MODEL:
        return dtype
    if half_cache_ok(model):
        return torch.float16
    if choice == FLOAT16:
        raise ValueError("kv_dtype = \"float16\" needs a model served on the block kernel (weights = \"file\" or "
                         "\"int8\") whose attention kernel builds here; use \"auto\" or \"model\"")
    return dtype
