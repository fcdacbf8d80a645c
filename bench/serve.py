"""The serving benchmark (what it measures and its command line: bench/serve_args.py)."""

from __future__ import annotations

import argparse
import asyncio
import functools
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from lookahead_core.forward.backend.base import AUTO, CPU
from lookahead_core.forward.backend.choice import backend_name
from lookahead_core.forward.backend.kv_dtype import cache_dtype
from lookahead_core.forward.quant.load import weight_format
from lookahead_core.models import load_model
from lookahead_core.threads import on_own_thread, serve_single_threaded, usable_cores

from lookahead_rag.bench.common import cpu_name, machine, placement, print_table, write_json
from lookahead_rag.bench.profile_report import flatten, report_profile
from lookahead_rag.bench.sampling_args import Sampling
from lookahead_rag.bench.serve_args import parse_args
from lookahead_rag.bench.serve_client import closed_loop
from lookahead_rag.bench.serve_hf import SerialBaseline, fill_references, run_serial
from lookahead_rag.bench.serve_load import Question, ReplayPrompt, Workload, draw_sequence, load_workload
from lookahead_rag.bench.serve_plot import plot
from lookahead_rag.bench.serve_quality import answer_quality, question_ids, reference_answers
from lookahead_rag.bench.serve_record import Recording, Replay, bench_args, record_data, sequence_json, write_record
from lookahead_rag.bench.serve_stack import (
    RssSampler,
    StackConfig,
    build_vector_cache,
    check_generator_overrides,
    serving,
)
from lookahead_rag.bench.serve_stats import PromptKey, RequestRecord, ratio, serial_queue, summarize
from lookahead_rag.bench.squad_eval import QUALITY_COLUMNS
from lookahead_rag.bench.thread_cpu import print_thread_cpu, since, thread_cpu
from lookahead_rag.bench.ties import divergences

# GenerationParams.mode of the engine ways ("" = server default)
MODE_OF = {"on": "", "on_tls": "", "on_safe": "", "off": "none"}
TLS_WAYS = frozenset({"on_tls"})  # every channel of the stack (the bench's and the generator's) over TLS
SAFE_WAYS = frozenset({"on_safe"})  # every request asks for the side-channel-safe stream
Raw = tuple[list[RequestRecord], float, float]  # (records, wall seconds, peak RSS MB) of one way
Profiles = dict[str, Any]  # "way@c" -> the engine's StepProfile of that way and level (--profile)
Requests = list[Question] | list[ReplayPrompt]  # what the clients send: drawn questions, or replayed prompts


@dataclass
class RunConfig:
    """What the levels loop needs besides the services."""

    levels: list[int]  # concurrency levels, ascending
    ways: list[str]  # subset of WAYS, in WAYS order
    max_new_tokens: int  # tokens each request asks for
    deadline_s: float  # gRPC deadline of one request (generous)
    threads: int  # torch threads for the serial baseline's worker thread (0 = default)
    sampling: Sampling  # greedy unless --temperature > 0: sent with every request, used by the baseline
    mode: str = ""  # GenerationParams.mode of the on ways (--mode; "" = the server's default)
    profile: Profiles | None = None  # --profile: each engine way's step profile is put here
    beside: dict[str, dict[str, float]] | None = None  # --profile: each engine way's CPU seconds by thread
    recording: Recording | None = None  # --record: every (level, way)'s records are kept here
    references: dict[PromptKey, list[int]] = field(default_factory=dict)  # answers known up front (a replay's)
    qids: dict[int, str] = field(default_factory=dict)  # request index -> its question (for SQuAD EM / F1)
    answers: dict[str, list[str]] = field(default_factory=dict)  # qid -> the question's reference answers


