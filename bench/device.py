"""The device benchmark's runs (``lookahead-rag-bench device``: its command line and what it measures are in
bench/device_args.py): sections by dtype, each timed beside its transformers baseline in this process."""

from __future__ import annotations

import argparse
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import torch
from lookahead_core import DecodingConfig, TokenTrie
from lookahead_core.engine.sched_config import SchedulerConfig
from lookahead_core.models import load_model

from lookahead_rag.bench.common import (
    cpu_name,
    grounded_prompt_ids,
    machine,
    placement,
    print_table,
    read_jsonl,
    write_json,
)
from lookahead_rag.bench.dataset import bundled
from lookahead_rag.bench.device_runs import (
    Outputs,
    engine,
    equal,
    hf_forward_ms,
    hf_generate,
    hf_static_batches,
    serve,
    sync,
)
from lookahead_rag.bench.serve_record import load_replay

KIND = "device"  # the result's kind (``bench plot``)
COST_REPEATS = 5  # timings per width (the median is kept)
HALF = ("bfloat16", "float16")  # dtypes whose exact_numerics run is measured too
COST_CACHE_PAST = 512  # cached entries behind the engine's timed forwards (as behind HF's)


def prompts_of(args: argparse.Namespace, tok: Any) -> list[list[int]]:
    """The recorded requests' prompt ids (``--requests``), else the bundled questions on their own paragraph."""
    if args.requests:
        return [list(p.ids) for p in load_replay(args.requests).prompts]
    ds = bundled()
    docs = {d["id"]: d for d in read_jsonl(ds.corpus)}
    return [grounded_prompt_ids(tok, [docs[q["doc_id"]]], q["question"]) for q in read_jsonl(ds.questions)]


def distinct(prompts: Sequence[list[int]], n: int) -> list[list[int]]:
    """The first ``n`` distinct prompts, in order."""
    seen: set[tuple[int, ...]] = set()
    out = []
    for p in prompts:
        if tuple(p) not in seen and len(out) < n:
            seen.add(tuple(p))
            out.append(p)
    return out


