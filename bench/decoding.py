"""The decoding benchmark (what it measures and its command line: bench/decoding_args.py)."""

from __future__ import annotations

import argparse
import asyncio
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from lookahead_core import DecodingConfig, PathRecorder, TokenTrie
from lookahead_core.config import LOSSY_MODES, DraftMode
from lookahead_core.engine.decoder import LookaheadDecoder
from lookahead_core.engine.profile import StepProfile
from lookahead_core.engine.scheduler import StepScheduler
from lookahead_core.forward.kernels import KernelSet
from lookahead_core.forward.quant.load import weight_format
from lookahead_core.forward.ragged import RAGGED_ATTENTION
from lookahead_core.forward.shared import shared_kernels
from lookahead_core.models import load_model
from lookahead_core.proposers.draft_model import DraftModels
from tqdm import tqdm

from lookahead_rag.bench.common import (
    answerable,
    cpu_name,
    grounded_prompt_ids,
    machine,
    placement,
    print_table,
    read_jsonl,
    write_json,
)
from lookahead_rag.bench.decoding_args import DEFAULT_MODES
from lookahead_rag.bench.decoding_args import parse_args as _parse_args
from lookahead_rag.bench.decoding_plot import REFERENCE
from lookahead_rag.bench.energy import open_meter
from lookahead_rag.bench.engine_runner import SchedulerRunner
from lookahead_rag.bench.forward_cost import choose_decoding_length, measure_forward_cost, print_cost
from lookahead_rag.bench.pipeline import measure_pipeline
from lookahead_rag.bench.plot import plot_result
from lookahead_rag.bench.profile_report import flatten, report_profile
from lookahead_rag.bench.quality import answer_logprob
from lookahead_rag.bench.sampling_args import Sampling, speedup
from lookahead_rag.bench.serve_stack import rss_mb
from lookahead_rag.bench.squad_eval import QUALITY_COLUMNS, Score, quality_row, score
from lookahead_rag.services.retriever.core import RetrieverCore
from lookahead_rag.services.retriever.documents import Document
from lookahead_rag.services.retriever.settings import RetrieverSettings

# run through transformers' generate on the stock model; assisted: with the draft-model mode's draft
HF_MODES = ("greedy", "prompt-lookup", "assisted")
STATELESS = (*HF_MODES, REFERENCE)  # no trie: nothing to warm in a first --repeat pass
PROMPT_LOOKUP_TOKENS = 10  # transformers' prompt_lookup_num_tokens for the peer baseline
__all__ = ["DEFAULT_MODES", "ModeTotals", "main", "parse_args", "resolve_modes"]


@dataclass
class ModeTotals:
    """Sums over questions for one mode."""

    new_tokens: int = 0
    wall_s: float = 0.0
    forward_steps: int = 0
    exact: int = 0
    questions: int = 0
    joules: float | None = None  # energy the mode's calls used (None: the machine has no power counter)
    logprob: float | None = None  # sum of the target's log-likelihood of the answers (lossy runs only)
    scores: list[Score] = field(default_factory=list)  # SQuAD EM/F1 of each answer with reference answers

    def row(self, baseline: ModeTotals, none: ModeTotals, ref: str = "greedy") -> dict[str, Any]:
        """Totals and ratios against ``ref`` ("greedy": the faster of HF generate and ``none``;
        "reference": the reference sampler); ``exact`` counts questions equal to ref's output."""
        steps = self.forward_steps
        return {
            "new_tokens": self.new_tokens,
            "wall_s": round(self.wall_s, 3),
            "tokens_per_s": round(self.new_tokens / self.wall_s, 2) if self.wall_s else None,
            "forward_steps": steps,
            "mean_accepted_per_step": round(self.new_tokens / steps, 3) if steps else None,
            f"speedup_vs_{ref}": speedup(baseline.wall_s, self.wall_s),
            "speedup_vs_none": speedup(none.wall_s, self.wall_s),
            f"exact_match_vs_{ref}": round(self.exact / self.questions, 4) if self.questions else None,
            "joules_per_token": (round(self.joules / self.new_tokens, 5)
                                 if self.joules is not None and self.new_tokens else None),
            # lossy runs: how often and how much the answers move from the reference's
            "differ_frac": round(1 - self.exact / self.questions, 4) if self.questions else None,
            "mean_logprob": (round(self.logprob / self.new_tokens, 4)
                             if self.logprob is not None and self.new_tokens else None),
            **quality_row(self.scores),
        }


