"""The Kafka clients' TLS and SASL keyword arguments, from ``KafkaSettings`` (aiokafka's names).

Every ``AIOKafkaProducer``, ``AIOKafkaConsumer`` and ``AIOKafkaAdminClient`` here is built with them::

    AIOKafkaProducer(bootstrap_servers=s.bootstrap_servers, **client_security(s), ...)
"""

from __future__ import annotations

from typing import Any

from aiokafka.helpers import create_ssl_context

from lookahead_rag.services.events.kafka.settings import KafkaSettings

TLS_PROTOCOLS = frozenset({"SSL", "SASL_SSL"})
SASL_PROTOCOLS = frozenset({"SASL_PLAINTEXT", "SASL_SSL"})


def client_security(settings: KafkaSettings) -> dict[str, Any]:
    """``security_protocol``, plus ``ssl_context`` (TLS protocols) and the ``sasl_*`` arguments (SASL ones)."""
    protocol = settings.security_protocol
    kwargs: dict[str, Any] = {"security_protocol": protocol}
    if protocol in TLS_PROTOCOLS:
        kwargs["ssl_context"] = create_ssl_context(
            cafile=settings.ssl_cafile, certfile=settings.ssl_certfile, keyfile=settings.ssl_keyfile
        )
    if protocol in SASL_PROTOCOLS:
        password = settings.sasl_plain_password
        kwargs |= {
            "sasl_mechanism": settings.sasl_mechanism,
            "sasl_plain_username": settings.sasl_plain_username,
            "sasl_plain_password": password.get_secret_value() if password is not None else None,
        }
    return kwargs
