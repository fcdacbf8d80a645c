"""The tree-kernel benchmark (``bench/rows_kernels.py``) on hand-made layers: every kernel timed at every
size over every Linear of a model, and its PNG drawn from the result."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from lookahead_rag.bench.plot import kind_of, plot_result
from lookahead_rag.bench.rows_kernels import kernels, time_sizes, weights

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_every_linear_of_the_model_is_timed_by_every_kernel_at_every_size() -> None:
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 40, bias=False))
    layers = weights(model)
    assert [tuple(w.shape) for w, _ in layers] == [(8, 16), (40, 8)]  # the ReLU is no product
    assert layers[0][1] is not None and layers[1][1] is None  # the bias goes with its layer
    products = kernels()
    assert "stock" in products  # the baseline's baseline is always there
    ms = time_sizes(products, layers, sizes=[1, 3], repeats=1)
    assert set(ms) == set(products)
    assert all(set(by) == {1, 3} and all(v > 0 for v in by.values()) for by in ms.values())


def test_the_result_is_its_own_kind_and_drawn_to_a_png(tmp_path: Path) -> None:
    data = {"kind": "rows_kernels", "model": "tiny", "threads": 2, "cpu": "Test CPU", "machine": "Linux, 2 cores",
            "sizes": [1, 8], "ms": {"stock": {"1": 3.0, "8": 9.0}, "avx2": {"1": 1.0, "8": 4.0}}}
    png = tmp_path / "rows.png"
    assert kind_of(data) == "rows_kernels"
    assert plot_result(data, png) == "rows_kernels"  # lookahead-rag-bench plot redraws it from the JSON
    assert png.read_bytes().startswith(PNG_MAGIC)


def test_the_products_timed_are_the_linear_product() -> None:
    w, b, x = torch.randn(40, 24), torch.randn(40), torch.randn(5, 24)  # [out, in], [out], [rows, in]
    for name, product in kernels().items():
        torch.testing.assert_close(product(x, w, b), torch.nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-5,
                                   msg=name)