class Sections:
    """Runs named sections until the budget is spent; records each one's result, error or skip."""

    def __init__(self, budget_s: float) -> None:
        self.started, self.budget_s = time.perf_counter(), budget_s
        self.results: dict[str, Any] = {}

    def run(self, name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
        if time.perf_counter() - self.started > self.budget_s:
            self.results[name] = {"skipped": "out of time"}
            return None
        t0 = time.perf_counter()
        try:
            out = fn()
        except Exception as exc:  # a failed section is recorded; the others still run
            self.results[name] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
            print(f"{name}: FAILED {type(exc).__name__}: {exc}", flush=True)
            return None
        out["seconds"] = round(time.perf_counter() - t0, 1)
        self.results[name] = out
        print(f"{name}: done in {out['seconds']} s", flush=True)
        return out


def timed(device: torch.device, fn: Callable[[], Outputs]) -> tuple[Outputs, float]:
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t0


def rate(out: Outputs, seconds: float) -> dict[str, float]:
    """tok/s, and tokens per forward step where the engine ran it."""
    row = {"tok_s": round(out.tokens / seconds, 1)}
    if out.steps:
        row["tokens_per_step"] = round(out.tokens / out.steps, 2)
    return row


def config_of(args: argparse.Namespace, running: int, exact: bool) -> SchedulerConfig:
    return SchedulerConfig(max_running=running, max_waiting=max(64, args.serve), backend=args.backend,
                           exact_numerics=exact, exact_tile_rows=args.tile_rows, kv_slot_tokens=args.slot_tokens)


def step_cost(model: Any, tok: Any, args: argparse.Namespace) -> dict[str, Any]:
    """ms of a forward by width: the engine's backend (its start-up measurement) and HF's own forward."""
    widths = tuple(int(n) for n in args.widths.split(","))  # --widths
    sched = engine(model, tok, SchedulerConfig(max_running=1, backend=args.backend, kv_slot_tokens=args.slot_tokens,
                                                calibration_counts=widths, calibration_past=COST_CACHE_PAST))
    curve = sched.backend.curve
    hf = hf_forward_ms(model, widths, COST_REPEATS)
    ours = {n: round(curve.cost(n) * 1e3, 2) for n in widths} if curve is not None else {}
    sched.close()
    return {"widths": list(widths), "engine_ms": ours, "hf_ms": {n: round(v, 2) for n, v in hf.items()},
            "backend": sched.backend.describe()}


def single(model: Any, tok: Any, prompts: list[list[int]], args: argparse.Namespace, exact: bool) -> dict[str, Any]:
    """One stream: HF generate and prompt lookup, the engine one token a step and speculating, a repeat pass."""
    dev, max_new = model.device, args.max_new
    hf_generate(model, prompts[:1], 4, lookup=False)  # CUDA context and handles outside the timings
    refs, s = timed(dev, lambda: hf_generate(model, prompts, max_new, lookup=False))
    rows: dict[str, Any] = {"hf_generate": rate(refs, s)}
    out, s = timed(dev, lambda: hf_generate(model, prompts, max_new, lookup=True))
    rows["hf_prompt_lookup"] = {**rate(out, s), **equal(out, refs)}
    sched = engine(model, tok, config_of(args, 1, exact))
    own: Outputs | None = None
    for mode in ("none", "hierarchical"):
        cfg = DecodingConfig(mode=mode, max_new_tokens=max_new)
        serve(sched, prompts[:1], cfg, at_once=False)  # warm
        out, s = timed(dev, lambda cfg=cfg: serve(sched, prompts, cfg, at_once=False))
        rows[f"ours_{mode}"] = {**rate(out, s), **equal(out, refs)}
        if mode == "none":
            own = out
        elif own is not None:
            rows[f"ours_{mode}"]["own_one_token"] = equal(out, own)
    trie, cfg = TokenTrie(), DecodingConfig(mode="hierarchical", max_new_tokens=max_new)
    serve(sched, prompts, cfg, at_once=False, trie=trie)  # the first pass fills the shared trie
    out, s = timed(dev, lambda: serve(sched, prompts, cfg, at_once=False, trie=trie))
    rows["ours_repeat"] = {**rate(out, s), **equal(out, refs)}
    sched.close()
    return {"rows": rows, "backend": sched.backend.describe(), "prompts": len(prompts),
            "vs_prompt_lookup": round(rows["ours_hierarchical"]["tok_s"] / rows["hf_prompt_lookup"]["tok_s"], 2)}


def batched(model: Any, tok: Any, prompts: list[list[int]], args: argparse.Namespace) -> dict[str, Any]:
    """``--serve`` prompts, ``--running`` at a time: the engine on and off against HF static batching."""
    dev, rows, outs = model.device, {}, {}
    for mode in ("hierarchical", "none"):
        sched = engine(model, tok, config_of(args, args.running, False))
        cfg = DecodingConfig(mode=mode, max_new_tokens=args.max_new)
        serve(sched, prompts[:1], DecodingConfig(mode=mode, max_new_tokens=8), at_once=True)  # warm
        outs[mode], s = timed(dev, lambda cfg=cfg, sched=sched: serve(sched, prompts, cfg, at_once=True))
        rows[f"ours_{mode}"] = rate(outs[mode], s)
        sched.close()
    hf, s = timed(dev, lambda: hf_static_batches(model, tok, prompts, args.max_new, args.running))
    rows["hf_static"] = {**rate(hf, s), **equal(hf, outs["none"])}
    rows["ours_hierarchical"].update(equal(outs["hierarchical"], outs["none"]))
    return {"rows": rows, "prompts": len(prompts), "running": args.running,
            "on_vs_off": round(rows["ours_hierarchical"]["tok_s"] / rows["ours_none"]["tok_s"], 2),
            "on_vs_hf_static": round(rows["ours_hierarchical"]["tok_s"] / rows["hf_static"]["tok_s"], 2)}


def run(args: argparse.Namespace) -> int:
    """Every section of every dtype of ``args`` (``device_args.parser``), then the table, the JSON and the PNG."""
    if args.threads:
        torch.set_num_threads(args.threads)
    where = placement(args)
    sections = Sections(args.budget_s)
    dtypes = [d for d in (args.dtypes or args.dtype).split(",") if d]
    cuda = where["device"].startswith("cuda")
    data: dict[str, Any] = {"kind": KIND, "model": args.model, "cpu": cpu_name(), "machine": machine(),
                            "device": f"{where['device']} ({torch.cuda.get_device_name()})" if cuda else
                            where["device"],
                            "threads": torch.get_num_threads(), "torch": torch.__version__, "max_new": args.max_new,
                            "dtypes": dtypes, "sections": sections.results}
    for dtype in dtypes:
        measure_dtype(sections, args, where["device"], dtype)
        write_json(args.json, data)
    report(data)
    write_json(args.json, data)
    from lookahead_rag.bench.device_plot import plot  # matplotlib only once there is something to draw

    png = args.png or str(args.json).rsplit(".", 1)[0] + ".png"
    plot(data, png)
    print(f"wrote {args.json} and {png}")
    return 0


def measure_dtype(sections: Sections, args: argparse.Namespace, device: str, dtype: str) -> None:
    """Every section of one dtype, the model loaded in it."""
    model, tok = load_model(args.model, dtype=dtype, device=device)
    prompts = prompts_of(args, tok)
    one = distinct(prompts, args.single)
    sections.run(f"cost_{dtype}", lambda: step_cost(model, tok, args))
    sections.run(f"single_{dtype}", lambda: single(model, tok, one, args, exact=False))
    if dtype in HALF:
        sections.run(f"single_{dtype}_exact", lambda: single(model, tok, one, args, exact=True))
    sections.run(f"batched_{dtype}", lambda: batched(model, tok, prompts[: args.serve], args))


def report(data: dict[str, Any]) -> None:
    """The single-stream and batched rows of every dtype as one table."""
    rows = []
    for name, sec in data["sections"].items():
        for way, row in (sec.get("rows") or {}).items():
            rows.append({"section": name, "way": way, "tok_s": row.get("tok_s"), "tps": row.get("tokens_per_step"),
                         "equal": f"{row['equal']}/{row['of']}" if "equal" in row else None})
    print_table(rows, [("section", "section", "s"), ("way", "way", "s"), ("tok_s", "tok/s", ".1f"),
                       ("tps", "tokens/step", ".2f"), ("equal", "equal to HF greedy", "s")])
