"""The configuration's sections, at the top of the house: one table, one ``AllSettings``.

Each section is one TOML table and one env prefix (``lookahead_rag.services.common.ports.ENV_PREFIXES``)::

    settings = AllSettings.load("lar.toml", generator={"port": 0})   # defaults < file < env < overrides

``lookahead_rag.services.common`` knows how to load one section; only this module knows which sections exist,
so an unknown table in the file is refused here with a did-you-mean.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic_settings import BaseSettings

from lookahead_rag.services.common.auth.settings import AuthSettings
from lookahead_rag.services.common.auth.tls import TlsSettings
from lookahead_rag.services.common.model_settings import ModelSettings
from lookahead_rag.services.common.rpc.channel_config import ChannelSettings
from lookahead_rag.services.common.rules.limits import RequestLimits
from lookahead_rag.services.common.settings import (
    ConfigError,
    LoggingSettings,
    PathArg,
    TracingSettings,
    check_tables,
    config_path,
    load_settings,
)
from lookahead_rag.services.draftcache.settings import DraftCacheSettings
from lookahead_rag.services.events.kafka.settings import KafkaSettings
from lookahead_rag.services.generator.settings import GeneratorSettings
from lookahead_rag.services.http.settings import HttpSettings
from lookahead_rag.services.retriever.event_size import largest_change_bytes
from lookahead_rag.services.retriever.settings import RetrieverSettings

# section (TOML table) -> its settings class
SECTIONS: dict[str, type[BaseSettings]] = {
    "model": ModelSettings,
    "retriever": RetrieverSettings,
    "draftcache": DraftCacheSettings,
    "generator": GeneratorSettings,
    "limits": RequestLimits,
    "http": HttpSettings,
    "auth": AuthSettings,
    "kafka": KafkaSettings,
    "tls": TlsSettings,
    "channels": ChannelSettings,
    "tracing": TracingSettings,
    "logging": LoggingSettings,
}


@dataclass
class AllSettings:
    """The sections the services run with (logging is read on its own, once per process)."""

    model: ModelSettings
    generator: GeneratorSettings
    retriever: RetrieverSettings
    draftcache: DraftCacheSettings
    limits: RequestLimits
    kafka: KafkaSettings
    http: HttpSettings
    auth: AuthSettings
    tls: TlsSettings
    channels: ChannelSettings
    tracing: TracingSettings = field(default_factory=TracingSettings)  # off unless an OTLP endpoint is set

    def __post_init__(self) -> None:
        check_record_size(self)

    @classmethod
    def load(cls, config_file: PathArg = None, **sections: dict[str, Any]) -> AllSettings:
        """Defaults < TOML file < environment < ``sections`` overrides (e.g. generator={"port": 0})."""
        path = config_path(config_file)
        if path is not None:
            check_tables(path, SECTIONS)
        return cls(
            model=load_settings(ModelSettings, "model", path, **sections.get("model", {})),
            generator=load_settings(GeneratorSettings, "generator", path, **sections.get("generator", {})),
            retriever=load_settings(RetrieverSettings, "retriever", path, **sections.get("retriever", {})),
            draftcache=load_settings(DraftCacheSettings, "draftcache", path, **sections.get("draftcache", {})),
            limits=load_settings(RequestLimits, "limits", path, **sections.get("limits", {})),
            kafka=load_settings(KafkaSettings, "kafka", path, **sections.get("kafka", {})),
            http=load_settings(HttpSettings, "http", path, **sections.get("http", {})),
            auth=load_settings(AuthSettings, "auth", path, **sections.get("auth", {})),
            tls=load_settings(TlsSettings, "tls", path, **sections.get("tls", {})),
            channels=load_settings(ChannelSettings, "channels", path, **sections.get("channels", {})),
            tracing=load_settings(TracingSettings, "tracing", path, **sections.get("tracing", {})),
        )


def check_record_size(settings: AllSettings) -> None:
    """With Kafka on, the largest document event the retriever's limits allow must fit the bus's records
    (else one such document would never leave the outbox); raises ConfigError naming both settings."""
    largest = largest_change_bytes(settings.retriever, settings.limits)
    if settings.kafka.enabled and largest > settings.kafka.max_record_bytes:
        raise ConfigError(
            f"[kafka] max_record_bytes {settings.kafka.max_record_bytes} is below the largest document event "
            f"[retriever] max_doc_chars {settings.retriever.max_doc_chars} and [limits] allow ({largest} bytes): "
            "raise it (and the topics' max.message.bytes) or lower max_doc_chars"
        )
