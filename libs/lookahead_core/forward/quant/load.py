"""A model's weights in the block formats it is served in: a GGUF file's own blocks, or int8 from any source.

``[model] weights``:

- ``file`` (the default for a GGUF on a CPU): every Linear and the embedding read the blocks the file holds
  (Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0; dense F32/F16/BF16 tensors through the same loop); a block
  type with no kernel is de-quantized with one warning line naming it, never served wrong;
- ``int8``: per-channel symmetric int8 of the fp32 weights, from any source;
- ``float32`` / ``bfloat16``: dense weights, the stock kernels (``models.load_model``).

The model is first loaded as transformers converts it (config, norms, biases, the fp32 copy cached by
``models.py``); ``quantize_model`` then swaps each Linear for a ``QuantLinear`` over the file's blocks and
drops the fp32 weights. Each swapped weight is checked against the converted one on a sample of rows (the
file's values, within fp32 rounding), so a wrong mapping or permutation is refused, not served.

    model = quantize_model(model, gguf_path, "file")   # model.config.lookahead_weights == "Q4_1+Q8_0"
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..memory import drop_file_pages, release_freed
from .blocks import NotWholeBlocks, Packed, UnsupportedBlocks, dequantized, pack, quantize_int8
from .lean import join_layers
from .linear import QuantEmbedding, QuantLinear, QuantWeight, block_kernel
from .qdot import ACTIVATIONS, int8_kernel
from .qdot import INT8 as INT8_X
from .torchao_weights import FORMAT_ATTR as TORCHAO_ATTR

log = logging.getLogger(__name__)

FILE = "file"  # run the blocks the GGUF file holds
FLOAT32 = "float32"
BFLOAT16 = "bfloat16"
INT8 = "int8"  # per-channel int8 of the fp32 weights
INT4 = "int4"  # int4 weight-only by torchao (a CUDA model on the generic backend: torchao_weights)
WEIGHTS = (FILE, FLOAT32, BFLOAT16, INT8, INT4)  # what [model] weights accepts
QUANTIZED = (FILE, INT8)  # the choices served by the block kernel
CONFIG_ATTR = "lookahead_weights"  # the model config's attribute naming its served format ("" / absent: dense)
CHECK_ROWS = 16  # rows of each swapped weight compared with the converted fp32 weight
CHECK_RTOL = 1e-5  # allowed |difference| relative to the weight's largest value (one fp32 rounding is ~6e-8)
PERMUTED = {"llama": ("attn_q", "attn_k")}  # GGUF tensors llama.cpp's converter permuted for its rotary layout

# GGUF tensor name -> the Hugging Face module it is (Llama and Qwen2 decoder layers)
LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.weight")


class BadModelFile(ValueError):
    """A GGUF file this product will not serve (said in one line)."""


def weight_format(model: nn.Module) -> str:
    """The served weights' format: e.g. "Q4_1+Q8_0" (the file's block types, most used first), "int8", torchao's
    ("int8 (torchao)") or the dense dtype ("float32")."""
    config = getattr(model, "config", None)
    served = getattr(config, CONFIG_ATTR, "") or getattr(config, TORCHAO_ATTR, "")
    if served:
        return served
    param = next(model.parameters(), None)
    return str(param.dtype).removeprefix("torch.") if param is not None else "unknown"


def is_quantized(model: nn.Module) -> bool:
    """Whether ``model``'s products run on the block kernel (every twin but stock is then refused)."""
    return bool(getattr(getattr(model, "config", None), CONFIG_ATTR, ""))


def _module(model: nn.Module, path: str) -> tuple[nn.Module, str]:
    parent, _, name = path.rpartition(".")
    return model.get_submodule(parent), name


def _reverse_permutation(rows: int, heads: int) -> np.ndarray:
    """The row order transformers' GGUF loader gives llama's q/k weights (llama.cpp's converter interleaved each
    head's rotary halves): the same reshape applied to row indices."""
    dim = rows // heads // 2
    return np.arange(rows).reshape(heads, dim, 2).swapaxes(2, 1).reshape(rows)


def _checked(weight: QuantWeight, reference: torch.Tensor, what: str) -> None:
    """BadModelFile unless a sample of ``weight``'s rows matches the converted fp32 ``reference``."""
    rows = weight.shape[0]
    sample = torch.linspace(0, rows - 1, min(CHECK_ROWS, rows)).long()
    got, want = weight.lookup(sample).double(), reference.detach()[sample].double()
    if got.shape != want.shape:
        raise BadModelFile(f"{what}: the file's tensor is {tuple(weight.shape)}, the model's {tuple(reference.shape)}")
    scale = float(want.abs().max()) or 1.0
    if float((got - want).abs().max()) > CHECK_RTOL * scale:
        raise BadModelFile(f"{what}: the file's blocks do not match the converted weights (mapping or permutation)")


def _packed(tensor: object, rows: int, cols: int, name: str) -> Packed:
    """One GGUF tensor's blocks; a type with no kernel de-quantized with a one-line warning."""
    raw, qtype = tensor.data, tensor.tensor_type  # type: ignore[attr-defined]
    try:
        return pack(raw, qtype, rows, cols)
    except NotWholeBlocks as exc:
        raise BadModelFile(f"{name}: {exc}") from exc
    except UnsupportedBlocks as exc:
        log.warning("%s: %s; de-quantized to fp32 (served exactly, without the block kernel's speed)", name, exc)
        return dequantized(raw, qtype, rows, cols)


