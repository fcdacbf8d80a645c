"""Builders of test data shared by every test folder: the ``GenerationCompleted`` event."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence

from lookahead_rag.v1 import events_pb2

TOKENIZER = "tok-a"  # the tokenizer id tests use unless they test tokenizer isolation


def completed(
    tenant: str = "acme",
    *,
    event_id: str | None = None,
    question: str = "",
    answer: str = "",
    prompt_ids: Sequence[int] = (),
    output_ids: Sequence[int] = (),
    tokenizer_id: str = TOKENIZER,
    created_unix_ms: int = 0,
) -> events_pb2.GenerationCompleted:
    """A GenerationCompleted as the generator publishes it; a fresh event id unless ``event_id`` is given.

    ``created_unix_ms`` stays 0 (no created time: consumers record no event age) unless given.
    """
    return events_pb2.GenerationCompleted(
        event_id=event_id or uuid.uuid4().hex,
        tenant=tenant,
        tokenizer_id=tokenizer_id,
        question=question,
        answer_text=answer,
        prompt_ids=list(prompt_ids),
        output_ids=list(output_ids),
        created_unix_ms=created_unix_ms,
    )


def completed_events(
    count: int, tenants: tuple[str, ...] = ("acme", "globex", "initech")
) -> list[events_pb2.GenerationCompleted]:
    """``count`` events spread round-robin over ``tenants``, numbered per tenant: the n-th event of a
    tenant asks ``f"{tenant}-q{n}"``, answers ``f"answer {n}"`` with output ids ``[n, n + 1]``."""
    seq = dict.fromkeys(tenants, 0)
    now_ms = int(time.time() * 1000)
    out = []
    for i in range(count):
        tenant = tenants[i % len(tenants)]
        n = seq[tenant]
        out.append(completed(tenant, question=f"{tenant}-q{n}", answer=f"answer {n}", prompt_ids=(1, 2, 3),
                             output_ids=(n, n + 1), created_unix_ms=now_ms))
        seq[tenant] += 1
    return out
