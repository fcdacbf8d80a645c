"""``[model] name = "auto"``: the best built-in model this machine holds and can run.

People meet the product through ``make demo`` and ``serve``; the 135M model that keeps tests fast does not
answer reliably (issue 45), so when no model is named the served one is the largest built-in that is
on this machine (installed or fetched), whose weights fit in a share of the free memory and, on a CPU,
whose size the cores can decode at a usable speed. Pure functions over plain numbers (``pick``), with a
thin reader of the machine (``machine``); torch-free, as settings are.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from lookahead_core.catalog import BUILTINS, BuiltinModel, builtin_gguf_path
from lookahead_core.defaults import DEFAULT_MODEL

AUTO = "auto"  # the [model] name that asks for this choice
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}  # bytes a weight takes in each served dtype
MEMINFO = "/proc/meminfo"  # Linux: MemAvailable, the memory a new process can take without swapping
MEMINFO_KEY = "MemAvailable:"
KIB = 1024  # /proc/meminfo counts kB
UNCHECKED_MEMORY = 1 << 62  # an accelerator's memory as the choice sees it: checked when the model loads
SUFFIXES = {"K": 10**3, "M": 10**6, "B": 10**9}  # a parameter count as people quote it: 135M, 1.54B


@dataclass(frozen=True)
class Machine:
    """What the choice looks at."""

    memory_bytes: int  # memory free for the model (CPU: MemAvailable; an accelerator: not limited here)
    cores: int  # CPU cores this process may use
    on_cpu: bool  # True: the model decodes on the CPU (the cores limit its size)


@dataclass(frozen=True)
class Limits:
    """How large a model the choice may take."""

    memory_share: float  # of the free memory, the most the weights (with working room) may take
    working_set_factor: float  # the weights' bytes times this: activations, the KV pool, the converter
    params_per_core: int  # on a CPU, parameters each core may carry (decode speed is about bytes per core)


def parameter_count(text: str) -> int:
    """'135M' -> 135_000_000, '1.54B' -> 1_540_000_000."""
    number, suffix = text[:-1], text[-1].upper()
    if suffix not in SUFFIXES:
        raise ValueError(f"parameter count {text!r} does not end in one of {''.join(SUFFIXES)}")
    return round(float(number) * SUFFIXES[suffix])


def fits(params: int, dtype: str, machine: Machine, limits: Limits) -> bool:
    """Whether a model of ``params`` parameters in ``dtype`` is one ``machine`` can run within ``limits``."""
    working_set = params * DTYPE_BYTES[dtype] * limits.working_set_factor
    if working_set > machine.memory_bytes * limits.memory_share:
        return False
    return not machine.on_cpu or params <= machine.cores * limits.params_per_core


def pick(models: Iterable[tuple[str, int]], dtype: str, machine: Machine, limits: Limits,
         fallback: str = DEFAULT_MODEL) -> str:
    """The largest of ``models`` ((name, parameters) of those on this machine) that fits; else ``fallback``."""
    runnable = [(params, name) for name, params in models if fits(params, dtype, machine, limits)]
    return max(runnable)[1] if runnable else fallback


def is_present(model: BuiltinModel) -> bool:
    """Whether a built-in's GGUF file is on this machine (installed with its package, or fetched)."""
    try:
        builtin_gguf_path(model.name)
    except FileNotFoundError:
        return False
    return True


def available_memory(meminfo: str = MEMINFO) -> int:
    """Bytes a new process can take (MemAvailable); without /proc, the physical memory."""
    try:
        with open(meminfo, encoding="ascii") as fh:
            for line in fh:
                if line.startswith(MEMINFO_KEY):
                    return int(line.split()[1]) * KIB
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def machine(device: str) -> Machine:
    """This machine as the choice sees it; an accelerator's memory is not read (that needs torch): only
    the CPU limits apply to a CPU."""
    on_cpu = device == "cpu"
    memory = available_memory() if on_cpu else UNCHECKED_MEMORY
    return Machine(memory_bytes=memory, cores=len(os.sched_getaffinity(0)), on_cpu=on_cpu)


def best_model(dtype: str, device: str, limits: Limits,
               present: Callable[[BuiltinModel], bool] | None = None) -> str:
    """The built-in ``[model] name = "auto"`` serves: the largest one this machine can run of those
    ``present`` says are here (default: installed or fetched)."""
    here = present or is_present
    models = [(m.name, parameter_count(m.parameters)) for m in BUILTINS.values() if here(m)]
    return pick(models, dtype, machine(device), limits)


def upgrade(dtype: str, device: str, limits: Limits) -> BuiltinModel | None:
    """A built-in not yet fetched that this machine could run and that is larger than what it serves now
    (what the demo offers to fetch); None when the best runnable model is already here."""
    best_here = best_model(dtype, device, limits)
    best_any = best_model(dtype, device, limits, present=lambda _m: True)
    return BUILTINS[best_any] if best_any != best_here else None
