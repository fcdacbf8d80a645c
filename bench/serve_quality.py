"""Answer quality of a serve way: SQuAD EM / F1 of each completed request's answer against its question's.

A request is scored when its place in the sequence names a question (``qid``) with reference answers:
drawn questions always do, a replay does when its file recorded the sequence (bench serve's own
recordings). Speed and quality of one way then stand in one row (bench/squad_eval.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lookahead_rag.bench.common import answerable, read_jsonl
from lookahead_rag.bench.dataset import Source
from lookahead_rag.bench.serve_stats import RequestRecord
from lookahead_rag.bench.squad_eval import quality_row, score


def reference_answers(questions: Source) -> dict[str, list[str]]:
    """qid -> the reference answers of every answerable question of the file that has some."""
    return {str(q["id"]): list(q["answers"]) for q in answerable(read_jsonl(questions)) if q.get("answers")}


def question_ids(sequence: Sequence[Mapping[str, Any]]) -> dict[int, str]:
    """Request index -> qid, from the sequence as --record writes it (entries without a qid are left out)."""
    return {int(s["index"]): str(s["qid"]) for s in sequence if s.get("qid") is not None}


def answer_quality(records: Sequence[RequestRecord], qids: Mapping[int, str],
                   answers: Mapping[str, list[str]], tokenizer: Any) -> dict[str, float | int | None]:
    """Mean SQuAD EM / F1 (percent) of the completed requests whose question has reference answers."""
    scores = []
    for r in records:
        refs = answers.get(qids.get(r.index, ""))
        if r.completed and refs:
            scores.append(score(tokenizer.decode(r.output_ids, skip_special_tokens=True), refs))
    return quality_row(scores)