def _file_weights(model: nn.Module, gguf: Path) -> dict[str, QuantWeight]:
    """Module path -> its weight from the file's blocks (every Linear of the layers, the embedding, lm_head)."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(gguf))
    except (ValueError, OSError, IndexError) as exc:
        raise BadModelFile(f"{gguf.name} is not a readable GGUF file ({type(exc).__name__}: {exc})") from exc
    field = reader.fields.get("general.architecture")
    arch = bytes(field.parts[field.data[0]]).decode() if field is not None else ""
    heads, kv_heads = model.config.num_attention_heads, model.config.num_key_value_heads
    out: dict[str, QuantWeight] = {}
    for t in reader.tensors:
        cols, rows = (int(n) for n in t.shape[:2]) if len(t.shape) >= 2 else (0, 0)
        if t.name == "token_embd.weight":
            path = "model.embed_tokens"
        elif t.name == "output.weight":
            path = "lm_head"
        elif (m := BLOCK.fullmatch(t.name)) and m.group(2) in LAYER_NAMES:
            path = f"model.layers.{m.group(1)}.{LAYER_NAMES[m.group(2)]}"
        else:
            continue
        weight = QuantWeight.of(_packed(t, rows, cols, t.name))
        kind = m.group(2) if path.startswith("model.layers.") and m else ""
        if kind in PERMUTED.get(arch, ()):
            weight = weight.rows(torch.from_numpy(_reverse_permutation(rows, heads if kind == "attn_q" else kv_heads)))
        out[path] = weight
    if "lm_head" not in out and "model.embed_tokens" in out:
        out["lm_head"] = out["model.embed_tokens"]  # tied: one copy of the blocks for both
    return out


def _int8_weights(model: nn.Module) -> dict[str, QuantWeight]:
    """Module path -> per-channel int8 of its fp32 weight (every Linear, the embedding)."""
    out: dict[str, QuantWeight] = {}
    seen: dict[int, QuantWeight] = {}  # a tied weight (embedding and lm_head) is quantized once
    for path, module in model.named_modules():
        if isinstance(module, nn.Linear | nn.Embedding):
            key = id(module.weight)
            if key not in seen:
                seen[key] = QuantWeight.of(quantize_int8(module.weight.detach().float().numpy()))
            out[path] = seen[key]
    return out


def quantize_model(model: nn.Module, gguf: Path | None, weights: str, activations: str = INT8_X) -> nn.Module:
    """``model`` (a converted fp32 CPU model) with its Linear layers and embedding on the block kernel, in place.

    ``weights``: FILE (the GGUF ``gguf``'s own blocks) or INT8. ``activations``: ``qdot.ACTIVATIONS`` (int8:
    the int8-activation kernel where it runs here, else fp32 with one log line). BadModelFile where the file
    cannot be read or its blocks do not match the model; linear.NoBlockKernel where no build of the kernel runs
    here."""
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations must be one of {', '.join(ACTIVATIONS)}; got {activations!r}")
    if weights not in QUANTIZED:
        raise ValueError(f"quantize_model serves {QUANTIZED}, not {weights!r}")
    block_kernel()  # before any work: refused in one line where no build runs here
    if weights == FILE:
        if gguf is None:
            raise BadModelFile("[model] weights = \"file\" needs a GGUF model (a built-in or a .gguf path)")
        found = _file_weights(model, gguf)
    else:
        found = _int8_weights(model)
    install(model, found, check=weights == FILE, activations=activations)
    del found  # the blocks as read (before tiling for the int8 kernel) go with the swapped fp32 weights
    release_freed()  # ... back to the system, not to malloc's free lists
    return model


def install(model: nn.Module, found: dict[str, QuantWeight], check: bool = True,
            activations: str = INT8_X) -> nn.Module:
    """Swap each module path of ``found`` for its block-kernel layer, mark the model's config with the formats
    served, drop the fp32 weights' file pages (their heap copies go when the caller trims). ``check``: each
    weight must match the module's own on a sample of rows (a file's blocks against their conversion; int8,
    lossy by design, is not checked). ``activations`` int8: each weight the int8 kernel takes is tiled for it
    (once: a tied weight stays one copy), where it runs here."""
    sources: Counter[str] = Counter()
    int8 = activations == INT8_X and int8_kernel() is not None
    tiled: dict[int, QuantWeight] = {}  # id of a found weight -> its tiled form
    swapped: list[tuple[int, int]] = []  # (address, bytes) of each fp32 weight swapped out
    for path, weight in found.items():
        parent, name = _module(model, path)
        old = getattr(parent, name)
        if isinstance(old, nn.Linear | nn.Embedding):
            swapped.append((old.weight.data_ptr(), old.weight.nbytes))
            if check:
                _checked(weight, old.weight, path)
        if int8:
            if id(weight) not in tiled:
                tiled[id(weight)] = weight.for_int8()
            weight = tiled[id(weight)]
        if isinstance(old, nn.Linear):
            new: nn.Module = QuantLinear(weight, old.bias)
        elif isinstance(old, nn.Embedding):
            new = QuantEmbedding(weight, old.padding_idx)
        else:
            raise BadModelFile(f"{path}: the model has no Linear or Embedding there ({type(old).__name__})")
        setattr(parent, name, new)
        sources[weight.source] += weight.shape[0] * weight.shape[1]
    left = [p for p, m in model.named_modules() if type(m) is nn.Linear]
    if left:
        raise BadModelFile(f"the file holds no weight for {left[0]} (and {len(left) - 1} more)")
    served = "+".join(s for s, _ in sources.most_common())  # e.g. "Q4_1+Q8_0"
    model.config.lookahead_weights = f"{served} x int8" if int8 else served  # "x int8": int8 activations
    join_layers(model)  # q/k/v and gate/up as one product each, held once (the lean loop's groups)
    # the swapped weights' resident pages of the converted safetensors file, whose mapping the norms and biases
    # keep alive, go back through madvise; their heap copies once the caller trims (``quantize_model``)
    drop_file_pages(swapped)
    return model
