"""The tree-kernel benchmark (``bench/rows_kernels.py``) on hand-made layers: every kernel timed at every
size over every Linear of a model (its PNG: test_bench_plots)."""

from __future__ import annotations

import torch
from torch import nn

from lookahead_rag.bench.rows_kernels import kernels, time_sizes, weights


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


def test_the_products_timed_are_the_linear_product() -> None:
    w, b, x = torch.randn(40, 24), torch.randn(40), torch.randn(5, 24)  # [out, in], [out], [rows, in]
    for name, product in kernels().items():
        torch.testing.assert_close(product(x, w, b), torch.nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-5,
                                   msg=name)
