"""Energy per generated token, where the machine exposes a power counter; never estimated.

Two sources, tried in this order by ``open_meter``:

- **nvidia-smi** (a GPU run): ``nvidia-smi --query-gpu=power.draw --format=csv,noheader,nounits -lms
  100`` streams every GPU's power draw; a ``PowerIntegrator`` sums watts x seconds (all GPUs) between
  samples, and up to now from the last one.
- **Intel RAPL** under ``/sys/class/powercap`` (a CPU run): the package domains' ``energy_uj`` counters,
  summed, with their wrap-around at ``max_energy_range_uj``. Often root-only or absent (AMD hosts, VMs).

Anything else gives no meter and a one-line reason; benchmark rows then say "not available".

    meter, note = open_meter("cpu")
    before = meter.joules() if meter else 0.0
    ...  # the work
    spent = meter.joules() - before if meter else None
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

POWERCAP = Path("/sys/class/powercap")
RAPL_PREFIX = "intel-rapl:"  # package domains are intel-rapl:N; their subdomains intel-rapl:N:M
MICRO = 1e-6
NVIDIA_SMI = "nvidia-smi"
SAMPLE_MS = 100  # nvidia-smi's sampling period
NVIDIA_QUERY = ["--query-gpu=power.draw", "--format=csv,noheader,nounits", f"-lms={SAMPLE_MS}"]
NOT_AVAILABLE = "not available"


class EnergyMeter(Protocol):
    """Cumulative energy since the meter was opened."""

    name: str

    def joules(self) -> float: ...

    def close(self) -> None: ...


# ---- RAPL ----------------------------------------------------------------------------------------
@dataclass
class RaplMeter:
    """The sum of the package domains' counters, with each counter's wrap-around undone."""

    domains: list[Path]  # intel-rapl:N directories
    name: str = "rapl"
    _last: dict[Path, int] = field(default_factory=dict)  # raw counter at the last read
    _wraps: dict[Path, int] = field(default_factory=dict)  # microjoules added for wrap-arounds
    _start: int = 0  # the summed counters when the meter was opened (microjoules)

    @classmethod
    def find(cls, root: Path = POWERCAP) -> RaplMeter | None:
        """The package domains under ``root`` whose counters this process can read, or None."""
        if not root.is_dir():
            return None
        domains = sorted(p for p in root.iterdir() if p.name.startswith(RAPL_PREFIX) and p.name.count(":") == 1)
        readable = [d for d in domains if _read_int(d / "energy_uj") is not None]
        if not readable:
            return None
        meter = cls(readable)
        meter._start = meter._total_uj()
        return meter

    def _total_uj(self) -> int:
        total = 0
        for d in self.domains:
            raw = _read_int(d / "energy_uj") or 0
            last = self._last.get(d)
            if last is not None and raw < last:  # the counter wrapped
                self._wraps[d] = self._wraps.get(d, 0) + (_read_int(d / "max_energy_range_uj") or 0)
            self._last[d] = raw
            total += raw + self._wraps.get(d, 0)
        return total

    def joules(self) -> float:
        return (self._total_uj() - self._start) * MICRO

    def close(self) -> None:
        pass


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


# ---- nvidia-smi ----------------------------------------------------------------------------------
@dataclass
class PowerIntegrator:
    """Energy from power samples: each sample's watts held until the next (a step function)."""

    joules_so_far: float = 0.0
    last_t: float | None = None  # time of the last sample (seconds, monotonic)
    last_w: float = 0.0  # its power (watts, all GPUs)

    def add(self, t: float, watts: float) -> None:
        if self.last_t is not None:
            self.joules_so_far += self.last_w * max(0.0, t - self.last_t)
        self.last_t, self.last_w = t, watts

    def joules(self, now: float) -> float:
        """Energy up to ``now``: the samples so far, the last one held until now."""
        if self.last_t is None:
            return 0.0
        return self.joules_so_far + self.last_w * max(0.0, now - self.last_t)


def parse_power_lines(lines: Iterable[str], gpus: int) -> Iterable[float]:
    """nvidia-smi prints one line per GPU per sample: yield each sample's total watts ("[N/A]" is 0)."""
    batch: list[float] = []
    for line in lines:
        text = line.strip()
        if not text:
            continue
        try:
            batch.append(float(text))
        except ValueError:
            batch.append(0.0)
        if len(batch) == gpus:
            yield sum(batch)
            batch = []


class NvidiaSmiMeter:
    """Samples ``nvidia-smi``'s power draw in a thread and integrates it."""

    name = "nvidia-smi"

    def __init__(self, gpus: int, command: str = NVIDIA_SMI, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.integrator = PowerIntegrator()
        self.samples = 0
        self._lock = threading.Lock()
        self._proc = subprocess.Popen([command, *NVIDIA_QUERY], stdout=subprocess.PIPE, text=True)
        self._thread = threading.Thread(target=self._pump, args=(gpus,), daemon=True)
        self._thread.start()

    def _pump(self, gpus: int) -> None:
        assert self._proc.stdout is not None
        for watts in parse_power_lines(self._proc.stdout, gpus):
            with self._lock:
                self.integrator.add(self.clock(), watts)
                self.samples += 1

    def joules(self) -> float:
        with self._lock:
            return self.integrator.joules(self.clock())

    def close(self) -> None:
        self._proc.terminate()
        self._proc.wait()
        self._thread.join()


def gpu_count(command: str = NVIDIA_SMI) -> int:
    """GPUs nvidia-smi reports power for (0 when it is missing or fails)."""
    if shutil.which(command) is None:
        return 0
    try:
        out = subprocess.run([command, "--query-gpu=power.draw", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.strip())


def open_meter(device: str, powercap: Path = POWERCAP, command: str = NVIDIA_SMI) -> tuple[EnergyMeter | None, str]:
    """A meter for ``device`` ("cpu" or "cuda...") and what it measures, or None and why not."""
    if device.startswith("cuda"):
        gpus = gpu_count(command)
        if gpus:
            return NvidiaSmiMeter(gpus, command), f"nvidia-smi power.draw, {gpus} GPU(s), sampled every {SAMPLE_MS} ms"
        return None, f"{NOT_AVAILABLE}: {command} is missing or reports no GPU"
    rapl = RaplMeter.find(powercap)
    if rapl is not None:
        return rapl, f"RAPL package counters ({len(rapl.domains)} under {powercap})"
    return None, f"{NOT_AVAILABLE}: no readable RAPL package counter under {powercap}"
