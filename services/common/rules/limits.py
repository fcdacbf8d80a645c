"""What one request may ask for, checked the same way by all three services.

The ``[limits]`` section (env ``LAR_LIMITS_*``) is read by every service, so the generator, the
retriever and the draft cache refuse the same tenant names and resolve ``k = 0`` to the same
default. Each check raises InvalidArgument with a one-line message (gRPC INVALID_ARGUMENT)::

    limits = RequestLimits()
    limits.check_tenant("acme")      # -> "acme"
    limits.resolve_k(0)              # -> 3 (the default)
    limits.resolve_k(99)             # InvalidArgument: k=99 is out of range (0 = default 3, at most 16)
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import ConfigDict, Field, model_validator
from pydantic_settings import SettingsConfigDict
from typing_extensions import TypedDict

from lookahead_rag.services.common.errors import InvalidArgument
from lookahead_rag.services.common.settings import ServiceSettings

# a request value resolved against the limits -> (its default's field, its limit's field)
RESOLVED: dict[str, tuple[str, str]] = {
    "k": ("default_k", "max_k"),
    "m": ("default_m", "max_m"),
    "max_new_tokens": ("default_max_new_tokens", "max_new_tokens"),
}


class TenantQuota(TypedDict, total=False):
    """One tenant's quotas in ``tenant_quotas`` (a field left out takes the ``tenant_*`` default; 0 = unlimited)."""

    __pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[misc]

    rps: Annotated[float, Field(ge=0)]
    burst: Annotated[float, Field(ge=0)]
    streams: Annotated[int, Field(ge=0)]


