"""bench-serve --record / --replay: the file the llama.cpp peer reads, its replay, the clients' order.

The peer (../shared/peers/llamacpp/serve_replay.py) is not imported (CI does not have it): the
fields it reads are checked here by name.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from lookahead_rag.bench.sampling_args import Sampling
from lookahead_rag.bench.serve_args import parse_args
from lookahead_rag.bench.serve_client import closed_loop
from lookahead_rag.bench.serve_load import Question, ReplayPrompt
from lookahead_rag.bench.serve_record import Recording, bench_args, load_replay, record_data, write_record
from lookahead_rag.bench.serve_stats import EngineStats, RequestRecord
from lookahead_rag.v1 import events_pb2, generator_pb2

# what the peer's load_requests / _items / load_references read
PEER_TOP = {"kind", "format", "source", "exact", "note", "bench_args", "sequence", "levels", "bench"}
PEER_REQUEST = {"index", "client", "client_order", "completed", "error", "prompt_ids", "output_ids",
                "reference_ids", "sent_s", "ttft_s", "end_s", "deltas", "stats"}
T0 = 100.0  # the level's first send (perf_counter seconds)


def _args() -> argparse.Namespace:
    return argparse.Namespace(model="smollm2-135m-instruct", dataset="bundled", pool=4, requests=3, zipf=1.1,
                              sampling=Sampling(seed=7), max_new_tokens=8, levels=[1, 2], ways=["on", "off"],
                              mode="", threads=2, tenants_by_title=False, kafka="", gen=[])


def _rec(index: int, prompt: list[int], out: list[int], client: int, order: int,
         error: str | None = None) -> RequestRecord:
    stats = None if error else EngineStats(new_tokens=len(out), forward_steps=2, server={"finish_reason": "length"})
    sent = T0 + index
    deltas = [] if error else [(sent + 0.5, 1), (sent + 0.75, len(out) - 1)]
    return RequestRecord(index, sent, deltas, sent + 1.0, error, prompt, out, stats, client, order)


def _recorded(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    recording = Recording(references={(1, 2, 3): [7, 8, 9], (4, 5): [6, 6]})
    on = [_rec(0, [1, 2, 3], [7, 8, 9], 0, 0), _rec(1, [], [], 1, 0, error="UNAVAILABLE"),
          _rec(2, [4, 5], [6, 5], 0, 1)]
    recording.add(1, "on", on, 3.0)
    recording.add(1, "off", [_rec(0, [9, 9], [1, 2], 0, 0)], 1.0)
    recording.add(2, "on", [_rec(0, [4, 5], [6, 6], 1, 0)], 1.0)
    sequence = [{"index": i, "tenant": f"t{i}", "question": f"q{i}?"} for i in range(3)]
    bench = {"kind": "serve", "levels": {"1": {"on": {"goodput_tokens_per_s": 1.0}}}}
    data = record_data(bench_args(_args()), sequence, recording, bench)
    path = tmp_path / "rec.json"
    assert write_record(path, data) == 5
    return path, json.loads(path.read_text())


def test_the_record_has_every_field_the_peer_reads(tmp_path: Path) -> None:
    _, d = _recorded(tmp_path)
    assert set(d) >= PEER_TOP
    assert (d["kind"], d["format"], d["source"], d["exact"]) == ("serve_requests", 1, "recorded", True)
    assert d["bench_args"]["temperature"] == 0.0 and d["bench_args"]["max_new_tokens"] == 8
    assert d["bench"]["levels"]["1"]["on"]["goodput_tokens_per_s"] == 1.0  # the peer's "project" rows
    reqs = d["levels"]["1"]["on"]["requests"]
    assert all(set(r) == PEER_REQUEST for r in reqs) and [r["index"] for r in reqs] == [0, 1, 2]
    first, failed, last = reqs
    assert (first["client"], first["client_order"], last["client"], last["client_order"]) == (0, 0, 0, 1)
    assert first["prompt_ids"] == [1, 2, 3] and first["output_ids"] == [7, 8, 9]
    assert first["reference_ids"] == [7, 8, 9] and last["reference_ids"] == [6, 6]  # the serial baseline's
    assert (first["completed"], first["error"], failed["completed"], failed["error"]) == (True, None, False,
                                                                                          "UNAVAILABLE")
    assert failed["reference_ids"] is None and failed["ttft_s"] is None
    # times from the level's first send
    assert (first["sent_s"], first["ttft_s"], first["end_s"]) == (0.0, 0.5, 1.0)
    assert last["deltas"] == [[2.5, 1], [2.75, 1]]
    assert first["stats"]["new_tokens"] == 3 and first["stats"]["server"] == {"finish_reason": "length"}
    assert d["levels"]["1"]["on"]["wall_s"] == 3.0 and set(d["levels"]) == {"1", "2"}


def test_the_replay_takes_one_recorded_way_in_index_order_and_skips_requests_without_prompts(
        tmp_path: Path) -> None:
    path, _ = _recorded(tmp_path)
    replay = load_replay(path)  # default: the first level's on
    assert (replay.level, replay.way, replay.file) == (1, "on", "rec.json")
    assert replay.prompts == [ReplayPrompt("t0", (1, 2, 3)), ReplayPrompt("t2", (4, 5))]
    assert replay.skipped == [1]
    assert [(s["index"], s["source_index"], s["question"]) for s in replay.sequence] == [(0, 0, "q0?"), (1, 2, "q2?")]
    assert replay.describe()["prompts"] == 2 and replay.describe()["skipped"] == 1
    assert replay.drawn == {"zipf": 1.1, "pool": 4}  # the recording's JSON has neither: its arguments
    assert load_replay(path, (1, "off")).prompts == [ReplayPrompt("t0", (9, 9))]


def test_the_replay_brings_the_recorded_serial_answers_only_for_the_same_baseline(tmp_path: Path) -> None:
    path, _ = _recorded(tmp_path)
    replay = load_replay(path)
    same = bench_args(_args())
    # the recording's serial answers, by prompt: no need to time HF again for the exact-match references
    assert replay.references_for(same) == {(1, 2, 3): [7, 8, 9], (4, 5): [6, 6]}
    # another length or seed makes other answers: none are reused
    assert replay.references_for({**same, "max_new_tokens": 16}) == {}
    assert replay.references_for({**same, "seed": 8}) == {}


def _usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2  # argparse's usage error
    return capsys.readouterr().err


def test_replay_arguments_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = _recorded(tmp_path)
    assert "no such file" in _usage_error(["--replay", str(tmp_path / "missing.json")], capsys)
    err = _usage_error(["--replay", str(path), "--replay-from", "4:on"], capsys)
    assert "4:on" in err and "recorded: 1:off, 1:on, 2:on" in err
    assert "1:safe" in _usage_error(["--replay", str(path), "--replay-from", "1:safe"], capsys)
    assert "not C:WAY" in _usage_error(["--replay", str(path), "--replay-from", "on"], capsys)
    assert "needs --replay" in _usage_error(["--replay-from", "1:on"], capsys)
    other = tmp_path / "serve.json"
    other.write_text(json.dumps({"kind": "serve", "levels": {}}))
    assert "not a bench-serve --record file" in _usage_error(["--replay", str(other)], capsys)
    args = parse_args(["--replay", str(path), "--replay-from", "2:on", "--ways", "serial_hf"])
    assert args.replayed.prompts == [ReplayPrompt("t0", (4, 5))] and args.ways == ["serial_hf"]
    assert parse_args([]).replayed is None


class FakeStub:
    """Answers every call at once with one delta and a final; remembers what each call asked."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.metadata: list[dict[str, str]] = []  # each Generate call's metadata

    async def _stream(self, prompt: list[int]) -> AsyncIterator[generator_pb2.AnswerChunk]:
        await asyncio.sleep(0)  # let the other clients take their turn
        yield generator_pb2.AnswerChunk(delta=generator_pb2.TextDelta(token_ids=[42]))
        final = generator_pb2.FinalInfo(prompt_ids=prompt, output_ids=[42],
                                        stats=events_pb2.GenerationStats(new_tokens=1, forward_steps=1))
        yield generator_pb2.AnswerChunk(final=final)

    def Answer(self, request: generator_pb2.AnswerRequest, timeout: float,
               metadata: tuple[tuple[str, str], ...] = ()) -> AsyncIterator[Any]:
        self.calls.append(("Answer", request))
        return self._stream([1])

    def Generate(self, request: generator_pb2.GenerateRequest, timeout: float,
                 metadata: tuple[tuple[str, str], ...] = ()) -> AsyncIterator[Any]:
        self.calls.append(("Generate", request))
        self.metadata.append(dict(metadata))
        return self._stream(list(request.prompt_ids.ids))


