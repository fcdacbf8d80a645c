"""``[model] name = "auto"``: the best built-in model this machine holds and can run.

People meet the product through ``make demo`` and ``serve``; the 135M model that keeps tests fast does not
answer reliably (issue 45), so when no model is named the served one is the largest built-in that is on
this machine (installed or fetched) whose weights, counted in the format they are served in (issue 50,
item 6: a GGUF's own blocks on a CPU with ``[model] weights = "file"``, else the dense or int8 bytes), fit
in a share of the free memory and, on a CPU, that decodes one stream at ``[model] auto_min_tokens_per_s``
or faster. That speed is estimated, not measured: a one-token step reads every weight once, so it takes
about the served bytes over the rate this machine's cores read weights at (``DECODE_READ_PER_CORE``).
Pure functions over plain numbers (``pick``), with a thin reader of the machine (``machine``);
torch-free, as settings are.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from lookahead_core.catalog import BUILTINS, BuiltinModel, SplitWheelGGUF, builtin_gguf_path
from lookahead_core.defaults import DEFAULT_MODEL

AUTO = "auto"  # the [model] name that asks for this choice
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}  # bytes a weight takes in each served dtype
INT8_BYTES = 1  # [model] weights = "int8": one byte a weight (its per-channel scales are noise beside it)
INT4_BYTES = 0.5  # [model] weights = "int4" (torchao, CUDA): half a byte a weight (its group scales beside it)
FILE = "file"  # [model] weights that serves a GGUF's own blocks (on a CPU)
MEMINFO = "/proc/meminfo"  # Linux: MemAvailable, the memory a new process can take without swapping
MEMINFO_KEY = "MemAvailable:"
KIB = 1024  # /proc/meminfo counts kB
UNCHECKED_MEMORY = 1 << 62  # an accelerator's memory as the choice sees it: checked when the model loads
SUFFIXES = {"K": 10**3, "M": 10**6, "B": 10**9}  # a parameter count as people quote it: 135M, 1.54B
# Bytes of weights one core's share of a one-token step reads a second, kernel work included (the 2-core
# Xeon of issue 50: llama.cpp's Q4_K_M 0.5B step 42.3 ms = 11.6 GB/s, the block kernel's SmolLM2 Q4_1 step
# ~11 ms = 8.4 GB/s, the fp32 0.5B's 100.6 ms = 19.6 GB/s): the block formats' rate, the slower one.
DECODE_READ_PER_CORE = 5e9
DECODE_READ_CAP = 50e9  # a socket's sustained read: past it more cores read no faster


@dataclass(frozen=True)
class Machine:
    """What the choice looks at."""

    memory_bytes: int  # memory free for the model (CPU: MemAvailable; an accelerator: not limited here)
    cores: int  # CPU cores this process may use
    on_cpu: bool  # True: the model decodes on the CPU (its read rate limits the model's size)
    read_bytes_per_s: float  # bytes of weights a one-token step reads a second here (CPU: ``read_rate``)


@dataclass(frozen=True)
class Limits:
    """How large a model the choice may take."""

    memory_share: float  # of the free memory, the most the weights (with working room) may take
    working_set_factor: float  # the weights' bytes times this: activations, the KV pool, the converter
    min_tokens_per_s: float  # on a CPU, the least estimated single-stream speed (one-token decoding)


@dataclass(frozen=True)
class Candidate:
    """A built-in on this machine as the choice weighs it."""

    name: str
    params: int  # parameters: the larger of two that qualify is served
    served_bytes: int  # bytes of the weights in the format they are served in (what one token reads)
    load_bytes: int  # the most the load holds at once (a quantized load goes through the fp32 model)
    form: str  # the served format in words, for the reason line: "GGUF blocks", "float32", "int8"


@dataclass(frozen=True)
class Choice:
    """What ``pick`` chose, and why, in the words ``models list`` prints."""

    name: str
    reason: str  # one line: the chosen model's bytes and estimated speed, and the rule


def parameter_count(text: str) -> int:
    """'135M' -> 135_000_000, '1.54B' -> 1_540_000_000."""
    number, suffix = text[:-1], text[-1].upper()
    if suffix not in SUFFIXES:
        raise ValueError(f"parameter count {text!r} does not end in one of {''.join(SUFFIXES)}")
    return round(float(number) * SUFFIXES[suffix])


def read_rate(cores: int) -> float:
    """The weights' read rate of a one-token step on ``cores`` CPU cores (bytes a second)."""
    return min(cores * DECODE_READ_PER_CORE, DECODE_READ_CAP)


