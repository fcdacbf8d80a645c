"""Energy per token (bench/energy.py): RAPL counters and nvidia-smi sampling, on fakes of both."""

from __future__ import annotations

import itertools
import stat
import time
from pathlib import Path

import pytest

from lookahead_rag.bench.energy import (
    NOT_AVAILABLE,
    NvidiaSmiMeter,
    PowerIntegrator,
    RaplMeter,
    open_meter,
    parse_power_lines,
)

STREAM_WAIT_S = 10.0  # the fake nvidia-smi prints three lines and exits: far less than this


def domain(root: Path, name: str, uj: int | None, max_uj: int = 10_000_000) -> Path:
    d = root / name
    d.mkdir(parents=True)
    if uj is not None:
        (d / "energy_uj").write_text(f"{uj}\n")
    (d / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return d


def test_rapl_sums_the_package_counters_and_undoes_a_wrap(tmp_path: Path) -> None:
    a = domain(tmp_path, "intel-rapl:0", 1_000_000, max_uj=5_000_000)
    domain(tmp_path, "intel-rapl:0:0", 999)  # a subdomain (core): inside package 0, not added again
    b = domain(tmp_path, "intel-rapl:1", 2_000_000, max_uj=4_000_000)
    meter = RaplMeter.find(tmp_path)
    assert meter is not None and meter.domains == [a, b]
    (a / "energy_uj").write_text("3000000")  # +2 J
    (b / "energy_uj").write_text("500000")  # wrapped at 4 J: +2 J to the top, +0.5 J after
    assert meter.joules() == pytest.approx(4.5)
    (b / "energy_uj").write_text("1500000")  # +1 J more, no new wrap
    assert meter.joules() == pytest.approx(5.5)


def test_no_readable_counter_is_not_available_never_an_estimate(tmp_path: Path) -> None:
    domain(tmp_path, "intel-rapl:0", None)  # root-only counters look like this to us: no energy_uj read
    assert RaplMeter.find(tmp_path) is None
    meter, note = open_meter("cpu", powercap=tmp_path)
    assert meter is None and note.startswith(NOT_AVAILABLE)
    meter, note = open_meter("cpu", powercap=tmp_path / "missing")
    assert meter is None and note.startswith(NOT_AVAILABLE)


def test_power_integrator_holds_each_sample_until_the_next() -> None:
    power = PowerIntegrator()
    assert power.joules(5.0) == 0.0  # no sample yet: nothing measured
    power.add(0.0, 100.0)
    power.add(0.5, 200.0)  # 100 W for 0.5 s
    assert power.joules(1.0) == pytest.approx(50.0 + 100.0)  # then 200 W held for 0.5 s


def test_power_lines_sum_every_gpu_of_a_sample() -> None:
    lines = ["10.5\n", "20\n", "\n", "[N/A]\n", "5\n"]  # two GPUs; an unreadable one counts 0
    assert list(parse_power_lines(lines, gpus=2)) == [30.5, 5.0]


def test_nvidia_smi_meter_integrates_the_streamed_samples(tmp_path: Path) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\nprintf '50.0\\n50.0\\n80.0\\n'\n")  # three samples, then it exits
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    ticks = itertools.count()  # the meter's clock: one second per reading
    meter = NvidiaSmiMeter(gpus=1, command=str(fake), clock=lambda: float(next(ticks)))
    deadline = time.monotonic() + STREAM_WAIT_S
    while meter.samples < 3 and time.monotonic() < deadline:  # close() kills the stream: let it be read first
        time.sleep(0.01)
    meter.close()
    assert meter.samples == 3  # samples at t = 0, 1, 2
    assert meter.joules() == pytest.approx(50 + 50 + 80)  # read at t = 3: 80 W held for the last second


def test_a_gpu_run_without_nvidia_smi_is_not_available(tmp_path: Path) -> None:
    meter, note = open_meter("cuda", command=str(tmp_path / "no-such-nvidia-smi"))
    assert meter is None and note.startswith(NOT_AVAILABLE)


def test_mode_rows_report_joules_per_token_only_when_measured() -> None:
    from lookahead_rag.bench.decoding import ModeTotals

    base = ModeTotals(new_tokens=100, wall_s=2.0, forward_steps=50, questions=1, exact=1)
    measured = ModeTotals(new_tokens=100, wall_s=1.0, forward_steps=25, questions=1, exact=1, joules=10.0)
    assert measured.row(base, base)["joules_per_token"] == pytest.approx(0.1)
    assert base.row(base, base)["joules_per_token"] is None  # no counter: not available, not 0
