"""Where each stream lives on Kafka: its topic (its dead-letter topic follows) and its outbox file.

``KafkaSettings.topic`` carries ``GENERATIONS``, ``KafkaSettings.documents_topic`` ``DOCUMENTS``. The
publishers and consumer runners of a stream take ``stream_settings(settings, stream)``: the same
settings with ``topic`` set to that stream's, so ``dlt_topic`` is that topic's DLT.

``topic_configs`` is each topic's configuration, the one the services create and the one the deploy files'
``kafka-topics.sh`` calls pass (a test holds them equal): the generations topic is time-limited (its key is
the tenant: compaction would keep one answer per tenant), the documents topic compacted (its key is
(tenant, doc id): compaction keeps each document's latest change, so a replaced or deleted document's text
leaves the log), every topic takes the producer's largest record.
"""

from __future__ import annotations

from pathlib import Path

from lookahead_rag.services.events.kafka.settings import KafkaSettings
from lookahead_rag.services.events.streams import DOCUMENTS, GENERATIONS, STREAMS, Stream

DAY_MS = 24 * 60 * 60 * 1000
GENERATIONS_RETENTION_MS = 7 * DAY_MS  # how far back a new replica's past sessions and tries reach
DLT_RETENTION_MS = 14 * DAY_MS  # time to inspect and replay a dead letter
COMPACTION_LAG_MS = 7 * DAY_MS  # an old version (a replaced or deleted text) is compacted away within this

TOPIC_FIELDS: dict[str, str] = {  # stream name -> the KafkaSettings field naming its topic
    GENERATIONS.name: "topic",
    DOCUMENTS.name: "documents_topic",
}


def stream_topic(settings: KafkaSettings, stream: Stream) -> str:
    return str(getattr(settings, TOPIC_FIELDS[stream.name]))


def stream_settings(settings: KafkaSettings, stream: Stream) -> KafkaSettings:
    """``settings`` with ``topic`` = the stream's topic (and so ``dlt_topic`` = its DLT)."""
    return settings.model_copy(update={"topic": stream_topic(settings, stream)})


def stream_outbox_path(settings: KafkaSettings, stream: Stream, data_dir: Path) -> Path:
    """The stream's outbox file: the configured one for GENERATIONS, ``<stream>-<that name>`` beside it
    for the others (one outbox per topic: a flusher sends its rows to one topic)."""
    path = settings.resolved_outbox_path(data_dir)
    return path if stream is GENERATIONS else path.with_name(f"{stream.name}-{path.name}")


def all_topics(settings: KafkaSettings) -> dict[str, int]:
    """Every topic the services use and its partitions when created here: each stream's topic and DLT."""
    topics: dict[str, int] = {}
    for stream in STREAMS:
        s = stream_settings(settings, stream)
        topics[s.topic] = s.partitions
        topics[s.dlt_topic] = s.dlt_partitions
    return topics


def stream_configs(settings: KafkaSettings, stream: Stream) -> dict[str, dict[str, str]]:
    """``settings.topic`` (a stream's settings: ``stream_settings``) and its DLT, each with its configuration."""
    size = {"max.message.bytes": str(settings.max_record_bytes)}
    if stream is DOCUMENTS:
        main = {"cleanup.policy": "compact", "max.compaction.lag.ms": str(COMPACTION_LAG_MS)}
    else:
        main = {"cleanup.policy": "delete", "retention.ms": str(GENERATIONS_RETENTION_MS)}
    dlt = {"cleanup.policy": "delete", "retention.ms": str(DLT_RETENTION_MS)}
    return {settings.topic: {**main, **size}, settings.dlt_topic: {**dlt, **size}}


def topic_configs(settings: KafkaSettings) -> dict[str, dict[str, str]]:
    """Every topic the services use (each stream's and its DLT) and its configuration."""
    configs: dict[str, dict[str, str]] = {}
    for stream in STREAMS:
        configs.update(stream_configs(stream_settings(settings, stream), stream))
    return configs
