"""The step profile against the bandwidth floor in bench output: the printed table and the PNG's floor ticks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lookahead_rag.bench.plot import plot_result
from lookahead_rag.bench.profile_plot import floor_marks
from lookahead_rag.bench.profile_report import print_floor

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _report(layers: float, floor_ms: float | None) -> dict[str, Any]:
    ms = {"draft": 1.0, "pack": 0.5, "layers": layers, "attention": 6.0, "lm_head": 5.0, "choose": 0.4,
          "accept": 0.8, "emit": 0.3, "other": 1.2, "between": 12.0}
    floor = None if floor_ms is None else {"weights_mb": 538.0, "kv_mb": 4.2, "forward_ms": layers + 11.0,
                                           "gb_per_s": 12.5, "machine_gb_per_s": 30.0, "floor_ms": floor_ms,
                                           "x_floor": (layers + 11.0) / floor_ms}
    return {"steps": 10, "ms_per_step": ms, "tokens_per_forward": 1.0, "emitted_per_step": 1.0, "floor": floor}


def test_print_floor_shows_each_run_with_a_floor(capsys: pytest.CaptureFixture[str]) -> None:
    print_floor({"none decode": _report(30.0, 18.1), "old decode": _report(30.0, None)})
    out = capsys.readouterr().out
    assert "none decode" in out and "18.10" in out and "old decode" not in out
    print_floor({"old decode": _report(30.0, None)})
    assert capsys.readouterr().out == ""  # nothing measured: no table


def test_the_profile_png_marks_each_floor(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reports = {"a": _report(30.0, 18.0), "b": _report(40.0, None), "c": _report(50.0, 20.0)}
    fig, ax = plt.subplots()
    floor_marks(ax, reports)
    ticks = [seg for coll in ax.collections for seg in coll.get_segments()]
    assert [(seg[0][1], seg[0][0] + 0.4) for seg in ticks] == [(18.0, 0.0), (20.0, 2.0)]  # at its bar, its height
    plt.close(fig)
    data = {"kind": "profile", "model": "tiny", "cpu": "Test CPU", "machine": "Linux, 2 cores", "threads": 2,
            "profile": reports}
    png = tmp_path / "p.png"
    assert plot_result(data, png) == "profile" and png.read_bytes().startswith(PNG_MAGIC)
