"""What the cluster holds: its id, a topic's partitions, and the topic's end offsets.

End offsets are the high-water marks of fetches sent after the call began, not ListOffsets answers:
the bundled tansu broker answers ListOffsets(latest) wrongly once a produce request carried several
records (it counts batches).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from lookahead_rag.services.events.kafka.security import client_security
from lookahead_rag.services.events.kafka.settings import KafkaSettings

MS_PER_S = 1000


async def cluster_view(bootstrap: str, topic: str, timeout_s: float, *, security: Mapping[str, Any] | None = None
                       ) -> tuple[str, list[int]]:
    """(id of the cluster behind ``bootstrap``, partitions of ``topic`` there); creates nothing.
    ``security``: the TLS/SASL kwargs (``client_security``; None: plaintext)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * MS_PER_S),
                                **(security or {}))
    await admin.start()
    try:
        cluster = str((await admin.describe_cluster()).get("cluster_id") or "")
        topics = await admin.describe_topics(None)  # all topics: naming one may auto-create it
    finally:
        await admin.close()
    found = [t for t in topics if t["topic"] == topic and not t["error_code"]]
    return cluster, sorted(p["partition"] for t in found for p in t["partitions"])


async def log_end_offsets(settings: KafkaSettings) -> tuple[str, dict[int, int]]:
    """(cluster id, partition -> end offset) of the topic; no partitions when it does not exist."""
    timeout_s = settings.request_timeout_ms / MS_PER_S
    security = client_security(settings)
    cluster, partitions = await cluster_view(settings.bootstrap_servers, settings.topic, timeout_s, security=security)
    if not partitions:
        return cluster, {}
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap_servers,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=settings.fetch_max_wait_ms,
        request_timeout_ms=settings.request_timeout_ms,
        **security,
    )
    await consumer.start()
    tps = [TopicPartition(settings.topic, p) for p in partitions]

    async def _fetch_once() -> dict[int, int]:
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        while any(consumer.highwater(tp) is None for tp in tps):
            await consumer.getmany(timeout_ms=settings.poll_timeout_ms, max_records=1)
        return {tp.partition: int(consumer.highwater(tp) or 0) for tp in tps}

    try:
        ends = await asyncio.wait_for(_fetch_once(), timeout_s)
    finally:
        await consumer.stop()
    return cluster, ends
