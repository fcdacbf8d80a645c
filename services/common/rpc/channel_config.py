"""Client-side load balancing and retries of every gRPC channel: the ``[channels]`` settings (env
``LAR_CHANNELS_``) and the gRPC service config built from them.

A target may resolve to several addresses (``dns:///retriever.lookahead-rag.svc:50051`` on a headless
Service lists every ready pod; ``ipv4:///10.0.0.1:50051,10.0.0.2:50051`` lists them by hand). With
``round_robin`` the channel keeps a connection to each and spreads calls over them; with
``health_check`` it also asks each one's grpc.health.v1 and skips a replica reporting NOT_SERVING
(one that is draining before it stops: services.common.rpc.grpcutil.stop_server)::

    options = channel_options(ChannelSettings())   # [("grpc.service_config", "{...}"), ("grpc.enable_retries", 1)]
    grpc.aio.insecure_channel(target, options=[*options, ...])

Retries: a call that fails with UNAVAILABLE (a replica that stopped or refused the connection) is
sent again, to the next replica, up to ``retry_max_attempts`` times in all, with exponential
backoff. gRPC retries a call only until its response has started (the first response header or
message commits it): a server stream that already sent a message is never replayed, so a client
never sees a chunk twice; such a stream's failure reaches the caller as it is.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from lookahead_rag.services.common.settings import ServiceSettings

SECTION = "channels"
SERVICE_CONFIG_OPTION = "grpc.service_config"  # channel option: the service config as JSON
ENABLE_RETRIES_OPTION = "grpc.enable_retries"  # channel option: honour the retry policy (1) or not (0)
MAX_ATTEMPTS_LIMIT = 5  # gRPC caps maxAttempts at 5 (larger values are silently lowered)
RETRYABLE_CODES = ("UNAVAILABLE",)  # only "the call never reached a working server": safe to resend
ALL_METHODS: dict[str, str] = {}  # a methodConfig name with no service: every method of every service
OVERALL_HEALTH = ""  # grpc.health.v1 service name of the whole server


class ChannelSettings(ServiceSettings):
    """How this process's gRPC channels (the generator's upstreams, ``ask``, ``ingest``) pick a server and retry."""

    model_config = SettingsConfigDict(env_prefix="LAR_CHANNELS_")
    section: ClassVar[str] = SECTION

    load_balancing: Literal["round_robin", "pick_first"] = Field(
        "round_robin", description="round_robin: spread calls over every address the target resolves to"
    )
    health_check: bool = Field(
        True, description="skip a server whose grpc.health.v1 reports NOT_SERVING (draining); round_robin only"
    )
    retry_max_attempts: int = Field(
        3, ge=1, le=MAX_ATTEMPTS_LIMIT,
        description="attempts of a call failing UNAVAILABLE, the first included (1 = no retries; at most 5)",
    )
    retry_initial_backoff_s: float = Field(0.1, gt=0, description="pause before the first retry (randomised by gRPC)")
    retry_max_backoff_s: float = Field(2.0, gt=0, description="longest pause between retries")
    retry_backoff_multiplier: float = Field(2.0, gt=0, description="each pause is the previous one times this")

    @model_validator(mode="after")
    def _backoff_order(self) -> ChannelSettings:
        if self.retry_max_backoff_s < self.retry_initial_backoff_s:
            raise ValueError("retry_max_backoff_s must be >= retry_initial_backoff_s")
        return self


DEFAULT_CHANNELS = ChannelSettings.model_construct()  # the defaults, without reading env or files


def _seconds(value: float) -> str:
    """A protobuf Duration in JSON: "0.1s"."""
    return f"{value:g}s"


def service_config(settings: ChannelSettings) -> dict[str, Any]:
    """The gRPC service config (https://github.com/grpc/grpc/blob/master/doc/service_config.md) of ``settings``."""
    config: dict[str, Any] = {"loadBalancingConfig": [{settings.load_balancing: {}}]}
    if settings.health_check and settings.load_balancing == "round_robin":  # pick_first ignores it
        config["healthCheckConfig"] = {"serviceName": OVERALL_HEALTH}
    if settings.retry_max_attempts > 1:
        config["methodConfig"] = [{
            "name": [ALL_METHODS],
            "retryPolicy": {
                "maxAttempts": settings.retry_max_attempts,
                "initialBackoff": _seconds(settings.retry_initial_backoff_s),
                "maxBackoff": _seconds(settings.retry_max_backoff_s),
                "backoffMultiplier": settings.retry_backoff_multiplier,
                "retryableStatusCodes": list(RETRYABLE_CODES),
            },
        }]
    return config


def channel_options(settings: ChannelSettings | None) -> list[tuple[str, str | int]]:
    """The channel options carrying ``settings`` (None: the defaults): the service config as JSON, and retries on."""
    settings = DEFAULT_CHANNELS if settings is None else settings
    config = json.dumps(service_config(settings), separators=(",", ":"), sort_keys=True)
    return [(SERVICE_CONFIG_OPTION, config), (ENABLE_RETRIES_OPTION, int(settings.retry_max_attempts > 1))]
