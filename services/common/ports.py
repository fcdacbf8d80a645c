"""Deployment conventions in one place: gRPC and metrics ports, topics, env prefixes, paths.

The services take their defaults from here and deploy/ (Dockerfile, docker-compose.yml, k8s/)
names the same values; tests/test_ops_deploy.py fails when the two disagree.
"""

from __future__ import annotations

SERVICES = ("retriever", "draftcache", "generator")


def _per_service(*ports: int) -> dict[str, int]:
    """``ports`` given in SERVICES order, keyed by service (one for each, no more, no fewer)."""
    return dict(zip(SERVICES, ports, strict=True))


# gRPC listen ports (one service per container; `serve all` uses the same three).
RETRIEVER_GRPC_PORT = 50051
DRAFTCACHE_GRPC_PORT = 50052
GENERATOR_GRPC_PORT = 50053
GRPC_PORTS: dict[str, int] = _per_service(RETRIEVER_GRPC_PORT, DRAFTCACHE_GRPC_PORT, GENERATOR_GRPC_PORT)

# The OpenAI-compatible HTTP endpoint (beside the generator).
HTTP_PORT = 8080

# Prometheus /metrics HTTP ports.
RETRIEVER_METRICS_PORT = 9101
DRAFTCACHE_METRICS_PORT = 9102
GENERATOR_METRICS_PORT = 9103
METRICS_PORTS: dict[str, int] = _per_service(RETRIEVER_METRICS_PORT, DRAFTCACHE_METRICS_PORT, GENERATOR_METRICS_PORT)

# Kafka: the feedback-loop topic and its dead-letter topic (KafkaSettings.topic / dlt_suffix defaults).
EVENTS_TOPIC = "lookahead.generation-completed"
DLT_SUFFIX = ".DLT"
EVENTS_DLT_TOPIC = EVENTS_TOPIC + DLT_SUFFIX
# Kafka: the documents topic (KafkaSettings.documents_topic): DocumentChanged, keyed by (tenant, doc id);
# every retriever replica reads all of it and a new one rebuilds from it (compacted by that key).
DOCUMENTS_TOPIC = "lookahead.documents"
DOCUMENTS_DLT_TOPIC = DOCUMENTS_TOPIC + DLT_SUFFIX

# Configuration: TOML file path variable and the env prefix of each settings section.
CONFIG_ENV = "LAR_CONFIG"
# A directory of secret files, one per field, named like its env variable (LAR_KAFKA_SASL_PLAIN_PASSWORD):
# a Kubernetes Secret mounted as files (services.common.settings; unset: none is read).
SECRETS_DIR_ENV = "LAR_SECRETS_DIR"
ENV_PREFIXES: dict[str, str] = {
    "retriever": "LAR_RETRIEVER_",
    "draftcache": "LAR_DRAFTCACHE_",
    "generator": "LAR_GENERATOR_",
    "limits": "LAR_LIMITS_",
    "kafka": "LAR_KAFKA_",
    "logging": "LAR_LOG_",
    "model": "LAR_MODEL_",
    "http": "LAR_HTTP_",
    "auth": "LAR_AUTH_",
    "tls": "LAR_TLS_",
    "tracing": "LAR_TRACING_",
    "channels": "LAR_CHANNELS_",
}

# Fields of the generator's settings that point it at the other two services (HOST:PORT).
GENERATOR_UPSTREAM_FIELDS: dict[str, str] = {
    "retriever": "retriever_target",
    "draftcache": "draftcache_target",
}

# Containers: data directory (snapshots, outbox, consumer state) and converted-model cache.
DATA_DIR = "/var/lib/lookahead-rag"
MODEL_CACHE_DIR = "/opt/lookahead-rag/cache"
