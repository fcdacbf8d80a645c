"""Shared bench plumbing: JSONL data, grounded prompts, tables and JSON output."""

from __future__ import annotations

import argparse
import json
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # a type only: importing transformers would make every --help slow
    from transformers import PreTrainedTokenizerBase

from lookahead_rag.bench.dataset import Source, add_dataset_args, dataset_from_args
from lookahead_rag.bench.sampling_args import add_sampling_args, sampling_from_args
from lookahead_rag.services.models_cli import DTYPE_NAMES

MODEL_HELP = "built-in name (lookahead-rag models list), a .gguf file, a local directory or a hub id"

SYSTEM_PROMPT = (
    "You are a helpful assistant. Answer the question using the documents below. "
    "If they do not contain the answer, say so."
)  # the bench's grounded-QA instruction


def add_draw_args(p: argparse.ArgumentParser, requests: int, what: str) -> None:
    """--pool, --requests (``requests`` by default, ``what`` its help), --zipf and --seed: a Zipf-drawn request
    sequence (``serve_load.draw_sequence``)."""
    p.add_argument("--pool", type=int, default=100, help="the first N answerable questions are drawn from")
    p.add_argument("--requests", type=int, default=requests, help=what)
    p.add_argument("--zipf", type=float, default=1.1, help="popularity exponent s: rank r has weight 1/r^s")
    p.add_argument("--seed", type=int, default=0, help="fixes the sequence (and whatever else the benchmark draws)")


def workload_parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """A benchmark's parser with the workload every decoding benchmark reads: --corpus and --questions
    (default: the bundled set; resolve them with ``lookahead_rag.bench.dataset.dataset_from_args``)."""
    p = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_dataset_args(p)
    return p


def add_placement_args(p: argparse.ArgumentParser, device: str = "cpu") -> None:
    """--device and --dtype of every benchmark that loads a model (``load_model(name, **placement(args))``):
    ``device`` the default ("auto": cuda where torch sees one, ``placement`` resolves it)."""
    auto = ", or auto (cuda when available)" if device == "auto" else ""
    p.add_argument("--device", default=device, help=f"where the model runs: cpu, cuda or cuda:N{auto}")
    p.add_argument("--dtype", default="float32", choices=DTYPE_NAMES,
                   help="the model's weights and activations (float32: the CPU kernels; others: stock and sdpa)")
    p.add_argument("--weights", default="float32", choices=("file", "float32", "bfloat16", "int8"),
                   help="what the products run on: file = a GGUF's own quantized blocks (the served default, "
                        "on a CPU), int8 per-channel, or dense (float32: the benchmarks' default)")
    p.add_argument("--activations", default="int8", choices=("int8", "float32"),
                   help="what quantized weights multiply: int8 (x per block of 32, integer products, where the "
                        "AVX-512 VNNI kernel runs) or float32 (each block de-quantized)")


def placement(args: argparse.Namespace) -> dict[str, str]:
    """``load_model``'s device, dtype and weights keywords from --device, --dtype and --weights ("auto": cuda
    where available)."""
    device = args.device
    if device == "auto":
        import torch  # only once a benchmark runs: --help stays fast

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return {"device": device, "dtype": args.dtype, "weights": getattr(args, "weights", "float32"),
            "activations": getattr(args, "activations", "int8")}


def add_model_args(p: argparse.ArgumentParser) -> None:
    """The model, where it runs and in which dtype, its threads, and the outputs (--json, --png) of a benchmark
    that runs one model over a squad-style workload (prompt-order, exactness)."""
    p.add_argument("--tenants-by-title", action="store_true", help="one tenant per article title (as bench serve)")
    p.add_argument("--model", default="smollm2-135m-instruct", help=MODEL_HELP)
    add_placement_args(p)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    p.add_argument("--json", default=None, help="write results here")
    p.add_argument("--png", default=None, help="plot here (default: next to --json)")