async def _engine_way(stack: StackConfig, run: RunConfig, model: Any, tok: Any, wl: Workload,
                      seq: Requests, c: int, way: str) -> Raw:
    async with (serving(stack, f"c{c}-{way}", model, tok, wl.docs, way in TLS_WAYS) as (stub, pipeline),
                RssSampler() as rss):
        mode = MODE_OF[way] or run.mode
        if run.profile is not None:
            run.profile[f"{way}@{c}"] = pipeline.generator.scheduler.start_profile()
        before = thread_cpu()
        records, wall = await closed_loop(stub, seq, c, mode, run.max_new_tokens, run.deadline_s,
                                          f"c={c} {way}", run.sampling, way in SAFE_WAYS)
        if run.beside is not None:
            run.beside[f"{way}@{c}"] = since(before)
    return records, wall, rss.peak_mb


def _serial(baseline: SerialBaseline, prompts: list[tuple[int, list[int]]], run: RunConfig,
            stop: threading.Event, desc: str) -> list[RequestRecord]:
    # its own thread, with as many intra-op threads as the engine's, which exits and frees its OpenMP
    # pool: a pool left on asyncio's worker would slow every later way (lookahead_core.threads)
    return on_own_thread(lambda: run_serial(baseline, prompts, stop, desc), run.threads or usable_cores())


def _serial_prompts(raw: dict[str, Raw], seq: Requests) -> list[tuple[int, list[int]]]:
    """serial_hf's prompts: the replayed ones, else those the on (or off) way's answers were given."""
    replayed = [(i, list(q.prompt_ids)) for i, q in enumerate(seq) if isinstance(q, ReplayPrompt)]
    if replayed:
        return replayed
    source = raw["on"][0] if "on" in raw else raw["off"][0]
    return [(r.index, r.prompt_ids) for r in source if r.completed]


SerialRuns = dict[tuple[tuple[int, PromptKey], ...], list[RequestRecord]]  # prompts -> their serial records


async def _serial_way(baseline: SerialBaseline, prompts: list[tuple[int, list[int]]], run: RunConfig, c: int,
                      references: dict[PromptKey, list[int]], stop: threading.Event, done: SerialRuns) -> Raw:
    # one request at a time does not depend on the level: the same prompts (a replay) are timed once,
    # then re-timed for each level's clients (serial_queue)
    key = tuple((i, tuple(ids)) for i, ids in prompts)
    async with RssSampler() as rss:
        if key not in done:
            done[key] = await asyncio.to_thread(_serial, baseline, prompts, run, stop, f"c={c} serial_hf")
        records = done[key]
    for r in records:
        references.setdefault(tuple(r.prompt_ids), r.output_ids)
    timed = serial_queue(records, c)
    wall = max((r.end_s or r.sent_s for r in timed), default=0.0) - min((r.sent_s for r in timed), default=0.0)
    return timed, wall, rss.peak_mb


async def run_levels(stack: StackConfig, run: RunConfig, model: Any, tok: Any, wl: Workload,
                     seq: Requests) -> tuple[dict[str, dict[str, Any]], dict[str, float]]:
    """{level: {way: W}} and {level: peak RSS MB}."""
    baseline = SerialBaseline(model, tok, run.max_new_tokens, run.sampling)
    references: dict[PromptKey, list[int]] = dict(run.references)  # prompt ids -> the serial baseline's answer
    if run.recording is not None:
        run.recording.references = references
    stop = threading.Event()
    serial_runs: SerialRuns = {}
    levels: dict[str, dict[str, Any]] = {}
    rss: dict[str, float] = {}
    try:
        for c in run.levels:
            raw: dict[str, Raw] = {}
            for way in run.ways:
                if way == "serial_hf":
                    raw[way] = await _serial_way(baseline, _serial_prompts(raw, seq), run, c, references, stop,
                                                  serial_runs)
                else:
                    raw[way] = await _engine_way(stack, run, model, tok, wl, seq, c, way)
            # on_safe answers carry no prompt ids (the safe final hides them): nothing to compare them with,
            # unless replayed (the ids sent are the prompt)
            keys = [tuple(r.prompt_ids) for recs, _, _ in raw.values() for r in recs if r.completed and r.prompt_ids]
            fill = functools.partial(fill_references, baseline, keys, references, stop)
            await asyncio.to_thread(on_own_thread, fill, run.threads or usable_cores())
            levels[str(c)] = {w: {**summarize(recs, wall, references), "rss_mb": round(mb, 1),
                                  **answer_quality(recs, run.qids, run.answers, tok)}
                              for w, (recs, wall, mb) in raw.items()}
            if not run.sampling.enabled:  # where a greedy answer differs: a floating-point tie or not
                for w, (recs, _, _) in raw.items():
                    levels[str(c)][w].update(await _mismatches(model, recs, references, run))
            rss[str(c)] = round(max(mb for _, _, mb in raw.values()), 1)
            if run.recording is not None:
                for w, (recs, wall, _) in raw.items():
                    run.recording.add(c, w, recs, wall)
            _print_level(c, levels[str(c)])
    finally:
        stop.set()  # a baseline thread still running (Ctrl-C) ends within one token
    return levels, rss


