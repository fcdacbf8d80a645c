"""bench serve's answer quality: each completed request scored against its question's references."""

from __future__ import annotations

import json
from pathlib import Path

from lookahead_rag.bench.serve_quality import answer_quality, question_ids, reference_answers
from lookahead_rag.bench.serve_stats import EngineStats, RequestRecord


class WordTokenizer:
    """Decodes ids as the words of a fixed list (id i -> WORDS[i])."""

    WORDS = ("France", "in", "Paris", "Rollo")

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return " ".join(self.WORDS[i] for i in ids)


def record(index: int, output: list[int], completed: bool = True) -> RequestRecord:
    return RequestRecord(index=index, sent_s=0.0, output_ids=output,
                         stats=EngineStats() if completed else None, error=None if completed else "UNAVAILABLE")


def test_requests_are_scored_by_their_question(tmp_path: Path) -> None:
    # request 0 answers q1 exactly, request 1 answers q2 half right (F1 2/3), request 2 failed (not
    # scored), request 3's question has no references (not scored)
    questions = tmp_path / "q.jsonl"
    rows = [{"id": "q1", "question": "?", "answers": ["France"]}, {"id": "q2", "question": "?", "answers": ["Paris"]},
            {"id": "q3", "question": "?", "answers": []}, {"id": "q4", "question": "?", "answerable": False}]
    questions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    answers = reference_answers(questions)
    assert answers == {"q1": ["France"], "q2": ["Paris"]}
    qids = question_ids([{"index": 0, "qid": "q1"}, {"index": 1, "qid": "q2"}, {"index": 2, "qid": "q1"},
                         {"index": 3, "qid": "q3"}, {"index": 4}])
    assert qids == {0: "q1", 1: "q2", 2: "q1", 3: "q3"}
    records = [record(0, [0]), record(1, [1, 2]), record(2, [3], completed=False), record(3, [0]), record(4, [0])]
    got = answer_quality(records, qids, answers, WordTokenizer())
    assert got == {"squad_em": 50.0, "squad_f1": round((1 + 2 / 3) / 2 * 100, 2), "squad_scored": 2}