def parse_workload(p: argparse.ArgumentParser, argv: Sequence[str], seed_help: str) -> argparse.Namespace:
    """Add the outputs (--json, --png) and sampling arguments every decoding benchmark takes, parse
    ``argv``, and resolve the workload (``args.dataset``) and the sampling (``args.sampling``)."""
    p.add_argument("--json", default=None, help="write results here")
    p.add_argument("--png", default=None, help="plot here (default: next to --json)")
    add_sampling_args(p, seed_help)
    args = p.parse_args(argv)
    args.dataset = dataset_from_args(p, args).name
    args.sampling = sampling_from_args(p, args)
    return args


def kernel_parser(prog: str, doc: str | None, repeats: int) -> argparse.ArgumentParser:
    """A kernel benchmark's parser (rows_kernels, attention_kernels): --model, --repeats (default
    ``repeats``), --threads and the outputs; read it with ``parse_kernel_args``."""
    p = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct", help=MODEL_HELP)
    p.add_argument("--repeats", type=int, default=repeats, help="timed rounds (the fastest is kept)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    p.add_argument("--json", default=None, help="write results here")
    p.add_argument("--png", default=None, help="plot here (default: next to --json)")
    return p


def parse_kernel_args(p: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse a kernel benchmark's ``argv`` and give torch the threads asked for (0: its default)."""
    args = p.parse_args(argv)
    if args.threads:
        import torch  # only once a benchmark runs: --help stays fast

        torch.set_num_threads(args.threads)
    return args


def cpu_name() -> str:
    """The CPU model (from /proc/cpuinfo), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> str:
    """OS, architecture and core count, e.g. ``Linux x86_64, 2 cores``."""
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores"


def run_header(args: argparse.Namespace) -> dict[str, Any]:
    """What a model benchmark's JSON opens with: the model, where it ran (an accelerator by name), its dtype,
    torch's threads, the machine, the CPU and the data set (``args``: add_model_args' fields and dataset)."""
    import torch  # only once a benchmark runs: --help stays fast

    device = args.device
    return {"model": args.model, "device": device if device == "cpu" else f"{device} ({torch.cuda.get_device_name()})",
            "dtype": args.dtype, "threads": torch.get_num_threads(), "machine": machine(), "cpu": cpu_name(),
            "dataset": args.dataset}


def ran_on(data: dict[str, Any]) -> str:
    """How a benchmark's summary line opens: the model and where it ran (``run_header``'s fields), e.g.
    ``smollm2-135m on cpu (Intel Xeon), threads=2``."""
    return f"{data['model']} on {data['device']} ({data['cpu']}), threads={data['threads']}"


def read_jsonl(path: str | Path | Source) -> list[dict[str, Any]]:
    """Rows of a JSONL file, yours or the bundled package data (blank lines skipped)."""
    source = Path(path) if isinstance(path, str | os.PathLike) else path
    with source.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def answerable(questions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Questions with ``"answerable": true`` when the field is present, all otherwise."""
    return [q for q in questions if q.get("answerable", True)]


def grounded_prompt_ids(
    tokenizer: PreTrainedTokenizerBase, docs: Sequence[dict[str, Any]], question: str
) -> list[int]:
    """The chat-templated prompt with the documents and the question, as token ids."""
    blocks = [f"[{i + 1}] {d.get('title', '')}\n{d['text']}" for i, d in enumerate(docs)]
    user = "Documents:\n" + "\n\n".join(blocks) + f"\n\nQuestion: {question}"
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out
    return list(ids)


def print_table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> str:
    """Render rows as an aligned text table; columns are (key, header, format)."""
    cells = [[h for _, h, _ in columns]]
    for row in rows:
        cells.append([("-" if row.get(k) is None else format(row[k], f)) for k, _, f in columns])
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    text = "\n".join(lines)
    print(text)
    return text


def write_json(path: str | Path, data: dict[str, Any], compact: bool = False) -> None:
    """Write JSON atomically (temp file + rename); ``compact``: no indentation or spaces (large files)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, separators=(",", ":")) if compact else json.dumps(data, indent=2, sort_keys=False))
    os.replace(tmp, path)