JACOBI_SUFFIX = "+jacobi"  # hierarchical+jacobi: the trie's drafts merged with the Jacobi n-gram pool


def mode_config(base: DecodingConfig, mode: str, jacobi: tuple[int, int, int]) -> DecodingConfig:
    """A lookahead mode's config: ``jacobi`` and ``<mode>+jacobi`` carry the --jacobi window shape."""
    w, n, g = jacobi
    shape = {"jacobi_window": w, "jacobi_ngram": n, "jacobi_guesses": g}
    if mode.endswith(JACOBI_SUFFIX):
        return replace(base, mode=mode.removesuffix(JACOBI_SUFFIX), **shape)
    return replace(base, mode=mode, **(shape if mode == DraftMode.JACOBI.value else {}))


def resolve_modes(spec: str, sampling: bool) -> list[str]:
    """The modes to run, baseline first: greedy (or, sampling, reference), then none, then the rest."""
    ref = REFERENCE if sampling else "greedy"
    asked = [m.strip() for m in spec.split(",") if m.strip()]
    # greedy is not a mode of a sampling run; reference may be one of a greedy run (its loop at T=0)
    dropped = ("greedy",) if sampling else ()
    modes = [ref, "none", *dict.fromkeys(m for m in asked if m not in (ref, "none", *dropped))]
    for m in modes:
        known = {d.value for d in DraftMode} | {DraftMode.HIERARCHICAL.value + JACOBI_SUFFIX}
        if m not in STATELESS and m not in known:
            raise SystemExit(f"unknown mode {m!r}")
    return modes


class CallCounter:
    """Counts a model's forward calls (steps of transformers' generate)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.calls = 0
        model.register_forward_pre_hook(self._hook)

    def _hook(self, *_: object) -> None:
        self.calls += 1


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The flags (bench/decoding_args.py)."""
    return _parse_args(argv)


def _hf_runner(model: torch.nn.Module, counter: CallCounter, mode: str, max_new: int,
               sampling: Sampling, assistant: torch.nn.Module | None = None) -> Callable:
    extra: dict[str, Any] = {"prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS} if mode == "prompt-lookup" else {}
    if mode == "assisted":
        extra["assistant_model"] = assistant
    extra |= sampling.hf_kwargs()

    def generate_hf(ids: list[int]) -> tuple[list[int], int]:
        x = torch.tensor([ids])  # [1, prompt]
        before = counter.calls
        if sampling.enabled:
            torch.manual_seed(sampling.seed)  # every question starts from the same seed
        with torch.inference_mode():
            out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new, **extra)
        return out[0, len(ids):].tolist(), counter.calls - before - 1  # minus prefill
    return generate_hf


def _reference_runner(model: torch.nn.Module, tok: Any, counter: CallCounter, cfg: DecodingConfig) -> Callable:
    """The reference sampler on the stock model: one token per forward, keyed by (seed, position)."""
    from lookahead_core.sampling import generate_sampled

    def generate_reference(ids: list[int]) -> tuple[list[int], int]:
        before = counter.calls
        with torch.inference_mode():
            out = list(generate_sampled(model, tok, ids, cfg))
        return out, max(counter.calls - before - 1, 0)  # minus prefill
    return generate_reference


def main(argv: list[str] | None = None) -> int:
    return bench_decoding(parse_args(argv or []))


