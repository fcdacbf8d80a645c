"""Weight-only int8 / int4 for the device-generic backend (CUDA models), by torchao.

The CPU backend serves quantized weights through its own block kernel (``quant.load``: a GGUF's blocks, or
per-channel int8 of any weights). A CUDA model runs the generic backend's torch ops, where torchao is the
well-kept library for weight-only quantization: ``Int8WeightOnlyConfig`` (per-channel int8 codes, the product
de-quantizes as it multiplies: any device, CPU included, through plain torch ops) and ``Int4WeightOnlyConfig``
(groups of ``INT4_GROUP``, the tinygemm kernels: CUDA only in the torchao release installed here; its CPU
layouts need other packages). Every ``nn.Linear`` is swapped in place; the embedding stays dense.

Speculation stays exact where the backend's forwards do not depend on their width (``exact_numerics``: every
forward in fixed tiles), as for dense weights: the products' bits depend on the rows in a forward otherwise.

    model = weight_only(model, "int8")   # weight_format(model) == "int8 (torchao)"
"""

from __future__ import annotations

from torch import nn

from ..placement import model_placement

INT8 = "int8"  # per-channel int8 weight-only (any device)
INT4 = "int4"  # int4 weight-only in groups (CUDA)
TORCHAO = (INT8, INT4)  # what ``weight_only`` serves
INT4_GROUP = 128  # weights sharing one int4 scale and zero point (tinygemm's group size, torchao's default)
FORMAT_ATTR = "lookahead_torchao"  # the model config's mark of what torchao serves (weight_format names it)


def weight_only(model: nn.Module, weights: str) -> nn.Module:
    """``model`` with every Linear weight-only quantized by torchao as ``weights`` (``TORCHAO``), in place. A one-line
    ValueError for int4 off CUDA or an unknown choice; RuntimeError where torchao is not installed."""
    if weights not in TORCHAO:
        raise ValueError(f"torchao weight-only serves {', '.join(TORCHAO)}, not {weights!r}")
    device = model_placement(model)[0]
    if weights == INT4 and device.type != "cuda":
        raise ValueError(f"weights = \"int4\" runs torchao's int4 kernels on CUDA only (this model is on {device}; "
                         "a CPU model serves \"file\" or \"int8\" by the block kernel)")
    try:
        from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig, quantize_
    except ImportError as exc:
        raise RuntimeError(f"weights = \"{weights}\" on {device.type} needs torchao (pip install torchao): "
                           f"{exc}") from exc
    config = Int8WeightOnlyConfig() if weights == INT8 else Int4WeightOnlyConfig(group_size=INT4_GROUP)
    quantize_(model, config)  # every nn.Linear's weight becomes torchao's quantized tensor subclass
    setattr(model.config, FORMAT_ATTR, f"{weights} (torchao)")
    return model