class RequestLimits(ServiceSettings):
    """Tenant rules and the sizes a request may ask for (one section shared by all services)."""

    model_config = SettingsConfigDict(env_prefix="LAR_LIMITS_")
    section: ClassVar[str] = "limits"

    max_tenant_chars: int = Field(128, ge=1, description="longest tenant name accepted")
    max_question_chars: int = Field(4000, ge=1, description="longest question accepted")
    max_prompt_chars: int = Field(200_000, ge=1, description="longest raw prompt / all messages / references accepted")
    default_k: int = Field(3, ge=1, description="documents retrieved when a request says k=0")
    max_k: int = Field(16, ge=1, description="most documents a request may ask for")
    default_m: int = Field(2, ge=0, description="past sessions included when a request says m=0")
    max_m: int = Field(16, ge=0, description="most past sessions a request may ask for")
    default_max_new_tokens: int = Field(128, ge=1, description="max_new_tokens when a request says 0")
    max_new_tokens: int = Field(512, ge=1, description="largest max_new_tokens a request may ask for")
    max_references: int = Field(16, ge=0, description="most references one Generate call may carry")
    max_reference_tokens: int = Field(16_384, ge=0, description="most tokens a Generate call's references may hold")
    max_stop_strings: int = Field(8, ge=0, description="most stop strings a request may carry")
    max_doc_title_chars: int = Field(512, ge=1, description="longest document title accepted (every chunk repeats it)")
    max_doc_source_chars: int = Field(2048, ge=1, description="longest document source (its path or URL) accepted")
    max_messages: int = Field(
        1024, ge=1, description="most chat messages one request may carry (a Generate's messages, an answer's "
        "history and its question)"
    )
    max_choice_messages: int = Field(
        4096, ge=1, description="most chat messages one HTTP request may have rendered, counted once per choice "
        "(n x messages)"
    )
    max_logprob_entries: int = Field(
        65_536, ge=1, description="most logprob entries one request may ask for: n x max_tokens x (top_logprobs + 1)"
    )
    # per-tenant quotas (services/common/rules/quota.py), each service counting its own calls
    tenant_rps: float = Field(50.0, ge=0, description="requests per second one tenant may start, each service "
                              "counting its calls of every RPC but Snapshot (0 = unlimited)")
    tenant_burst: float = Field(100.0, ge=0, description="requests a tenant may start at once (0 = tenant_rps, >= 1)")
    tenant_streams: int = Field(32, ge=0, description="answer streams one tenant may have open at once (0 = unlimited)")
    tenant_streams_retry_s: float = Field(1.0, gt=0, description="retry-after hint for a tenant at its stream limit")
    tenant_quotas: dict[str, TenantQuota] = Field(
        default={}, description="per-tenant overrides: {tenant = {rps = R, burst = B, streams = S}}"
    )

    @model_validator(mode="after")
    def _defaults_within_limits(self) -> RequestLimits:
        for name, (default_field, limit_field) in RESOLVED.items():
            default, limit = getattr(self, default_field), getattr(self, limit_field)
            if default > limit:
                raise ValueError(f"default_{name} {default} is over its limit {limit}")
        return self

    def check_tenant(self, tenant: str) -> str:
        """A tenant name that is not blank and not over-long."""
        return _check_text("tenant", tenant, self.max_tenant_chars)

    def check_question(self, question: str) -> str:
        """A question that is not blank and not over-long."""
        return _check_text("question", question, self.max_question_chars)

    def check_prompt_chars(self, what: str, chars: int) -> None:
        """Raw prompt text (``what``: "prompt", "messages", "references") within max_prompt_chars."""
        if chars > self.max_prompt_chars:
            raise InvalidArgument(f"{what}: {chars} characters; the limit is {self.max_prompt_chars}")

    def check_messages(self, what: str, count: int, choices: int = 1) -> None:
        """A conversation of ``count`` messages (``what``: "messages", "history") within max_messages, and
        rendered once per choice within max_choice_messages; checked before anything is rendered."""
        if count > self.max_messages:
            raise InvalidArgument(f"{what}: {count} messages; the limit is {self.max_messages}")
        if count * choices > self.max_choice_messages:
            raise InvalidArgument(f"{what}: {count} messages x n={choices} choices; the limit is "
                                  f"{self.max_choice_messages} messages rendered per request")

    def check_logprob_entries(self, choices: int, max_tokens: int | None, top_logprobs: int) -> None:
        """A request asking for logprobs: ``choices`` x its tokens (None or past the limit: max_new_tokens) x
        (``top_logprobs`` + the chosen token) entries within max_logprob_entries."""
        tokens = min(max_tokens or self.max_new_tokens, self.max_new_tokens)
        entries = choices * tokens * (top_logprobs + 1)
        if entries > self.max_logprob_entries:
            raise InvalidArgument(f"logprobs: n={choices} x {tokens} tokens x (top_logprobs={top_logprobs} + 1) = "
                                  f"{entries} entries; the limit is {self.max_logprob_entries}")

    def check_prompt_tokens(self, what: str, tokens: int) -> None:
        """A prompt given as token ids (``what``: "prompt_ids") within max_prompt_chars, the raw prompt's bound."""
        if tokens > self.max_prompt_chars:
            raise InvalidArgument(f"{what}: {tokens} tokens; the limit is {self.max_prompt_chars}")

    def check_reference_tokens(self, tokens: int) -> None:
        """A Generate call's references, tokenized, within max_reference_tokens."""
        if tokens > self.max_reference_tokens:
            raise InvalidArgument(f"references: {tokens} tokens; the limit is {self.max_reference_tokens}")

    def check_document_fields(self, where: str, title: str, source: str) -> None:
        """A document's title and source within their limits (``where`` names the document in the message);
        checked where documents enter: the retriever's Ingest and ``POST /v1/documents``."""
        for name, value, limit in (("title", title, self.max_doc_title_chars),
                                   ("source", source, self.max_doc_source_chars)):
            if len(value) > limit:
                raise InvalidArgument(f"{where}: {name} is {len(value)} characters; the limit is {limit}")

    def resolve_k(self, k: int) -> int:
        """Documents to retrieve: 0 means the default."""
        return self._resolve("k", k)

    def resolve_m(self, m: int) -> int:
        """Past sessions to include: 0 means the default."""
        return self._resolve("m", m)

    def resolve_max_new_tokens(self, max_new_tokens: int) -> int:
        """Tokens the answer may take: 0 means the default."""
        return self._resolve("max_new_tokens", max_new_tokens)

    def _resolve(self, name: str, value: int) -> int:
        default, limit = (getattr(self, f) for f in RESOLVED[name])
        if value < 0 or value > limit:
            raise InvalidArgument(f"{name}={value} is out of range (0 = default {default}, at most {limit})")
        return value or default


def _check_text(what: str, text: str, limit: int) -> str:
    """``text`` when it is not blank and has at most ``limit`` characters; else InvalidArgument naming ``what``."""
    if not text.strip():
        raise InvalidArgument(f"{what} is empty")
    if len(text) > limit:
        raise InvalidArgument(f"{what} is {len(text)} characters; the limit is {limit}")
    return text
