"""Who may call which tenant: the ``[auth]`` table, env ``LAR_AUTH_*``.

    [auth]
    mode = "required"                          # "off" (default): no credential is asked for
    keys_file = "/var/lib/lookahead-rag/keys.json"
    cert_subjects = { "generator-1" = ["*"], "acme-batch" = ["acme"] }
    # service_key: set LAR_AUTH_SERVICE_KEY (a key with every tenant) rather than writing it in the file

``mode = "off"`` keeps the embedded demo and loopback development working with no set-up; ``serve``
refuses a non-loopback bind without TLS (services.common.tls), so "off" stays on one machine.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from services.common.settings import ServiceSettings

ALL_TENANTS = "*"  # in a key's or a subject's tenants: every tenant (admin calls, service-to-service)


class AuthSettings(ServiceSettings):
    """Credentials: API keys (hashed at rest in ``keys_file``) and client-certificate subjects."""

    model_config = SettingsConfigDict(env_prefix="LAR_AUTH_")
    section: ClassVar[str] = "auth"

    mode: Literal["off", "required"] = Field(
        "off", description="required: every RPC and HTTP request needs a credential for its tenant; off: none asked"
    )
    keys_file: Path | None = Field(
        None, description="JSON file of hashed API keys (lookahead-rag keys add|list|revoke); reread when it changes"
    )
    cert_subjects: dict[str, list[str]] = Field(
        default={},
        description="mTLS client-certificate subject CN -> the tenants it may use (* = every tenant)",
    )
    service_key: SecretStr | None = Field(
        None, description="API key this process's own clients send to the other services (needs every tenant: *)"
    )

    @property
    def required(self) -> bool:
        return self.mode == "required"

    @model_validator(mode="after")
    def _has_credentials(self) -> AuthSettings:
        if self.required and self.keys_file is None and not self.cert_subjects:
            raise ValueError('mode = "required" needs keys_file or cert_subjects: no caller could get in')
        for subject, tenants in self.cert_subjects.items():
            if not subject or not tenants or not all(tenants):
                raise ValueError(f"cert_subjects: {subject!r} needs a non-empty subject and tenant list")
        return self
