"""A Generate call's prompt as token ids: text tokenized, chat messages templated, ids checked as sent."""

from __future__ import annotations

from typing import Any

from lookahead_core import check_in_vocab

from lookahead_rag.services.common.errors import InvalidArgument
from lookahead_rag.services.common.rules.limits import RequestLimits
from lookahead_rag.services.generator.domain import ChatMessage, PromptIds

ROLES = ("system", "user", "assistant")  # the chat roles a Generate call may send


def chat_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of chat messages in the model's template, ending in the assistant turn."""
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)  # a BatchEncoding in newer versions


def prompt_ids(prompt: str | tuple[ChatMessage, ...] | PromptIds | None, tokenizer: Any, tokenizer_size: int,
               limits: RequestLimits) -> list[int]:
    """The prompt as token ids; every bad input an InvalidArgument with one line."""
    if isinstance(prompt, PromptIds):
        if not prompt.ids:
            raise InvalidArgument("prompt_ids is empty")
        limits.check_prompt_tokens("prompt_ids", len(prompt.ids))
        check_in_vocab(prompt.ids, tokenizer_size, "prompt token", InvalidArgument)
        return list(prompt.ids)
    if isinstance(prompt, str):
        limits.check_prompt_chars("prompt", len(prompt))
        return list(tokenizer(prompt)["input_ids"])
    if prompt is None:
        raise InvalidArgument("give a prompt, chat messages or prompt_ids")
    msgs = [{"role": m.role, "content": m.content} for m in prompt]
    if not msgs:
        raise InvalidArgument("messages is empty")
    if any(m["role"] not in ROLES for m in msgs):
        raise InvalidArgument("message role must be system, user or assistant")
    limits.check_prompt_chars("messages", sum(len(m["content"]) for m in msgs))
    return chat_ids(tokenizer, msgs)
