"""Issue 51's hostile mix: while queries arrive, bulk embedding (ingest) paces itself to its share of the time,
pausing between its slices outside the encoder's gate, so an engine on the same cores keeps them; with no
query lately it runs flat out. A fake encoder and clock: no model, no real sleep."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from lookahead_rag.services.retriever.encode_gate import GatedEncoder
from lookahead_rag.services.retriever.settings import RetrieverSettings

SLICE_S = 0.4  # what one fake encoder call takes on the fake clock
WINDOW_S = 10.0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeEncoder:
    dim = 2

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        self.clock.now += SLICE_S
        return np.ones((len(texts), self.dim), dtype=np.float32)

    def encode_one(self, text: str) -> np.ndarray:
        return self.encode([text])


def paced(share: float) -> tuple[GatedEncoder, Clock, list[float]]:
    clock, pauses = Clock(), []
    encoder: GatedEncoder

    def sleep(seconds: float) -> None:
        assert not encoder.gate._busy  # paused outside the gate: a query's turn is not held up
        pauses.append(seconds)
        clock.now += seconds

    encoder = GatedEncoder(FakeEncoder(clock), slice_texts=2, busy_share=share, busy_window_s=WINDOW_S,
                           clock=clock, sleep=sleep)
    return encoder, clock, pauses


def test_with_queries_arriving_bulk_embedding_takes_its_share_of_the_time() -> None:
    encoder, clock, pauses = paced(0.25)
    encoder.encode_one("a question")
    start = clock.now
    assert encoder.encode([f"t{i}" for i in range(8)]).shape == (8, 2)  # 4 slices of 2
    assert pauses == pytest.approx([SLICE_S * 3] * 3)  # between slices, none after the last
    busy = 4 * SLICE_S
    assert busy / (clock.now - start) == pytest.approx(4 / 13)  # 0.25 over the slices' period, the last unpaused


def test_with_no_query_lately_bulk_embedding_runs_flat_out() -> None:
    encoder, clock, pauses = paced(0.25)
    encoder.encode([f"t{i}" for i in range(8)])  # no query ever: a first load
    assert pauses == []
    encoder.encode_one("a question")
    clock.now += WINDOW_S + 1  # that query is past the window
    encoder.encode([f"t{i}" for i in range(8)])
    assert pauses == []


def test_a_share_of_one_never_pauses_and_a_share_out_of_range_is_refused() -> None:
    encoder, _, pauses = paced(1.0)
    encoder.encode_one("a question")
    encoder.encode([f"t{i}" for i in range(8)])
    assert pauses == []
    for share in (0.0, 1.5):
        with pytest.raises(ValueError):
            paced(share)


def test_the_retriever_paces_ingest_by_default() -> None:
    fields = RetrieverSettings.model_fields
    assert fields["ingest_busy_share"].default < 1 and fields["ingest_busy_window_s"].default > 0
