"""``EveryPartitionRunner``: a consumer runner that reads every partition of its topic itself.

For state that each replica holds in full (the retriever's documents and past sessions): members of
one Kafka group split the partitions between them, so two replicas sharing a group would each see
part of the events. This runner assigns itself all partitions (no group membership, no rebalance),
seeks each to the offset its saved state covers, and commits under its own group id (one per
replica: ``KafkaSettings.replica_group_id``) only so that lag tools can follow it. Its state file is
named after the logical consumer, not the group id, so a replica whose id changes (a new host name
over the same volume) still resumes from its snapshot.

Partitions added to the topic later are not picked up until the process restarts.
"""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer, TopicPartition

from lookahead_rag.services.events.kafka.cluster_offsets import MS_PER_S, cluster_view
from lookahead_rag.services.events.kafka.consumer import KafkaConsumerRunner
from lookahead_rag.services.events.kafka.security import client_security


class TopicNotReady(RuntimeError):
    """The topic has no partitions yet (not created): the runner retries with backoff."""


class EveryPartitionRunner(KafkaConsumerRunner):
    """A ``KafkaConsumerRunner`` assigned every partition of its topic (manual assignment)."""

    async def _take_partitions(self, consumer: AIOKafkaConsumer) -> None:
        timeout_s = self.settings.request_timeout_ms / MS_PER_S
        _, partitions = await cluster_view(self.settings.bootstrap_servers, self.topic, timeout_s,
                                           security=client_security(self.settings))
        if not partitions:
            raise TopicNotReady(f"topic {self.topic!r} has no partitions yet")
        assigned = {TopicPartition(self.topic, p) for p in partitions}
        consumer.assign(assigned)
        await self._on_assigned(assigned)  # seeks to the saved offsets (or the beginning); sets assigned
