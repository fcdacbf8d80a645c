"""The grounding check's rule, picked offline over the signals ``answer_quality_signals`` cached (issue 52).

Every candidate rule withholds what the model itself refused (``squad_eval.abstains``) and, besides, the
answers one signal (or either of two) puts past a threshold. A rule is picked on one half of the sample
(its paragraphs) as the one that withholds the most unanswerable questions while itself withholding at
most ``--max-wrong`` of the answerable ones (beyond the model's own refusals, which no check can undo),
and is then scored on the other half, which it never saw; both directions are reported, with the share
of answerable questions withheld whose answer was right (F1 >= ``RIGHT_F1``).

    python -m lookahead_rag.bench.answer_quality_tune bench/results/quality_signals_qwen05.json \\
        [--max-wrong 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lookahead_rag.bench.answer_quality_signals import HALVES
from lookahead_rag.bench.common import write_json
from lookahead_rag.bench.squad_eval import abstains
from lookahead_rag.services.retriever.citations import CitedPassage
from lookahead_rag.services.retriever.grounded import evidence, ground

PERCENT = 100.0
DEFAULT_MAX_WRONG = 5.0  # % of answerable questions a rule may wrongly withhold (issue 52's target)
CUTS = 24  # cut points tried per signal (quantiles of its values): a coarse grid overfits less
MISSING = 0.0  # a signal an answer lacks (no fork from the refusal, no passage) reads as this
NOTHING_UNFOUND = 1.0  # ``found`` of an answer adding no word to the question: none of its words is missing
RIGHT_F1 = 0.5  # an answer at least this close to a reference counts as right
HALF = 0.5  # a tie's share of a win (separation)


def mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def fork_logprob(row: dict[str, Any]) -> float:
    """The refusal's log-prob where the answer left it: at the first answer token that is not the refusal's
    (its path's last entry), MISSING when the answer is the refusal all along."""
    path, refusal_len = row["refusal_path_logprobs"], len(row["refusal_logprobs"])
    if not path or (len(path) >= refusal_len and row["tokens"][:refusal_len] == row.get("refusal_ids")):
        return MISSING
    return path[-1]


def fork_margin(row: dict[str, Any]) -> float:
    """The refusal's log-prob at the fork less the answer's own token's there (<= 0: greedy took the larger)."""
    path = row["refusal_path_logprobs"]
    return fork_logprob(row) - row["logprobs"][len(path) - 1] if path else MISSING


def features(row: dict[str, Any], refusal: str) -> dict[str, float]:
    """The candidate signals of one cached answer, each the larger the better supported (the refusal's
    log-probs negated)."""
    passages = [CitedPassage(p["doc_id"], p["chunk_id"], p["text"]) for p in row["passages"]]
    e = evidence(row["answer"], passages, row["question"], refusal)
    scores = [p["score"] for p in row["passages"]]
    answer_lp, refusal_lp = mean(row["logprobs"]), mean(row["refusal_logprobs"])
    return {"share": e.share, "found": NOTHING_UNFOUND if e.found is None else e.found,
            "adds": float(e.found is not None),  # 0: it only restates the question's words
            "top_score": max(scores, default=MISSING), "answer_lp": answer_lp,
            "refusal_gap": answer_lp - refusal_lp, "fork_refusal": -fork_logprob(row),
            "fork_margin": -fork_margin(row)}


@dataclass(frozen=True)
class Rule:
    """Withhold an answer when any of its (signal, threshold) pairs has the signal below the threshold."""

    cuts: tuple[tuple[str, float], ...]

    def withholds(self, f: dict[str, float]) -> bool:
        return any(f[name] < t for name, t in self.cuts)

    def name(self) -> str:
        return " or ".join(f"{n} < {t:.3g}" for n, t in self.cuts) or "model's own refusal only"


@dataclass(frozen=True)
class Item:
    answerable: bool
    refused: bool  # the model itself said the documents do not say
    f: dict[str, float]
    half: int
    f1: float = 0.0  # the answer's SQuAD F1 (answerable questions)


def items_of(data: dict[str, Any]) -> list[Item]:
    refusal = data["refusal"]
    return [Item(r["answerable"], abstains(r["answer"]), features({**r, "refusal_ids": data["refusal_ids"]}, refusal),
                 r["half"], r.get("f1") or 0.0) for r in data["questions"]]


def _pct(flags: Sequence[bool]) -> float:
    return sum(flags) / max(len(flags), 1) * PERCENT


def rates(rule: Rule, items: Sequence[Item]) -> tuple[float, float]:
    """(% unanswerable withheld, % answerable wrongly withheld) under ``rule``, the model's refusals included."""
    return (_pct([i.refused or rule.withholds(i.f) for i in items if not i.answerable]),
            _pct([i.refused or rule.withholds(i.f) for i in items if i.answerable]))


def added(rule: Rule, items: Sequence[Item]) -> float:
    """% of the answerable questions ``rule`` withholds that the model itself answered."""
    return _pct([not i.refused and rule.withholds(i.f) for i in items if i.answerable])


def right_withheld(rule: Rule, items: Sequence[Item]) -> float:
    """% of the answerable questions ``rule`` withholds whose answer was right (F1 >= RIGHT_F1)."""
    return _pct([not i.refused and rule.withholds(i.f) and i.f1 >= RIGHT_F1 for i in items if i.answerable])


def separation(items: Sequence[Item], name: str) -> float:
    """How well a signal tells the questions apart among those the model answered: the chance that an
    answerable question's value exceeds an unanswerable one's (ties half; 0.5: no better than a coin)."""
    yes = [i.f[name] for i in items if i.answerable and not i.refused]
    no = [i.f[name] for i in items if not i.answerable and not i.refused]
    wins = sum(1.0 if a > b else HALF if a == b else 0.0 for a in yes for b in no)
    return wins / max(len(yes) * len(no), 1)


def thresholds(items: Sequence[Item], name: str, cuts: int = CUTS) -> list[float]:
    """At most ``cuts`` cut points of a signal, midway between observed values at its quantiles."""
    values = sorted({i.f[name] for i in items})
    if len(values) < 2:
        return []
    step = max(1, (len(values) - 1) // cuts)
    return [(values[j] + values[j + 1]) / 2 for j in range(0, len(values) - 1, step)]


def candidates(items: Sequence[Item], names: Sequence[str], pairs: bool) -> list[Rule]:
    """Every single-signal rule over its cut points, and with ``pairs`` every OR of two signals' rules."""
    singles = [Rule(((n, t),)) for n in names for t in thresholds(items, n)]
    if not pairs:
        return singles
    return singles + [Rule((*a.cuts, *b.cuts)) for a, b in itertools.combinations(singles, 2)
                      if a.cuts[0][0] != b.cuts[0][0]]


def pick(items: Sequence[Item], rules: Sequence[Rule], max_wrong: float) -> tuple[Rule, float, float]:
    """The rule withholding the most unanswerable questions while itself withholding at most ``max_wrong``
    of the answerable ones (ties: fewer wrong)."""
    best: tuple[tuple[float, float], Rule, float, float] | None = None
    for rule in rules:
        good, wrong = rates(rule, items)
        if added(rule, items) <= max_wrong and (best is None or (good, -wrong) > best[0]):
            best = ((good, -wrong), rule, good, wrong)
    if best is None:
        rule = Rule(())
        return (rule, *rates(rule, items))
    return best[1], best[2], best[3]


def study(items: Sequence[Item], names: Sequence[str], max_wrong: float, pairs: bool,
          prefilter: Callable[[Rule], bool] = lambda _: True) -> list[dict[str, Any]]:
    """For each half: the rule picked on it and its rates there, and on the other half."""
    out = []
    for half in range(HALVES):
        tune = [i for i in items if i.half == half]
        held_out = [i for i in items if i.half != half]
        rule, good, wrong = pick(tune, [r for r in candidates(tune, names, pairs) if prefilter(r)], max_wrong)
        vgood, vwrong = rates(rule, held_out)
        out.append({"tuned_on": half, "rule": rule.name(), "cuts": list(rule.cuts),
                    "tune_unanswerable_withheld_pct": round(good, 1), "tune_answerable_withheld_pct": round(wrong, 1),
                    "held_out_unanswerable_withheld_pct": round(vgood, 1),
                    "held_out_answerable_withheld_pct": round(vwrong, 1),
                    "held_out_added_answerable_withheld_pct": round(added(rule, held_out), 1),
                    "held_out_right_withheld_pct": round(right_withheld(rule, held_out), 1),
                    "tune_n": len(tune), "held_out_n": len(held_out)})
    return out


def product_check(data: dict[str, Any]) -> dict[str, float]:
    """The product's own check (``grounded.ground``, as the generator applies it) over the cached answers:
    % unanswerable withheld, % answerable withheld, of them the check's own and those whose answer was right."""
    held = []
    for r in data["questions"]:
        passages = [CitedPassage(p["doc_id"], p["chunk_id"], p["text"]) for p in r["passages"]]
        checked = not ground(r["answer"], passages, r["question"], data["refusal"]).grounded
        held.append((r, abstains(r["answer"]), checked))
    yes = [h for h in held if h[0]["answerable"]]
    no = [h for h in held if not h[0]["answerable"]]
    return {"unanswerable_withheld_pct": round(_pct([a or c for _, a, c in no]), 1),
            "answerable_withheld_pct": round(_pct([a or c for _, a, c in yes]), 1),
            "check_own_answerable_pct": round(_pct([c and not a for _, a, c in yes]), 1),
            "right_withheld_pct": round(_pct([c and not a and (r["f1"] or 0) >= RIGHT_F1 for r, a, c in yes]), 1)}


SIGNAL_SETS = {  # what each family of checks may read
    "text only (span, overlap)": ("share", "found", "adds"),
    "+ retrieval score": ("share", "found", "adds", "top_score"),
    "model: answer log-prob": ("answer_lp",),
    "model: refusal at the fork": ("fork_refusal", "fork_margin"),
    "model: refusal vs answer (extra forward)": ("refusal_gap",),
    "all": ("share", "found", "adds", "top_score", "answer_lp", "fork_refusal", "fork_margin", "refusal_gap"),
}


def tuned(row: dict[str, Any], part: str) -> str:
    """``unanswerable withheld / answerable withheld`` of a study row's part (tune, held_out), in percent."""
    return f"{row[part + '_unanswerable_withheld_pct']:5.1f}/{row[part + '_answerable_withheld_pct']:4.1f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lookahead_rag.bench.answer_quality_tune", description=__doc__)
    p.add_argument("signals", help="answer_quality_signals' JSON")
    p.add_argument("--max-wrong", type=float, default=DEFAULT_MAX_WRONG, help="% answerable wrongly withheld")
    p.add_argument("--json", default="", help="write the study here")
    args = p.parse_args(argv if argv is not None else sys.argv[1:])
    with open(args.signals) as f:
        data = json.load(f)
    items = items_of(data)
    result: dict[str, Any] = {"kind": "quality_tune", "signals": args.signals, "max_wrong_pct": args.max_wrong,
                              "model_only": list(rates(Rule(()), items)), "families": {},
                              "separation": {n: round(separation(items, n), 2) for n in items[0].f} if items else {}}
    print(f"model's own refusals: {result['model_only'][0]:.1f}% unanswerable, {result['model_only'][1]:.1f}% "
          "answerable")
    result["product_check"] = product_check(data)
    print("the product's check (grounded.ground): " + ", ".join(f"{k} {v}" for k, v in result["product_check"].items()))
    print("separation (answerable above unanswerable, 0.5: a coin): "
          + ", ".join(f"{n} {v:.2f}" for n, v in result["separation"].items()))
    for family, names in SIGNAL_SETS.items():
        for pairs in (False, True):
            key = f"{family}{' (pairs)' if pairs else ''}"
            rows = study(items, names, args.max_wrong, pairs)
            result["families"][key] = rows
            for r in rows:
                print(f"{key:48} on {r['tuned_on']}: {r['rule']:56} tune {tuned(r, 'tune')}  held out "
                      f"{tuned(r, 'held_out')} (the check's own {r['held_out_added_answerable_withheld_pct']:4.1f}, "
                      f"right {r['held_out_right_withheld_pct']:3.1f})")
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
