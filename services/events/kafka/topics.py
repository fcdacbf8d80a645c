"""Where each stream lives on Kafka: its topic (its dead-letter topic follows) and its outbox file.

``KafkaSettings.topic`` carries ``GENERATIONS``, ``KafkaSettings.documents_topic`` ``DOCUMENTS``. The
publishers and consumer runners of a stream take ``stream_settings(settings, stream)``: the same
settings with ``topic`` set to that stream's, so ``dlt_topic`` is that topic's DLT.
"""

from __future__ import annotations

from pathlib import Path

from lookahead_rag.services.events.kafka.settings import KafkaSettings
from lookahead_rag.services.events.streams import DOCUMENTS, GENERATIONS, STREAMS, Stream

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
