"""The body of ``POST /v1/chat/completions``: OpenAI's fields we read, plus our extensions.

Types are checked by pydantic (a wrong type is a 400, see ``lookahead_rag.services.http.errors``); values are
checked where they are used (``lookahead_rag.services.http.translate``, then the generator, as for gRPC). Fields
not named here are accepted and ignored (``user``, ``metadata``, ``store``, ...): they do not
change the answer. Fields that would change it but cannot be honoured (``n`` > 1, ``logprobs``,
``tools``, ...) are declared so that ``translate.check_supported`` can refuse them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model


class ContentPart(BaseModel):
    """One part of a message's content (only ``{"type": "text", "text": ...}`` is supported)."""

    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class Message(BaseModel):
    """One chat message; ``content`` is a string or a list of text parts."""

    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[ContentPart] | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    """OpenAI's chat-completion request (the fields that matter here) and our extension fields."""

    model_config = ConfigDict(extra="allow")

    model: str = ""  # empty: the served model
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None  # wins over max_tokens (OpenAI's newer name)
    temperature: float | None = None  # omitted: the server's default (greedy)
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # OpenAI fields we refuse unless they ask for the default (translate.check_supported)
    n: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    functions: list[Any] | None = None
    response_format: dict[str, Any] | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    # extensions (docs/HTTP.md)
    mode: str | None = None  # the draft mode (GenerationParams.mode: "hierarchical", "none", ...); omitted: server's
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    k: int | None = None  # documents to retrieve (RAG; omitted: the server default)
    m: int | None = None  # past sessions to include (RAG; omitted: the server default)
    rag: bool = True  # false: answer the messages as they are, without retrieval
    return_token_ids: bool = False  # add prompt_token_ids and the choices' token_ids
    safe_stream: bool = False  # the side-channel-safe stream (GenerationParams.safe_stream, docs/SECURITY.md)


def bounded_chat_request(max_messages: int) -> type[ChatCompletionRequest]:
    """``ChatCompletionRequest`` whose ``messages`` stop validating past ``max_messages`` (``[limits]
    max_messages``): a body of 120,000 messages is a 400 before 120,000 objects are built on the event loop."""
    return create_model("ChatCompletionRequest", __base__=ChatCompletionRequest,
                        messages=(list[Message], Field(min_length=1, max_length=max_messages)))