COLUMNS = [
    ("c", "c", "d"), ("way", "way", "s"), ("completed", "done", "d"), ("errs", "errors", "s"),
    ("goodput_tokens_per_s", "tok/s", ".2f"), ("ttft_p50_s", "TTFT p50", ".3f"), ("ttft_p99_s", "p99", ".3f"),
    ("itl_p50_s", "ITL p50", ".4f"), ("itl_p99_s", "p99", ".4f"), ("mean_accepted_per_step", "tok/step", ".2f"),
    ("mean_tokens_per_forward", "tok/fwd", ".2f"), ("prefix_hit_tokens", "prefix hits", "d"),
    ("exact_match", "exact", ".3f"), *QUALITY_COLUMNS, ("rss_mb", "RSS MB", ".0f"),
]


def _rows(c: int, ways: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"c": c, "way": w, **r, "errs": ",".join(f"{k}:{n}" for k, n in r["errors"].items()) or "-"}
            for w, r in ways.items()]


def _print_level(c: int, ways: dict[str, Any]) -> None:
    print()
    print_table(_rows(c, ways), COLUMNS)
    for way, r in ways.items():
        if r.get("mismatches"):
            found = "; ".join(m["describe"] for m in r["mismatches"])
            print(f"c={c} {way}: {len(r['mismatches'])} answer(s) differ from the serial baseline's, "
                  f"{r['tie_flips']} at a floating-point tie: {found}")


async def _mismatches(model: Any, records: list[RequestRecord], references: dict[PromptKey, list[int]],
                      run: RunConfig) -> dict[str, Any]:
    """The answers that differ from the serial baseline's: where, by what gap, how many are fp ties."""
    differ = [(r.index, r.prompt_ids, r.output_ids, ref) for r in records
              if r.completed and (ref := references.get(tuple(r.prompt_ids))) is not None and r.output_ids != ref]
    if not differ:
        return {}
    found = await asyncio.to_thread(on_own_thread, lambda: divergences(model, differ), run.threads or usable_cores())
    return {"mismatches": [{"index": d.index, "position": d.position, "gap": d.gap, "tie": d.tie,
                            "describe": d.describe()} for d in found],
            "tie_flips": sum(d.tie for d in found)}


