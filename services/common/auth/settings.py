"""Who may call which tenant: the ``[auth]`` table, env ``LAR_AUTH_*``.

    [auth]
    mode = "required"                          # "off" (default): no credential is asked for
    keys_file = "/var/lib/lookahead-rag/keys.json"
    cert_subjects = { "generator-1" = { tenants = ["*"], scopes = ["answer"] }, "acme-web" = ["acme"] }
    # service_key: set LAR_AUTH_SERVICE_KEY (a key with every tenant) rather than writing it in the file

``mode = "off"`` keeps the embedded demo and loopback development working with no set-up; ``serve``
refuses a non-loopback bind with it, TLS or not (services.common.auth.tls ``check_bind``), unless
``allow_unauthenticated = true`` (a WARNING each start), so "off" stays on one machine.

A subject is a table ``{ tenants = [...], scopes = [...] }`` (scopes: ``lookahead_rag.services.common.auth.scopes``), or
a plain tenant list as written before scopes existed: that keeps working, with the scopes it had
then (``scopes.legacy_scopes``: ``admin`` for ``["*"]``, else ``answer`` and ``write``).
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from lookahead_rag.services.common.auth.scopes import DEFAULT_SCOPES, Scope, legacy_scopes, parse_scopes
from lookahead_rag.services.common.settings import ServiceSettings

ALL_TENANTS = "*"  # in a key's or a subject's tenants: every tenant (admin calls, service-to-service)
SUBJECT_FIELDS = ("tenants", "scopes")  # a subject's table: {tenants = [...], scopes = [...]}
Grant = list[str] | dict[str, list[str]]  # a bare tenant list (as before scopes), or a subject's table


def subject_grant(subject: str, grant: Grant) -> tuple[tuple[str, ...], tuple[Scope, ...]]:
    """(tenants, scopes) of ``cert_subjects[subject]``; ValueError unless it names tenants and (in a
    table) scopes among answer, write, admin (default answer), admin only for every tenant (as for keys)."""
    table = grant if isinstance(grant, dict) else {"tenants": grant}
    tenants = table.get("tenants") or []
    if not subject or not tenants or not all(tenants) or set(table) - set(SUBJECT_FIELDS):
        raise ValueError(f"cert_subjects: {subject!r} needs a non-empty subject and tenant list "
                         f"(a table has only {' and '.join(SUBJECT_FIELDS)})")
    if not isinstance(grant, dict):
        return tuple(tenants), legacy_scopes(tenants, ALL_TENANTS)
    try:
        scopes = parse_scopes(table.get("scopes", DEFAULT_SCOPES))
    except ValueError as exc:
        raise ValueError(f"cert_subjects: {subject!r}: {exc}") from None
    if not scopes or (Scope.ADMIN in scopes and tenants != [ALL_TENANTS]):
        raise ValueError(f"cert_subjects: {subject!r} needs a scope, and admin only with tenants = [\"*\"]")
    return tuple(tenants), scopes


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
    cert_subjects: dict[str, Grant] = Field(
        default={},
        description="mTLS client-certificate subject CN -> {tenants, scopes} (a bare tenant list: answer+write)",
    )
    service_key: SecretStr | None = Field(
        None, description="API key this process's own clients send to the other services (needs every tenant: *)"
    )
    allow_unauthenticated: bool = Field(
        False, description="let servers listen beyond loopback with mode = off: anyone who reaches them acts "
        "for every tenant (logged as a warning)"
    )

    @property
    def required(self) -> bool:
        return self.mode == "required"

    @model_validator(mode="after")
    def _has_credentials(self) -> AuthSettings:
        if self.required and self.keys_file is None and not self.cert_subjects:
            raise ValueError('mode = "required" needs keys_file or cert_subjects: no caller could get in')
        for subject, grant in self.cert_subjects.items():
            subject_grant(subject, grant)
        return self

    def subject(self, cn: str) -> tuple[tuple[str, ...], tuple[Scope, ...]] | None:
        """(tenants, scopes) of the client-certificate subject ``cn``, or None when it is not mapped."""
        grant = self.cert_subjects.get(cn)
        return None if grant is None else subject_grant(cn, grant)
