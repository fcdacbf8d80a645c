"""Model and tokenizer loading: any Hugging Face causal LM, any GGUF file, and the built-ins.

``--model`` / ``[model] name`` is a built-in name (catalog.py), a path to a ``.gguf`` file, a
Hugging Face directory or a hub id. A GGUF file (a built-in's, or the caller's) is de-quantized by
transformers once (SmolLM2-135M ~25 s, Qwen2.5-0.5B ~50 s) into a directory of the requested dtype
under the cache, keyed by the file's path, size and mtime, so later loads take seconds and a changed
file converts again. Everything here works offline (``HF_HUB_OFFLINE=1``); fetched built-ins must be
fetched first (``lookahead-rag models fetch NAME``, fetch.py).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from .catalog import converted_dir, gguf_of
from .defaults import DEFAULT_MODEL
from .forward.quant.load import BFLOAT16, FILE, FLOAT32, INT4, INT8, QUANTIZED, WEIGHTS, quantize_model
from .forward.quant.qdot import INT8 as ACT_INT8
from .forward.quant.torchao_weights import weight_only
from .forward.support import check_supported

log = logging.getLogger(__name__)


DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_DTYPE = "float32"  # what a GGUF converts to when no dtype is asked for (the tokenizer, the config)


class UnsupportedModelError(ValueError):
    """A model file this product cannot load (said in one line)."""


def convert_gguf(gguf: Path, target: Path, dtype: str = "float32") -> None:
    """De-quantize ``gguf`` into a Hugging Face directory of ``dtype`` weights at ``target`` (atomically).

    UnsupportedModelError, in one line, for a file transformers cannot read (an architecture or a
    quantization type it does not know, or not a GGUF file at all)."""
    log.info("converting %s to %s (once; cached at %s)", gguf, dtype, target)
    try:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=DTYPES[dtype])
    except (ValueError, KeyError, NotImplementedError, TypeError, OSError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UnsupportedModelError(f"transformers cannot read {gguf.name}: {first}") from exc
    # A GGUF-loaded model refuses save_pretrained while it still carries its quantizer.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        os.replace(tmp, target)  # atomic: a half-written copy is never seen as done
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not target.exists():
            raise


def resolve_model_path(name_or_path: str, dtype: str | None = None) -> str:
    """A built-in name or a GGUF file becomes its converted local directory (converted on first use);
    a directory or hub id passes through. ``dtype`` None (the tokenizer, the config) takes any
    conversion already cached, else converts to float32."""
    gguf = gguf_of(name_or_path)
    if gguf is None:
        return name_or_path
    target = converted_dir(gguf, dtype or DEFAULT_DTYPE)
    if dtype is None:
        done = [d for d in (converted_dir(gguf, name) for name in DTYPES) if (d / "config.json").exists()]
        target = done[0] if done else target
    if not (target / "config.json").exists():
        convert_gguf(gguf, target, dtype or DEFAULT_DTYPE)
    return str(target)


def served_weights(weights: str | None, name_or_path: str, device: str) -> str | None:
    """What ``weights`` serves for this model: "file" is the GGUF's blocks only for a GGUF on a CPU (else the
    dense dtype: None); "float32" is the dense default (None); "int8" the block kernel's on a CPU, torchao's
    elsewhere; "int4" torchao's, on CUDA only."""
    if weights is not None and weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {', '.join(WEIGHTS)}; got {weights!r}")
    on_cpu = device == "cpu"
    if weights == FILE:
        return FILE if on_cpu and gguf_of(name_or_path) is not None else None
    if weights == INT4 and on_cpu:
        raise ValueError("weights = \"int4\" runs torchao's int4 kernels on CUDA only (a CPU model: \"file\" or "
                         "\"int8\", by the block kernel)")
    return None if weights == FLOAT32 else weights


def load_tokenizer(name_or_path: str = DEFAULT_MODEL) -> PreTrainedTokenizerBase:
    """The tokenizer of a built-in model, a local path or a hub id."""
    return AutoTokenizer.from_pretrained(resolve_model_path(name_or_path))


def load_model(
    name_or_path: str = DEFAULT_MODEL,
    dtype: torch.dtype | str = torch.float32,
    device: str = "cpu",
    attn_implementation: str = "sdpa",
    weights: str | None = None,
    activations: str = ACT_INT8,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load (model, tokenizer) in eval mode on ``device``; built-in names are converted once and
    cached. ``dtype`` is a torch dtype or its name ("float32", "bfloat16", "float16"); ``weights``
    (``quant.load.WEIGHTS``; None: dense ``dtype``) what the products run on: "file" serves a GGUF's own
    blocks on a CPU (``served_weights`` says what a choice becomes), "int8" per-channel int8; ``activations``
    what quantized weights multiply (``quant.qdot.ACTIVATIONS``: int8 where the int8 kernel runs, or float32)."""
    served = served_weights(weights, name_or_path, device)
    if served in QUANTIZED and device == "cpu":
        model, tok = load_model(name_or_path, torch.float32, device, attn_implementation)
        return quantize_model(model, gguf_of(name_or_path), served, activations), tok
    if served in (INT8, INT4):  # off the CPU: the dense model in ``dtype``, its Linears weight-only by torchao
        model, tok = load_model(name_or_path, dtype, device, attn_implementation)
        return weight_only(model, served), tok
    if served == BFLOAT16:
        dtype = torch.bfloat16
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
        dtype = DTYPES[dtype]
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {device!r} asked for, but torch sees no CUDA device here")
    path = resolve_model_path(name_or_path, next(k for k, v in DTYPES.items() if v == dtype))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attn_implementation)
    check_supported(model)  # refuse attention the tree mask would get wrong (support.py)
    model.to(device).eval()
    tok = AutoTokenizer.from_pretrained(path)
    return model, tok