def candidate(name: str, params: int, file_bytes: int | None, weights: str, dtype: str, on_cpu: bool) -> Candidate:
    """``name`` served as ``weights`` / ``dtype`` (``models.served_weights``'s rules): ``file`` on a CPU holds
    the GGUF's ``file_bytes``; ``int8`` a byte a weight; ``bfloat16`` two; else (``float32``, or ``file``
    off a CPU) the dense ``dtype``. A block format loads through the fp32 model, so it peaks at both."""
    fp32 = params * DTYPE_BYTES["float32"]
    if weights == FILE and on_cpu and file_bytes is not None:
        return Candidate(name, params, file_bytes, fp32 + file_bytes, "the GGUF's blocks")
    if weights == "int8":
        return Candidate(name, params, params * INT8_BYTES, fp32 + params * INT8_BYTES, "int8")
    if weights == "int4":  # torchao's: quantized from the dense model in ``dtype``
        dense = params * DTYPE_BYTES[dtype]
        return Candidate(name, params, round(params * INT4_BYTES), dense, "int4")
    form = "bfloat16" if weights == "bfloat16" else dtype
    dense = params * DTYPE_BYTES[form]
    return Candidate(name, params, dense, dense, form)


def tokens_per_s(model: Candidate, machine: Machine) -> float:
    """Estimated one-token decoding speed: a step reads every served weight once."""
    return machine.read_bytes_per_s / model.served_bytes


def refusal(model: Candidate, machine: Machine, limits: Limits) -> str | None:
    """Why ``machine`` cannot serve ``model`` within ``limits`` (a few words), or None when it can."""
    room = machine.memory_bytes * limits.memory_share
    if model.served_bytes * limits.working_set_factor > room or model.load_bytes > machine.memory_bytes:
        return f"{_gb(model.served_bytes)} x {limits.working_set_factor:g} past {_gb(room)} of memory"
    if machine.on_cpu and tokens_per_s(model, machine) < limits.min_tokens_per_s:
        return f"~{tokens_per_s(model, machine):.1f} tok/s < {limits.min_tokens_per_s:g}"
    return None


def pick(models: Iterable[Candidate], machine: Machine, limits: Limits, fallback: str = DEFAULT_MODEL) -> Choice:
    """The largest of ``models`` (those on this machine) that ``machine`` can serve; else ``fallback``."""
    ranked = sorted(models, key=lambda m: m.params, reverse=True)
    refused = {m.name: refusal(m, machine, limits) for m in ranked}
    chosen = next((m for m in ranked if refused[m.name] is None), None)
    share = f"weights x {limits.working_set_factor:g} within {limits.memory_share:.0%} of the free memory"
    rule = share + (f", >= {limits.min_tokens_per_s:g} tok/s" if machine.on_cpu else "")
    larger = "; ".join(f"{m.name}: {refused[m.name]}" for m in ranked if chosen is None or m.params > chosen.params)
    skipped = f" ({'larger' if chosen else 'refused'}: {larger})" if larger else ""
    if chosen is None:
        return Choice(fallback, f"{fallback}: no built-in here fits ({rule}){skipped}; the default serves")
    speed = f", ~{tokens_per_s(chosen, machine):.0f} tok/s estimated on {machine.cores} cores" if machine.on_cpu else ""
    return Choice(chosen.name, f"{chosen.name}: {_mb(chosen.served_bytes)} of {chosen.form}{speed}; the largest "
                               f"built-in here with {rule}{skipped}")


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.1f} GB"


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.0f} MB"


def is_present(model: BuiltinModel) -> bool:
    """Whether a built-in's GGUF file is on this machine (installed with its package, or fetched)."""
    try:
        builtin_gguf_path(model.name)
    except FileNotFoundError:
        return False
    return True


def file_size(model: BuiltinModel) -> int | None:
    """Bytes of a built-in's GGUF file: a fetched one's pinned size, a packaged one's on disk (None: missing)."""
    if isinstance(model.source, SplitWheelGGUF):
        return model.source.size
    try:
        return builtin_gguf_path(model.name).stat().st_size
    except FileNotFoundError:
        return None


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
    cores = len(os.sched_getaffinity(0))
    return Machine(memory_bytes=memory, cores=cores, on_cpu=on_cpu, read_bytes_per_s=read_rate(cores))


def best_model(weights: str, dtype: str, device: str, limits: Limits,
               present: Callable[[BuiltinModel], bool] | None = None) -> Choice:
    """The built-in ``[model] name = "auto"`` serves: the largest one this machine can run, in the format
    ``weights`` / ``dtype`` serve it in, of those ``present`` says are here (default: installed or fetched)."""
    here = present or is_present
    on_cpu = device == "cpu"
    models = [candidate(m.name, parameter_count(m.parameters), file_size(m), weights, dtype, on_cpu)
              for m in BUILTINS.values() if here(m)]
    return pick(models, machine(device), limits)


def upgrade(weights: str, dtype: str, device: str, limits: Limits) -> BuiltinModel | None:
    """A built-in not yet fetched that this machine could run and that is larger than what it serves now
    (what the demo fetches); None when the best runnable model is already here."""
    best_here = best_model(weights, dtype, device, limits).name
    best_any = best_model(weights, dtype, device, limits, present=lambda _m: True).name
    return BUILTINS[best_any] if best_any != best_here else None