def test_replayed_prompts_go_through_generate_and_every_record_names_its_client() -> None:
    stub = FakeStub()
    seq = [ReplayPrompt(f"t{i}", (i + 1, i + 2)) for i in range(5)]
    records, _ = asyncio.run(closed_loop(stub, seq, 2, "", 4, 10.0, "test"))
    assert [name for name, _ in stub.calls] == ["Generate"] * 5
    sent = [(r.tenant, list(r.prompt_ids.ids), r.WhichOneof("input")) for _, r in stub.calls]
    assert sent == [(f"t{i}", [i + 1, i + 2], "prompt_ids") for i in range(5)]
    assert [r.prompt_ids for r in records] == [[i + 1, i + 2] for i in range(5)]
    assert [m["x-tenant"] for m in stub.metadata] == [f"t{i}" for i in range(5)]  # what a proxy routes on
    assert {r.client for r in records} == {0, 1}
    for k in (0, 1):  # each client's requests, in the order it sent them
        mine = [r for r in records if r.client == k]
        assert [r.client_order for r in mine] == list(range(len(mine)))
    answered = FakeStub()  # a drawn question still goes through Answer
    asked = asyncio.run(closed_loop(answered, [Question("1", "t", "why?")], 1, "", 4, 10.0, "test"))[0]
    assert [name for name, _ in answered.calls] == ["Answer"] and answered.calls[0][1].question == "why?"
    assert asked[0].completed and (asked[0].client, asked[0].client_order) == (0, 0)
