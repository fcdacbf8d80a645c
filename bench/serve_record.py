"""bench-serve's record of every request (``--record FILE``) and its replay (``--replay FILE``).

Without a replay, an answer is fed back into the prompts that follow it (the retriever's past
sessions), so the prompts, and so the answer lengths, differ between levels and ways. A record keeps
every request of every (level, way) with its exact prompt ids; a replay sends one recorded (level,
way)'s prompts, in index order with their tenants, at every level and in every way
(``Generator.Generate`` with ``prompt_ids``): every figure is then measured on identical prompts.

The file is the llama.cpp peer's requests file (../shared/peers/llamacpp/serve_dump.py's format,
read by its serve_replay.py as it is), compact JSON::

    {"kind": "serve_requests", "format": 1, "source": "recorded", "exact": true, "note", "complete",
     "bench_args", "sequence": [{index, tenant, question, ...}],
     "levels": {"<c>": {"<way>": {"wall_s", "requests": [{index, client, client_order, completed, error,
                prompt_ids, output_ids, reference_ids, sent_s, ttft_s, end_s, deltas, stats}]}}},
     "bench": bench-serve's JSON data, "replay": where the prompts came from (a replayed run) or null}

Times are seconds from the (level, way)'s first send; ``deltas`` are [arrival, tokens];
``reference_ids`` is the serial baseline's answer to the prompt (the exact-match reference);
``stats`` is EngineStats with ``server`` (GenerationStats fields as sent).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lookahead_rag.bench.common import write_json
from lookahead_rag.bench.serve_load import ReplayPrompt, Workload
from lookahead_rag.bench.serve_stats import PromptKey, RequestRecord

KIND = "serve_requests"  # the peer's requests file
FORMAT = 1  # its version
DEFAULT_WAY = "on"  # the way whose prompts a replay takes unless --replay-from says otherwise
TIME_DIGITS = 6  # seconds are rounded to microseconds
NOTE = ("recorded by bench-serve --record: each request's prompt ids as served (FinalInfo.prompt_ids; past "
        "sessions fed back during the run included); on_safe answers carry no prompt ids")


# bench_args that decide the serial baseline's answers: a replay reuses recorded ones only if all match
REFERENCE_KEYS = ("model", "max_new_tokens", "temperature", "top_p", "top_k", "seed")


class ReplayError(ValueError):
    """A --replay file or --replay-from that cannot be replayed (one line: the reason)."""


@dataclass
class Recording:
    """What ``--record`` keeps while the levels run: each (level, way)'s records and wall time."""

    levels: dict[str, dict[str, tuple[list[RequestRecord], float]]] = field(default_factory=dict)
    references: Mapping[PromptKey, list[int]] = field(default_factory=dict)  # prompt -> serial baseline's answer

    def add(self, level: int, way: str, records: list[RequestRecord], wall_s: float) -> None:
        self.levels.setdefault(str(level), {})[way] = (records, wall_s)


@dataclass(frozen=True)
class Replay:
    """One recorded (level, way)'s prompts, to be sent at every level and in every way."""

    file: str  # the file's name (no folders: the JSON stays free of local paths)
    level: int  # the recorded level the prompts come from
    way: str  # ... and way
    prompts: list[ReplayPrompt]  # in recorded index order, requests without prompt ids left out
    sequence: list[dict[str, Any]]  # one entry per prompt: the new index, the recorded one, tenant, question
    skipped: list[int]  # recorded indices without prompt ids (failed, or on_safe)
    bench_args: dict[str, Any]  # the recorded run's bench_args
    drawn: dict[str, Any]  # zipf and pool of the run that drew the prompts (its JSON's, else its arguments)
    references: dict[PromptKey, list[int]] = field(default_factory=dict)  # prompt -> recorded serial answer

    def references_for(self, args: dict[str, Any]) -> dict[PromptKey, list[int]]:
        """The recorded serial answers, if the recording's baseline is this run's (same model, length and
        sampling); else none (they are computed again)."""
        same = all(self.bench_args.get(k) == args.get(k) for k in REFERENCE_KEYS)
        return dict(self.references) if same else {}

    def describe(self) -> dict[str, Any]:
        """The JSON's ``replay``."""
        return {"file": self.file, "level": self.level, "way": self.way, "prompts": len(self.prompts),
                "skipped": len(self.skipped), "distinct_prompts": len({p.prompt_ids for p in self.prompts})}


# ---- writing ------------------------------------------------------------------------------------------
def _seconds(t: float | None, t0: float) -> float | None:
    return None if t is None else round(t - t0, TIME_DIGITS)


def request_json(r: RequestRecord, t0: float, references: Mapping[PromptKey, list[int]]) -> dict[str, Any]:
    """One request as the peer reads it (times from ``t0``)."""
    prompt = [int(t) for t in r.prompt_ids]
    ref = references.get(tuple(prompt)) if prompt else None
    ttft = r.ttft_s
    return {
        "index": r.index, "client": r.client, "client_order": r.client_order, "completed": r.completed,
        "error": None if r.completed else (r.error or "NO_FINAL"),
        "prompt_ids": prompt, "output_ids": [int(t) for t in r.output_ids],
        "reference_ids": None if ref is None else [int(t) for t in ref],
        "sent_s": _seconds(r.sent_s, t0), "ttft_s": None if ttft is None else round(ttft, TIME_DIGITS),
        "end_s": _seconds(r.end_s, t0), "deltas": [[_seconds(t, t0), n] for t, n in r.deltas],
        "stats": None if r.stats is None else dataclasses.asdict(r.stats),
    }


