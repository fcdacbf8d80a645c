"""Settings of the feedback-loop event bus (``lookahead_rag.services.events.factory.make_bus`` reads them).

Empty ``bootstrap_servers`` (the default) means the embedded in-process bus; anything else means
Kafka. Every field can be set from the environment with the ``LAR_KAFKA_`` prefix, e.g.
``LAR_KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092``.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from lookahead_rag.services.events.protocols import DRAFTCACHE_GROUP, RETRIEVER_GROUP

OUTBOX_FILE = "outbox.sqlite3"
FRAMED_FORMAT = "framed"  # record_format: the pre-header values (see events.records)
STATE_DIR = "bus-state"
MIB = 1024 * 1024
# The largest DocumentChanged the default [retriever] max_doc_chars (5,000,000 characters, 4 bytes each at
# most in UTF-8) and [limits] title/source/id allow is ~20 MB; 24 MiB holds it with room for headers.
DEFAULT_MAX_RECORD_BYTES = 24 * MIB


class KafkaSettings(BaseSettings):
    """Event-bus configuration: the Kafka cluster, topics, producer, consumers and recovery."""

    model_config = SettingsConfigDict(env_prefix="LAR_KAFKA_", extra="ignore")

    # --- where ---
    bootstrap_servers: str = Field(
        "", description="comma-separated host:port of the Kafka cluster; empty = in-process bus"
    )
    topic: str = Field("lookahead.generation-completed", description="topic of GenerationCompleted events")
    documents_topic: str = Field(
        "lookahead.documents", description="topic of DocumentChanged events (compacted: each document's latest change)"
    )
    dlt_suffix: str = Field(".DLT", description="dead-letter topic = topic + this suffix")
    create_topics: bool = Field(True, description="create the topics and their DLTs on start if missing")
    partitions: int = Field(6, ge=1, description="partitions of the topic when this code creates it")
    dlt_partitions: int = Field(1, ge=1, description="partitions of the DLT when this code creates it")
    replication_factor: int = Field(1, ge=1, description="replication factor of created topics (3 in prod)")
    client_id: str = Field("lookahead-rag", description="Kafka client id prefix seen in broker logs")

    # --- security (aiokafka's names; services.events.kafka.security turns them into client kwargs) ---
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="how clients talk to the brokers: TLS (SSL), SASL, both (SASL_SSL) or neither"
    )
    ssl_cafile: Path | None = Field(
        None, description="PEM CA bundle the brokers are verified against (SSL, SASL_SSL; None: system roots)"
    )
    ssl_certfile: Path | None = Field(None, description="PEM client certificate for brokers requiring mutual TLS")
    ssl_keyfile: Path | None = Field(None, description="PEM private key of ssl_certfile (if not inside it)")
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = Field(
        "PLAIN", description="SASL mechanism (SASL_PLAINTEXT, SASL_SSL); PLAIN sends the password: use SASL_SSL"
    )
    sasl_plain_username: str = Field("", description="SASL user name (SASL_PLAINTEXT, SASL_SSL)")
    sasl_plain_password: SecretStr | None = Field(
        None, description="SASL password (SASL_PLAINTEXT, SASL_SSL); prefer the env variable to the file"
    )

    # --- producer ---
    acks: Literal["all", "1", "0"] = Field("all", description="producer acks; 'all' = every in-sync replica")
    enable_idempotence: bool = Field(
        False, description="idempotent producer (on for real Kafka; tansu fails its start with UnknownError)"
    )
    linger_ms: int = Field(5, ge=0, description="producer batching delay in ms")
    request_timeout_ms: int = Field(10_000, ge=1, description="producer/consumer request timeout in ms")
    max_record_bytes: int = Field(
        DEFAULT_MAX_RECORD_BYTES, ge=1, description="largest record the producer sends (its max_request_size) and "
        "the topics' max.message.bytes; `serve` refuses a [retriever] max_doc_chars whose events exceed it"
    )
    record_format: Literal["headers", "framed"] = Field(
        "headers", description="'headers': bare protobuf values, the type in a ce_type header; 'framed': the "
        "pre-header values, only while consumers older than headers still run (a rolling upgrade)"
    )

    # --- outbox ---
    outbox_path: Path | None = Field(None, description="SQLite outbox file; None = <data_dir>/outbox.sqlite3")
    outbox_synchronous: Literal["FULL", "NORMAL"] = Field(
        "FULL", description="SQLite synchronous mode: FULL survives power loss, NORMAL only process crashes"
    )
    outbox_batch_size: int = Field(500, ge=1, description="outbox rows sent per flush round")
    outbox_poll_interval_s: float = Field(1.0, gt=0, description="flusher re-check period when not woken")
    send_timeout_s: float = Field(15.0, gt=0, description="give up on one flush round after this long")

    # --- consumers ---
    draftcache_group: str = Field("lookahead-rag.draftcache", description="consumer group of the draft cache")
    retriever_group: str = Field(
        "lookahead-rag.retriever", description="consumer group of the retriever (+ '.<replica id>' per replica)"
    )
    group_prefix: str = Field("lookahead-rag.", description="group id prefix for other logical consumers")
    replica_id: str = Field(
        "", description="this replica's suffix of per-replica group ids (every-replica consumers); empty = host name"
    )
    session_timeout_ms: int = Field(
        6_000, ge=1, description="group session timeout (tansu joins after ~half of it, 1 s at least)"
    )
    heartbeat_interval_ms: int = Field(1_000, ge=1, description="group heartbeat period (< session/3)")
    fetch_max_wait_ms: int = Field(50, ge=0, description="longest a fetch waits for data (bounds lag)")
    max_poll_records: int = Field(500, ge=1, description="records handled per poll")
    poll_timeout_ms: int = Field(200, ge=1, description="getmany timeout: loop period for timers and stop")
    commit_interval_s: float = Field(
        0.0, ge=0, description="commit applied offsets at most this often (0 = every batch; always on revoke)"
    )
    commit_timeout_s: float = Field(5.0, gt=0, description="give up on one offset commit after this long")
    state_dir: Path | None = Field(None, description="snapshot+offset files; None = <data_dir>/bus-state")
    snapshot_every_events: int = Field(1000, ge=1, description="write snapshot+offsets every N events")
    snapshot_interval_s: float = Field(30.0, gt=0, description="... or after this long with unsaved events")

    # --- faults ---
    dlt_max_attempts: int = Field(3, ge=1, description="apply attempts before an event is dead-lettered")
    apply_retry_backoff_s: float = Field(0.05, ge=0, description="pause between apply attempts")
    reconnect_backoff_s: float = Field(0.2, gt=0, description="first pause after a broker error")
    reconnect_backoff_max_s: float = Field(5.0, gt=0, description="longest pause between reconnect attempts")
    shutdown_timeout_s: float = Field(10.0, gt=0, description="graceful stop: flush/commit/snapshot deadline")

    @model_validator(mode="after")
    def _security_consistent(self) -> KafkaSettings:
        tls = self.security_protocol in ("SSL", "SASL_SSL")
        sasl = self.security_protocol.startswith("SASL_")
        ssl_files = [name for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile") if getattr(self, name)]
        if ssl_files and not tls:
            raise ValueError(f"{', '.join(ssl_files)} set but security_protocol {self.security_protocol} has no TLS")
        if self.ssl_keyfile is not None and self.ssl_certfile is None:
            raise ValueError("ssl_keyfile needs ssl_certfile")
        if sasl and not (self.sasl_plain_username and self.sasl_plain_password):
            raise ValueError(f"security_protocol {self.security_protocol} needs sasl_plain_username and "
                             "sasl_plain_password")
        return self

    @property
    def dlt_topic(self) -> str:
        return self.topic + self.dlt_suffix

    @property
    def enabled(self) -> bool:
        return bool(self.bootstrap_servers.strip())

    def producer_acks(self) -> int | str:
        return "all" if self.acks == "all" else int(self.acks)

    def group_id(self, group: str) -> str:
        """Kafka group id of a logical consumer name (``draftcache``, ``retriever`` or any other)."""
        known = {DRAFTCACHE_GROUP: self.draftcache_group, RETRIEVER_GROUP: self.retriever_group}
        return known.get(group, self.group_prefix + group)

    def replica_group_id(self, group: str) -> str:
        """Kafka group id of an every-replica consumer: the logical group's id + '.' + this replica's id."""
        return f"{self.group_id(group)}.{self.replica_id or socket.gethostname()}"

    def resolved_outbox_path(self, data_dir: Path) -> Path:
        return self.outbox_path or Path(data_dir) / OUTBOX_FILE

    def resolved_state_dir(self, data_dir: Path) -> Path:
        return self.state_dir or Path(data_dir) / STATE_DIR
