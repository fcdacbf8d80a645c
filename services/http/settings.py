"""HTTP front-door settings (the [http] table, env ``LAR_HTTP_*``)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from lookahead_rag.services.common.ports import HTTP_PORT
from lookahead_rag.services.common.settings import ServiceSettings

MIB = 1024 * 1024
DEFAULT_MAX_BODY_BYTES = 4 * MIB  # a longest prompt ([limits] max_prompt_chars) fits even JSON-escaped


class HttpSettings(ServiceSettings):
    """Where the OpenAI-compatible endpoint listens (it runs where the generator runs)."""

    model_config = SettingsConfigDict(env_prefix="LAR_HTTP_")
    section: ClassVar[str] = "http"

    enabled: bool = Field(True, description="serve /v1/chat/completions beside the generator's gRPC server")
    host: str = Field("127.0.0.1", description="interface it binds (0.0.0.0 in containers)")
    port: int = Field(HTTP_PORT, ge=0, le=65535, description="TCP port (0 = any free port)")
    tenant_header: str = Field("x-tenant", description="header naming the tenant (with [auth]: one its key may use)")
    default_tenant: str = Field("", description="tenant when the header is absent (empty: the header is required)")
    timeout_header: str = Field("x-request-timeout", description="request header giving its deadline in seconds")
    request_timeout_s: float = Field(0.0, ge=0, description="deadline of a request without that header (0 = none)")
    shutdown_grace_s: float = Field(5.0, ge=0, description="graceful stop: seconds in-flight requests may finish")
    access_log: bool = Field(True, description="log one line per HTTP request (uvicorn's access log)")
    max_body_bytes: int = Field(DEFAULT_MAX_BODY_BYTES, gt=0,
                                description="largest request body read (413 past it, chunked bodies too)")
    docs: bool = Field(False, description="serve the API schema (/docs, /redoc, /openapi.json), open to anyone")
    allowed_hosts: list[str] = Field(
        default=[], description="Host names served on a loopback bind with auth off, beside localhost, 127.0.0.1 "
        "and [::1] (any other Host is a 421: DNS rebinding)"
    )