def _ratios(levels: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    out = {}
    for c, ways in levels.items():
        on, off, hf, tls, safe = (ways.get(w, {}) for w in ("on", "off", "serial_hf", "on_tls", "on_safe"))
        out[c] = {
            "goodput_on_over_off": ratio(on.get("goodput_tokens_per_s"), off.get("goodput_tokens_per_s")),
            "goodput_on_over_serial_hf": ratio(on.get("goodput_tokens_per_s"), hf.get("goodput_tokens_per_s")),
            "ttft_p99_off_over_on": ratio(off.get("ttft_p99_s"), on.get("ttft_p99_s")),
            "ttft_p99_serial_hf_over_on": ratio(hf.get("ttft_p99_s"), on.get("ttft_p99_s")),
            # the costs: below 1 = slower than plain on (goodput), above 1 = later first token
            "goodput_on_tls_over_on": ratio(tls.get("goodput_tokens_per_s"), on.get("goodput_tokens_per_s")),
            "ttft_p50_on_tls_over_on": ratio(tls.get("ttft_p50_s"), on.get("ttft_p50_s")),
            "goodput_on_safe_over_on": ratio(safe.get("goodput_tokens_per_s"), on.get("goodput_tokens_per_s")),
            "ttft_p50_on_safe_over_on": ratio(safe.get("ttft_p50_s"), on.get("ttft_p50_s")),
        }
    return out


def _requests(args: argparse.Namespace, wl: Workload) -> tuple[Requests, list[dict[str, Any]], dict[str, Any]]:
    """What the clients send (drawn questions, or --replay's prompts), its sequence as --record writes it,
    and the JSON's fields that describe it."""
    replay: Replay | None = args.replayed
    if replay is None:
        drawn = draw_sequence(len(wl.pool), args.requests, args.zipf, args.seed)
        print(f"{len(wl.pool)} questions in the pool, {len(set(drawn))} distinct among {len(drawn)} requests, "
              f"{len(wl.docs)} tenant(s)")
        about = {"requests": len(drawn), "zipf": args.zipf, "pool": len(wl.pool), "distinct_questions": len(set(drawn))}
        return [wl.pool[i] for i in drawn], sequence_json(wl, drawn), about
    about = replay.describe()
    print(f"replaying {about['prompts']} prompts ({about['distinct_prompts']} distinct) of c={replay.level} "
          f"{replay.way} from {replay.file} with Generate(prompt_ids) at every level and in every way")
    if replay.skipped:
        print(f"note: {len(replay.skipped)} recorded request(s) without prompt ids skipped (failed, or on_safe): "
              f"indices {replay.skipped}")
    recorded_model = replay.bench_args.get("model")
    if recorded_model and recorded_model != args.model:
        print(f"warning: the prompts were recorded with --model {recorded_model}, not {args.model}: their token "
              "ids mean nothing to another tokenizer")
    return replay.prompts, replay.sequence, {"requests": len(replay.prompts), **replay.drawn, "replay": about}


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    where = placement(args)  # --device (auto: cuda where available) and --dtype
    device = where["device"]
    serve_single_threaded()  # the engines' step threads take --threads; every other thread runs torch on one
    wl = load_workload(args.corpus, args.questions, args.pool, args.tenants_by_title)
    seq, sequence, described = _requests(args, wl)
    model, tok = await asyncio.to_thread(load_model, args.model, **where)
    run = RunConfig(args.levels, args.ways, args.max_new_tokens, args.deadline_s, args.threads, args.sampling,
                    args.mode, {} if args.profile else None, {} if args.profile else None,
                    Recording() if args.record else None,
                    args.replayed.references_for(bench_args(args)) if args.replayed is not None else {},
                    question_ids(sequence), reference_answers(args.questions))
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as root:
        stack = StackConfig(Path(root), args.model, args.max_new_tokens, max(args.levels), args.threads,
                            args.dependency_timeout_s, args.kafka, check_generator_overrides(args.gen))
        chunks = await asyncio.to_thread(build_vector_cache, stack, wl.docs)
        print(f"corpus embedded once: {chunks} chunks")
        levels, rss = await run_levels(stack, run, model, tok, wl, seq)
    data = {
        "kind": "serve",  # what `lookahead-rag-bench plot` draws
        "model": args.model,
        "device": device if device == "cpu" else f"{device} ({torch.cuda.get_device_name()})", "dtype": args.dtype,
        "weights": weight_format(model),  # the products' format: the file's block types, int8 or the dtype
        "kv_dtype": kv_dtype_of(model, stack),  # what the CPU backend's request caches hold
        "threads": args.threads or usable_cores(),
        **described,  # requests, zipf and the pool drawn from, or the replay (file, level, way, prompts)
        "levels": levels,
        "machine": machine(),
        "cpu": cpu_name(),
        **args.sampling.record(),  # seed: the request sequence's and (sampling) every request's
        "serial_baseline": "reference_sampler" if args.sampling.enabled else "hf_greedy",
        "dataset": args.dataset,
        "max_new_tokens": args.max_new_tokens,
        "on_mode": args.mode or "server default",  # GenerationParams.mode of the on ways
        "tenants": len(wl.docs),
        "bus": f"kafka {args.kafka}" if args.kafka else "in-process",
        "ratios": _ratios(levels),
        "rss_mb": rss,
        **({"profile": flatten(run.profile)} if run.profile else {}),
        **({"thread_cpu_s": run.beside} if run.beside else {}),
    }
    if run.recording is not None:
        recorded = {**bench_args(args), "requests": data["requests"]}
        n = write_record(args.record, record_data(recorded, sequence, run.recording, data, args.replayed))
        print(f"wrote {args.record}: {n} requests over {len(run.recording.levels)} level(s)")
    return data


def kv_dtype_of(model: Any, stack: StackConfig) -> str:
    """The dtype of the request caches the run's engines hold: the CPU backend's by ``[generator] kv_dtype`` (auto
    unless --gen set it), the generic backend's pool the model's."""
    gen, param = stack.generator, next(model.parameters())
    on = backend_name(gen.get("backend", AUTO), param.device.type, bool(gen.get("exact_numerics", False)))
    dtype = cache_dtype(model, gen.get("kv_dtype", AUTO)) if on == CPU else param.dtype
    return str(dtype).removeprefix("torch.")


def main(argv: list[str] | None = None) -> int:
    return run(parse_args(argv or []))


def run(args: argparse.Namespace) -> int:
    """The benchmark for parsed arguments (bench.serve_args.main parses them without torch)."""
    try:
        data = asyncio.run(_run(args))
    except KeyboardInterrupt:
        print("\ninterrupted: servers stopped", flush=True)
        return 130
    replayed = f" (replayed: {r['file']}'s prompts of c={r['level']} {r['way']})" if (r := data.get("replay")) else ""
    print(f"\n{data['model']} on {data['device']} ({data['cpu']}), threads={data['threads']}, "
          f"{data['requests']} requests{replayed}, Zipf {data['zipf']}, {data['max_new_tokens']} new tokens, "
          f"{args.sampling.describe()}; serial baseline {data['serial_baseline']}")
    print_table([row for c, ways in data["levels"].items() for row in _rows(int(c), ways)], COLUMNS)
    print_table([{"c": int(c), **r} for c, r in data["ratios"].items()], [
        ("c", "c", "d"), ("goodput_on_over_off", "goodput on/off", ".2f"),
        ("goodput_on_over_serial_hf", "on/serial_hf", ".2f"), ("ttft_p99_off_over_on", "TTFT p99 off/on", ".2f"),
        ("ttft_p99_serial_hf_over_on", "serial_hf/on", ".2f"), ("goodput_on_tls_over_on", "goodput tls/on", ".2f"),
        ("ttft_p50_on_tls_over_on", "TTFT p50 tls/on", ".2f"), ("goodput_on_safe_over_on", "goodput safe/on", ".2f"),
        ("ttft_p50_on_safe_over_on", "TTFT p50 safe/on", ".2f")])
    if args.json:
        write_json(args.json, data)
        print(f"wrote {args.json}")
    png = args.png or (str(args.json).removesuffix(".json") + ".png" if args.json else None)
    if png:
        plot(data, png)
        print(f"wrote {png}")
    report_profile(data, png)
    if "thread_cpu_s" in data:
        print_thread_cpu(data["thread_cpu_s"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
