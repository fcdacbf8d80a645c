"""A Generate call's prompt rendered off the event loop, bounded before any render.

The chat template is rendered and tokenized on a worker thread, so a large prompt never stalls the
other requests' streams on the loop; before that, the messages are counted (``[limits] max_messages``)
and their tokens estimated from below (each message adds at least ``message_tokens`` tokens in the
template, measured once), so a conversation that cannot fit the context is refused without being
rendered. A cancelled request stops waiting at once; the worker's render, bounded by those limits,
ends on its own.

    render = PromptRenderer(tokenizer, tokenizer_size, limits, context_tokens)
    ids = await render.ids(query.prompt)          # InvalidArgument with one line when refused
"""

from __future__ import annotations

import asyncio
from typing import Any

from lookahead_rag.services.common.errors import InvalidArgument
from lookahead_rag.services.common.rules.limits import RequestLimits
from lookahead_rag.services.generator.domain import ChatMessage, PromptIds
from lookahead_rag.services.generator.prompt_ids import ROLES, chat_ids, prompt_ids

EMPTY_USER = {"role": "user", "content": ""}  # the message the template's per-message cost is measured after


def message_tokens(tokenizer: Any) -> int:
    """The fewest tokens one more (empty) message of any role adds in the chat template (0: unknown, e.g. a
    template that drops empty messages): a lower bound of a conversation's tokens per message."""
    try:
        base = len(chat_ids(tokenizer, [EMPTY_USER]))
        return max(0, min(len(chat_ids(tokenizer, [EMPTY_USER, {"role": r, "content": ""}])) - base for r in ROLES))
    except Exception:  # a tokenizer without a chat template: no estimate (the render refuses such prompts)
        return 0


class PromptRenderer:
    """Renders and tokenizes prompts on a worker thread after the cheap checks."""

    def __init__(self, tokenizer: Any, tokenizer_size: int, limits: RequestLimits, context_tokens: int) -> None:
        self.tokenizer = tokenizer
        self.tokenizer_size = tokenizer_size  # bound of prompt ids: tokens the tokenizer can decode
        self.limits = limits
        self.context_tokens = context_tokens  # the model's context (0: unknown, no estimate)
        self.message_tokens = message_tokens(tokenizer)  # the fewest tokens a message adds

    def check_messages(self, messages: tuple[ChatMessage, ...]) -> None:
        """Refuse, before any render, more messages than the limit or than the context can hold."""
        self.limits.check_messages("messages", len(messages))
        least = len(messages) * self.message_tokens
        if self.context_tokens and least > self.context_tokens:
            raise InvalidArgument(f"messages: {len(messages)} messages take at least {least} tokens; the model's "
                                  f"context is {self.context_tokens}")

    async def ids(self, prompt: str | tuple[ChatMessage, ...] | PromptIds | None) -> list[int]:
        """The prompt as token ids (``prompt_ids.prompt_ids``'s checks), rendered on a worker thread."""
        if isinstance(prompt, tuple):
            self.check_messages(prompt)
        return await asyncio.to_thread(prompt_ids, prompt, self.tokenizer, self.tokenizer_size, self.limits)
