"""Transport security for Kafka: aiokafka's TLS/SASL arguments from [kafka] settings, refused when
inconsistent, and passed at every client construction site."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lookahead_rag.services.common.settings import ConfigError, load_settings
from lookahead_rag.services.events.kafka import broker, cluster_offsets, consumer, dead_letter, publisher
from lookahead_rag.services.events.kafka.security import client_security
from lookahead_rag.services.events.kafka.settings import KafkaSettings
from tests.services.tls_helpers import Pki

pytestmark = pytest.mark.usefixtures("no_lar_env")


# --- Kafka -----------------------------------------------------------------------------------------


def kafka(pki: Pki, protocol: str, **extra: Any) -> KafkaSettings:
    fields: dict[str, Any] = {"bootstrap_servers": "kafka:9093", "security_protocol": protocol, **extra}
    if protocol in ("SSL", "SASL_SSL"):
        fields |= {"ssl_cafile": pki.ca, "ssl_certfile": pki.client_cert, "ssl_keyfile": pki.client_key}
    if protocol.startswith("SASL_"):
        fields |= {"sasl_plain_username": "lar", "sasl_plain_password": "s3cret"}
    return KafkaSettings(**fields)


def test_kafka_plaintext_kwargs(pki: Pki) -> None:
    # PLAINTEXT: only the protocol, no TLS context and no SASL credentials
    assert client_security(kafka(pki, "PLAINTEXT")) == {"security_protocol": "PLAINTEXT"}


def test_kafka_ssl_kwargs(pki: Pki) -> None:
    # SSL: a verifying context with our CA and client certificate; no SASL
    kwargs = client_security(kafka(pki, "SSL"))
    assert set(kwargs) == {"security_protocol", "ssl_context"} and kwargs["security_protocol"] == "SSL"
    context: ssl.SSLContext = kwargs["ssl_context"]
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert any(dict(x[0] for x in ca["subject"]).get("commonName") == "ca test CA" for ca in context.get_ca_certs())


def test_kafka_sasl_plaintext_kwargs(pki: Pki) -> None:
    # SASL_PLAINTEXT: the mechanism and the credentials (password revealed only here), no TLS context
    kwargs = client_security(kafka(pki, "SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-256"))
    assert kwargs == {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-256",
                      "sasl_plain_username": "lar", "sasl_plain_password": "s3cret"}


def test_kafka_sasl_ssl_kwargs(pki: Pki) -> None:
    # SASL_SSL: both the TLS context and the SASL credentials
    kwargs = client_security(kafka(pki, "SASL_SSL", sasl_mechanism="SCRAM-SHA-512"))
    assert isinstance(kwargs["ssl_context"], ssl.SSLContext) and kwargs["sasl_mechanism"] == "SCRAM-SHA-512"
    assert kwargs["sasl_plain_password"] == "s3cret" and "s3cret" not in repr(kafka(pki, "SASL_SSL"))


@pytest.mark.parametrize(("fields", "error"), [
    ({"security_protocol": "SASL_SSL"}, "needs sasl_plain_username and sasl_plain_password"),
    ({"security_protocol": "SASL_PLAINTEXT", "sasl_plain_username": "lar"}, "sasl_plain_password"),
    ({"ssl_cafile": "ca.pem"}, "ssl_cafile set but security_protocol PLAINTEXT has no TLS"),
    ({"security_protocol": "SSL", "ssl_keyfile": "k.pem"}, "ssl_keyfile needs ssl_certfile"),
])
def test_kafka_security_settings_refuse_inconsistent_values(fields: dict[str, Any], error: str) -> None:
    # a setting that would silently send in clear text, or fail at connect time, is refused at load
    with pytest.raises(ConfigError, match=error):
        load_settings(KafkaSettings, "kafka", **fields)


class _Built(Exception):
    """Raised by a recorded Kafka client constructor: the kwargs are captured, nothing connects."""


class _FakeAdmin:
    """Enough of AIOKafkaAdminClient for cluster_view and ensure_topics."""

    def __init__(self, topic: str) -> None:
        self.topic = topic

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def describe_cluster(self) -> dict[str, str]:
        return {"cluster_id": "test"}

    async def describe_topics(self, _: object) -> list[dict[str, Any]]:
        return [{"topic": self.topic, "error_code": 0, "partitions": [{"partition": 0}]}]

    async def create_topics(self, _: object) -> Any:
        return type("Response", (), {"topic_errors": []})()


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """Every Kafka client constructor in services/events/kafka records its kwargs: producers and
    consumers then raise ``_Built``; admin clients return a fake that answers."""
    calls: list[tuple[str, dict[str, Any]]] = []

    def raising(where: str) -> Callable[..., Any]:
        def make(**kwargs: Any) -> Any:
            calls.append((where, kwargs))
            raise _Built(where)
        return make

    def admin(where: str) -> Callable[..., Any]:
        def make(**kwargs: Any) -> Any:
            calls.append((where, kwargs))
            return _FakeAdmin("events")
        return make

    monkeypatch.setattr(publisher, "AIOKafkaProducer", raising("publisher"))
    monkeypatch.setattr(dead_letter, "AIOKafkaProducer", raising("dead_letter"))
    monkeypatch.setattr(consumer, "AIOKafkaConsumer", raising("consumer"))
    monkeypatch.setattr(cluster_offsets, "AIOKafkaConsumer", raising("log_end_offsets"))
    monkeypatch.setattr(cluster_offsets, "AIOKafkaAdminClient", admin("cluster_view"))
    monkeypatch.setattr(broker, "AIOKafkaAdminClient", admin("ensure_topics"))
    yield calls


def test_every_kafka_client_gets_the_security_kwargs(pki: Pki, tmp_path: Path,
                                                     built: list[tuple[str, dict[str, Any]]]) -> None:
    # each construction site (publisher, its topic creation, dead letters, the group consumer, the
    # every-partition consumer, the cluster-id check, end offsets) passes SASL_SSL, its context and login
    from lookahead_rag.services.events.kafka.replica_consumer import EveryPartitionRunner

    s = kafka(pki, "SASL_SSL", topic="events")

    async def run() -> None:
        pub = publisher.KafkaPublisher(s, tmp_path / "outbox.sqlite3")
        try:
            with pytest.raises(_Built):
                pub._producer()
            await pub._ensure_topics()
        finally:
            pub.outbox.close()
        with pytest.raises(_Built):
            await dead_letter.DeadLetterSender(s, "g").send(None, "reason", ValueError(), 1)  # type: ignore[arg-type]
        runner = consumer.KafkaConsumerRunner(s.bootstrap_servers, s.topic, "g", lambda event: None, tmp_path,
                                              settings=s)
        with pytest.raises(_Built):
            await runner._connect()
        await runner._check_cluster()
        every = EveryPartitionRunner(s.bootstrap_servers, s.topic, "g.r1", lambda event: None, tmp_path,
                                     settings=s, state_name="g")
        every._on_assigned = _noop  # type: ignore[method-assign]
        await every._take_partitions(_Assignable())  # type: ignore[arg-type]
        with pytest.raises(_Built):
            await cluster_offsets.log_end_offsets(s)

    asyncio.run(run())
    sites = [where for where, _ in built]
    assert sites == ["publisher", "ensure_topics", "dead_letter", "consumer", "cluster_view", "cluster_view",
                     "cluster_view", "log_end_offsets"]
    for where, kwargs in built:
        assert kwargs["security_protocol"] == "SASL_SSL", where
        assert isinstance(kwargs["ssl_context"], ssl.SSLContext), where
        assert kwargs["sasl_plain_username"] == "lar" and kwargs["sasl_plain_password"] == "s3cret", where


async def _noop(*_: object) -> None: ...


class _Assignable:
    """The consumer EveryPartitionRunner assigns partitions to."""

    def assign(self, _: object) -> None: ...
