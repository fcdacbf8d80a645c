"""bench hostile's verdicts, read from the two runs' results (pure: tests/bench/test_bench_hostile.py).

Issue 51's target: under the hostile mix the victim's answers keep their documents and their first token
stays within ``target_s`` of alone. Beside it, whether each attacker met the door it should have: every
oversized title refused naming ``title`` (400 / INVALID_ARGUMENT, not a 413 or a crash), every 4 MiB
document accepted, and the holder's streams actually held (else the run did not test what it says).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TITLE_REFUSALS = frozenset({"grpc:INVALID_ARGUMENT", "http:400"})  # what an oversized title should meet
ACCEPTED = "grpc:OK"  # an accepted upload's outcome
TITLE_FIELD = "title"  # the field a title refusal's message names
QUANTILES = ("p50", "p99")  # the victim's TTFT compared with alone at each
PASS, MISS = "PASS", "MISS"


def rise(hostile: float | None, alone: float | None) -> float | None:
    """How much later under the mix (s), or None when either run has no figure."""
    return None if hostile is None or alone is None else round(hostile - alone, 4)


def titles_refused(refused: Mapping[str, Any]) -> bool:
    """Every oversized-title call met a 400 / INVALID_ARGUMENT whose message names the title (and there was one)."""
    outcomes: Mapping[str, int] = refused.get("outcomes", {})
    messages: Mapping[str, str] = refused.get("messages", {})
    return bool(outcomes) and all(o in TITLE_REFUSALS and TITLE_FIELD in messages.get(o, "") for o in outcomes)


def uploads_accepted(accepted: Mapping[str, Any]) -> bool:
    """At least one 4 MiB upload accepted with its chunks embedded, and none refused."""
    outcomes: Mapping[str, int] = accepted.get("outcomes", {})
    return set(outcomes) == {ACCEPTED} and int(accepted.get("chunks_embedded", 0)) > 0


def victim_whole(run: Mapping[str, Any], requests: int) -> bool:
    """Every victim request answered (no error: a RESOURCE_EXHAUSTED / 429 is one), each on its documents."""
    docs: Mapping[str, int] = run.get("documents", {})
    return run.get("completed") == requests and not run.get("errors") and docs.get("lost", 1) == 0 \
        and docs.get("kept") == requests


def targets(runs: Mapping[str, Mapping[str, Any]], requests: int, target_s: float) -> dict[str, Any]:
    """The hostile run against alone: TTFT rises, documents kept, the attackers' outcomes, and the verdict."""
    alone, hostile = runs["alone"], runs["hostile"]
    rises = {q: rise(hostile.get(f"ttft_{q}_s"), alone.get(f"ttft_{q}_s")) for q in QUANTILES}
    ttft_within = all(r is not None and r <= target_s for r in rises.values())
    kept = victim_whole(alone, requests) and victim_whole(hostile, requests)
    holder = hostile.get("holder", {})
    out = {f"ttft_{q}_rise_s": r for q, r in rises.items()} | {
        "target_s": target_s, "ttft_within": ttft_within, "documents_kept": kept,
        "titles_refused": titles_refused(hostile.get("refused", {})),
        "uploads_accepted": uploads_accepted(hostile.get("accepted", {})),
        "streams_held": int(holder.get("held_peak", 0)) > 0,
    }
    out["verdict"] = PASS if ttft_within and kept else MISS
    return out