def bench_decoding(args: argparse.Namespace) -> int:
    """The benchmark for parsed arguments (bench.decoding_args.main parses them without torch)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    sampling: Sampling = args.sampling
    ref = REFERENCE if sampling.enabled else "greedy"
    # ref (greedy, or the reference sampler) is the reference for exact match; it and none (the
    # engine's one-token path) always run
    modes = resolve_modes(args.modes, sampling.enabled)
    model, tok = load_model(args.model, **placement(args))
    corpus = {row["id"]: row for row in read_jsonl(args.corpus)}
    pool = answerable(read_jsonl(args.questions))
    questions = pool[: args.limit]
    if args.retrieve:
        prompts = _retrieved_prompts(tok, list(corpus.values()), [q["question"] for q in questions],
                                     args.retrieve, args.max_new_tokens)
    else:
        prompts = [grounded_prompt_ids(tok, [corpus[q["doc_id"]]], q["question"]) for q in questions]

    base = DecodingConfig(max_new_tokens=args.max_new_tokens, **sampling.config_kwargs())
    if args.branch_length:
        base = replace(base, trie=replace(base.trie, branch_length=args.branch_length))
    kernels = KernelSet(model, RAGGED_ATTENTION)  # every lookahead mode runs these twins (the engine's attention)
    past = int(sum(map(len, prompts)) / len(prompts)) + args.max_new_tokens // 2
    print(f"timing kernels vs tree tokens (cache {past} tokens)...")
    curve = measure_forward_cost(kernels, past)
    print_cost(kernels.measured or curve, curve)
    print(f"kernels: {kernels.describe()}")
    probe = LookaheadDecoder(model, tok, base, kernels=kernels)
    calibration: dict[str, Any] = {}
    if args.decoding_length == "auto" and args.engine == "scheduler":
        length = base.decoding_length  # a cap: the scheduler sizes every step's tree by measured gain and cost
    elif args.decoding_length == "auto":
        calib_qs = pool[args.limit : args.limit + args.calibrate]
        wide = replace(base, decoding_length=curve.token_counts[-1] - 1)
        recorder = PathRecorder()  # the accepted path of every calibration step
        for q in tqdm(calib_qs, desc="calibrating tree size"):
            ids = grounded_prompt_ids(tok, [corpus[q["doc_id"]]], q["question"])
            probe.generate(ids, config=wide, observer=recorder)
        length, table = choose_decoding_length(curve, recorder.paths)
        calibration = {"questions": len(calib_qs), "chosen": length, "table": table}
        print(f"decoding length {length}: {table[length]['tokens_per_step']:.2f} tokens/step expected "
              f"at {table[length]['ms_per_step']:.1f} ms/step")
    else:
        length = int(args.decoding_length)
    base = replace(base, decoding_length=length)

    counter = CallCounter(model)
    tries: dict[str, TokenTrie | None] = {}
    accumulate = args.accumulate or bool(args.warm) or args.repeat
    runners: dict[str, Callable] = {}
    engines: dict[str, StepScheduler] = {}  # each lookahead mode's engine (its steps are profiled)
    for m in modes:
        if m in HF_MODES:
            assistant = DraftModels(model).get(base.draft_layers) if m == "assisted" else None
            if assistant is not None:  # transformers' defaults but the draft length: ours (draft_depth)
                assistant.generation_config.num_assistant_tokens = base.draft_depth
            runners[m] = _hf_runner(model, counter, m, args.max_new_tokens, sampling, assistant)
            continue
        if m == REFERENCE:
            runners[m] = _reference_runner(model, tok, counter, base)
            continue
        cfg = mode_config(base, m, args.jacobi)
        tries[m] = TokenTrie(cfg.trie) if accumulate else None
        if args.engine == "scheduler":
            runners[m] = SchedulerRunner(model, tok, cfg, tries[m])
            engines[m] = runners[m].scheduler
            continue
        dec = LookaheadDecoder(model, tok, cfg, kernels=kernels)
        engines[m] = dec.scheduler

        def generate_lookahead(ids: list[int], dec: LookaheadDecoder = dec, m: str = m) -> tuple[list[int], int, Any]:
            res = dec.generate(ids, trie=tries[m])
            return res.output_ids, res.stats.forward_steps, res.stats

        runners[m] = generate_lookahead

    if args.warm:
        warm_qs = answerable(read_jsonl(args.warm))[args.warm_skip : args.warm_skip + args.warm_limit]
        warmer = LookaheadDecoder(model, tok, base, kernels=kernels)
        for q in tqdm(warm_qs, desc="warming (outputs into every mode's trie)"):
            out = warmer.generate(grounded_prompt_ids(tok, [corpus[q["doc_id"]]], q["question"])).output_ids
            for trie in tries.values():
                if trie is not None:
                    trie.insert_output(out)

    lossy = any(m in {d.value for d in LOSSY_MODES} for m in modes)  # then score every answer's likelihood
    meter, energy = open_meter("cpu")
    print(f"energy per token: {energy}")
    passes = 2 if args.repeat else 1
    totals: dict[str, ModeTotals] = {}
    profiles: dict[str, StepProfile] = {}
    for p in range(passes):
        report = p == passes - 1
        if report and args.profile:  # only the reported pass's steps
            profiles = {m: engine.start_profile() for m, engine in engines.items()}
        totals = {m: ModeTotals() for m in modes}
        desc = "benchmark" + (f" (pass {p + 1}/{passes})" if passes > 1 else "")
        for ids, question in tqdm(list(zip(prompts, questions, strict=True)), desc=desc):
            ref_out: list[int] | None = None
            for m in modes:
                if not report and m in STATELESS:
                    continue  # nothing to warm for the stateless baselines
                j0 = meter.joules() if meter is not None else 0.0
                t0 = time.perf_counter()
                result = runners[m](ids)
                wall = time.perf_counter() - t0
                out, steps = result[0], result[1]
                tot = totals[m]
                tot.wall_s += wall
                tot.new_tokens += len(out)
                tot.forward_steps += steps
                tot.questions += 1
                if meter is not None:
                    tot.joules = (tot.joules or 0.0) + meter.joules() - j0
                if lossy:
                    tot.logprob = (tot.logprob or 0.0) + answer_logprob(model, ids, out)
                if question.get("answers"):
                    tot.scores.append(score(tok.decode(out, skip_special_tokens=True), question["answers"]))
                if ref_out is None and m == ref:
                    ref_out = out
                tot.exact += int(ref_out is None or out == ref_out)
    for runner in runners.values():
        if isinstance(runner, SchedulerRunner):
            runner.close()
    if meter is not None:
        meter.close()
    greedy, none = totals[ref], totals["none"]  # greedy: HF greedy, or the reference sampler when sampling
    if sampling.enabled:
        baseline = REFERENCE
        rows = {m: t.row(greedy, none, ref) for m, t in totals.items()}
    else:
        baseline = "none" if none.wall_s < greedy.wall_s else "hf"  # the faster greedy decoding
        rows = {m: t.row(none if baseline == "none" else greedy, none) for m, t in totals.items()}
    scenario = ("repeat" if args.repeat else "warm" if args.warm
                else "accumulate" if args.accumulate else "cold")
    engine_kernels = shared_kernels(model).describe() if args.engine == "scheduler" else kernels.describe()
    print(f"\n{scenario}: {len(prompts)} questions, max_new_tokens={args.max_new_tokens}, "
          f"decoding_length={length}, threads={torch.get_num_threads()}, engine {args.engine}, "
          f"kernels {engine_kernels}, resident memory {rss_mb():.0f} MB")
    if sampling.enabled:
        print(f"sampling {sampling.describe()} (the same seed for every question); baseline: the reference "
              f"sampler ({greedy.wall_s:.2f} s, engine one-token {none.wall_s:.2f} s)")
    else:
        print(f"greedy baseline: {baseline} (HF generate {greedy.wall_s:.2f} s, "
              f"engine one-token {none.wall_s:.2f} s)")
    print_table([{"mode": m, **r} for m, r in rows.items()], [
        ("mode", "mode", "s"), ("new_tokens", "tokens", "d"), ("wall_s", "wall s", ".2f"),
        ("tokens_per_s", "tok/s", ".2f"), ("forward_steps", "steps", "d"),
        ("mean_accepted_per_step", "tok/step", ".2f"), (f"speedup_vs_{ref}", f"x {ref}", ".2f"),
        ("speedup_vs_none", "x none", ".2f"), (f"exact_match_vs_{ref}", "exact", ".3f"),
        ("joules_per_token", "J/token", ".4f"), *QUALITY_COLUMNS,
        *([("differ_frac", "differ", ".3f"), ("mean_logprob", "logprob/tok", ".4f")] if lossy else [])])
    data = {
        "kind": "pipeline" if args.via_grpc else "decoding",  # what `lookahead-rag-bench plot` draws
        "model": args.model,
        "device": f"{args.device} ({platform.processor() or platform.machine()})", "dtype": args.dtype,
        "weights": weight_format(model),  # the products' format: the file's block types, int8 or the dtype
        "cpu": cpu_name(),
        "machine": machine(),
        "dataset": args.dataset,
        "threads": torch.get_num_threads(),
        "energy": energy,  # what joules_per_token measures, or why it is not available
        "scenario": scenario,
        "questions": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "decoding_length": length,
        "branch_length": base.trie.branch_length,
        "forward_cost_ms": {str(q): round(curve.cost(q) * 1000.0, 2) for q in curve.token_counts},
        "kernels": {
            "choice": kernels.describe(),
            "kept": kernels.names,
            "cache_tokens": past,
            "measured_s": (kernels.measured or curve).to_dict(),
        },
        "engine": args.engine,
        "engine_kernels": _kernel_record(shared_kernels(model)) if args.engine == "scheduler" else None,
        **({"baseline": baseline, "reference_wall_s": round(greedy.wall_s, 3), **sampling.record()}
           if sampling.enabled else
           {"greedy_baseline": baseline,
            "greedy_wall_s": {"hf": round(greedy.wall_s, 3), "none": round(none.wall_s, 3)}}),
        "calibration": calibration,
        "rss_mb": round(rss_mb(), 1),  # resident memory after the run: the model, its kernel twins, the KV
        "modes": rows,
        **({"profile": flatten(profiles)} if profiles else {}),
    }
    if args.via_grpc:
        docs = [Document(r["id"], r.get("title", ""), r["text"]) for r in corpus.values()]
        print("answering through the pipeline: in-process vs three gRPC services on loopback...")
        extra = asyncio.run(measure_pipeline(model, tok, docs, [q["question"] for q in questions],
                                             args.retrieve or 3, args.max_new_tokens, sampling))
        data["pipeline"], data["retrieval"] = extra["pipeline"], extra["retrieval"]
        print_table([{**extra["pipeline"], **extra["retrieval"]}], [
            ("in_process_wall_s", "in-process s", ".2f"), ("grpc_wall_s", "gRPC s", ".2f"),
            ("overhead_frac", "overhead", ".3f"), ("same_outputs", "same out", ".2f"),
            ("chunks", "chunks", "d"), ("p50_ms", "retrieve p50 ms", ".1f"), ("p99_ms", "p99 ms", ".1f")])
    png = (args.png or str(args.json).removesuffix(".json") + ".png") if args.json else None
    if args.json and png:
        write_json(args.json, data)
        plot_result(data, png)
        print(f"wrote {args.json} and {png}")
    report_profile(data, png)
    return 0


def _kernel_record(kernels: KernelSet) -> dict[str, Any]:
    """What the serving engine's start-up measurement chose (ragged forwards of n tokens)."""
    measured = kernels.measured
    return {"choice": kernels.describe(), "kept": kernels.names,
            "measured_s": measured.to_dict() if measured is not None else None}


def _retrieved_prompts(tok: Any, rows: list[dict[str, Any]], questions: list[str], k: int,
                       max_new: int) -> list[list[int]]:
    """Prompts assembled by the retriever from the top-k chunks of the whole corpus."""
    with tempfile.TemporaryDirectory() as tmp:
        core = RetrieverCore(RetrieverSettings(data_dir=tmp), tokenizer=tok)
        core.ingest("bench", [Document(r["id"], r.get("title", ""), r["text"]) for r in rows])
        prompts = [list(core.retrieve("bench", q, k, 0, max_new).prompt_ids) for q in questions]
        core.close()
    return prompts


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
