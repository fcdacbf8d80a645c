"""bench replica-requests: a requests file made without a model that serve --replay reads back as it was
drawn (each request's tenant and its grounded prompt, repeats of a popular question identical)."""

from __future__ import annotations

from pathlib import Path

from lookahead_rag.bench.common import write_json
from lookahead_rag.bench.replica_requests import build, parse_args
from lookahead_rag.bench.serve_record import load_replay


def test_the_file_replays_as_drawn(tmp_path: Path) -> None:
    out = tmp_path / "requests.json"
    data = build(parse_args(["--requests", "12", "--pool", "10", "--out", str(out)]))
    write_json(out, data)
    replay = load_replay(out)
    assert len(replay.prompts) == 12 and not replay.skipped
    pools = [s["pool_index"] for s in data["sequence"]]
    # the same question drawn twice is the same prompt; different questions differ
    for i in range(12):
        for j in range(12):
            assert (replay.prompts[i].prompt_ids == replay.prompts[j].prompt_ids) == (pools[i] == pools[j])
    assert len(set(pools)) < 12  # Zipf: some question came back