def way_json(records: Sequence[RequestRecord], wall_s: float,
             references: Mapping[PromptKey, list[int]]) -> dict[str, Any]:
    """One (level, way): its wall time and its requests in index order, timed from its first send."""
    t0 = min((r.sent_s for r in records), default=0.0)
    return {"wall_s": round(wall_s, TIME_DIGITS),
            "requests": [request_json(r, t0, references) for r in sorted(records, key=lambda r: r.index)]}


def bench_args(args: argparse.Namespace) -> dict[str, Any]:
    """The run's arguments as the peer's replay reads them (no local paths)."""
    s = args.sampling
    return {"model": args.model, "dataset": args.dataset, "pool": args.pool, "requests": args.requests,
            "zipf": args.zipf, "seed": s.seed, "temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k,
            "max_new_tokens": args.max_new_tokens, "levels": args.levels, "ways": args.ways, "mode": args.mode,
            "threads": args.threads, "tenants_by_title": args.tenants_by_title,
            "bus": f"kafka {args.kafka}" if args.kafka else "in-process", "gen": list(args.gen)}


def sequence_json(wl: Workload, drawn: Sequence[int]) -> list[dict[str, Any]]:
    """The drawn sequence: each request's pool question and tenant."""
    return [{"index": i, "pool_index": p, "qid": wl.pool[p].qid, "tenant": wl.pool[p].tenant,
             "question": wl.pool[p].question} for i, p in enumerate(drawn)]


def record_data(args: dict[str, Any], sequence: list[dict[str, Any]], recording: Recording,
                bench: dict[str, Any], replay: Replay | None = None) -> dict[str, Any]:
    """The whole file: every (level, way)'s requests, the sequence, the arguments and bench-serve's JSON."""
    levels = {c: {way: way_json(recs, wall, recording.references) for way, (recs, wall) in ways.items()}
              for c, ways in recording.levels.items()}
    note = NOTE if replay is None else f"{NOTE}; replayed: {replay.file}'s prompts of c={replay.level} {replay.way}"
    return {"kind": KIND, "format": FORMAT, "source": "recorded", "exact": True, "note": note, "complete": True,
            "bench_args": args, "sequence": sequence, "levels": levels, "bench": bench,
            "replay": None if replay is None else replay.describe()}


def write_record(path: str | Path, data: dict[str, Any]) -> int:
    """Write the record (compact JSON, atomically); returns the number of requests in it."""
    write_json(path, data, compact=True)
    return sum(len(w["requests"]) for ways in data["levels"].values() for w in ways.values())


# ---- replaying ----------------------------------------------------------------------------------------
def parse_source(text: str) -> tuple[int, str]:
    """``C:WAY`` (--replay-from) -> (C, WAY)."""
    level, sep, way = text.partition(":")
    if not sep or not level.strip().isdigit() or not way.strip():
        raise ReplayError(f"--replay-from {text!r} is not C:WAY (e.g. 4:on)")
    return int(level), way.strip()


def _recorded(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ReplayError(f"{path}: no such file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReplayError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("kind") != KIND or data.get("format") != FORMAT:
        raise ReplayError(f"{path}: not a bench-serve --record file (kind {KIND!r}, format {FORMAT})")
    return data


def load_replay(path: str | Path, source: tuple[int, str] | None = None) -> Replay:
    """The prompts of one recorded (level, way) (default: the first level's ``on``), in index order."""
    path = Path(path)
    data = _recorded(path)
    levels: dict[str, dict[str, Any]] = data.get("levels") or {}
    pairs = sorted((int(c), w) for c, ways in levels.items() for w in ways)
    if not pairs:
        raise ReplayError(f"{path}: records no requests")
    level, way = source or (pairs[0][0], DEFAULT_WAY)
    if (level, way) not in pairs:
        known = ", ".join(f"{c}:{w}" for c, w in pairs)
        raise ReplayError(f"{path} has no {level}:{way} (recorded: {known}); choose one with --replay-from C:WAY")
    tenants = {int(s["index"]): s for s in data.get("sequence") or []}
    prompts, sequence, skipped = [], [], []
    for r in sorted(levels[str(level)][way].get("requests") or [], key=lambda r: int(r["index"])):
        index = int(r["index"])
        if not r.get("prompt_ids"):
            skipped.append(index)
            continue
        if index not in tenants:
            raise ReplayError(f"{path}: the sequence has no tenant for request {index}")
        entry = tenants[index]
        prompts.append(ReplayPrompt(str(entry["tenant"]), tuple(int(t) for t in r["prompt_ids"])))
        sequence.append({**entry, "index": len(sequence), "source_index": index})
    if not prompts:
        raise ReplayError(f"{path}: {level}:{way} has no request with prompt ids")
    args, bench = dict(data.get("bench_args") or {}), data.get("bench") or {}
    drawn = {k: bench.get(k, args.get(k)) for k in ("zipf", "pool")}
    references = {tuple(int(t) for t in r["prompt_ids"]): [int(t) for t in r["reference_ids"]]
                  for ways in levels.values() for w in ways.values() for r in w.get("requests") or []
                  if r.get("prompt_ids") and r.get("reference_ids") is not None}
    return Replay(path.name, level, way, prompts, sequence, skipped, args, drawn, references)
