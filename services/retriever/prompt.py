"""Prompt assembly: question + retrieved passages + past answers, in the chat template, within a budget.

A pure function of its inputs (no FAISS, no embedder): ``build_prompt`` takes the candidates in any
order, adds them best score first while the templated prompt stays within ``budget`` tokens, cuts
the first one that does not fit to what room is left (at a token boundary, so its text stays a
prefix of the original) and drops the rest. With no candidates the prompt is the question alone.

Which passages are kept depends on their scores; the order they are shown in does not (by default):
the prompt's stable parts come first so that requests share them in the engine's prefix cache, the
system prompt, then the kept passages by (document id, chunk number) (``PassageOrder.CANONICAL``),
then the past answers best first, then the question. Two questions that retrieve the same passages
share their whole documents block, whatever the scores. ``PassageOrder.SCORE`` shows them best first,
``PassageOrder.SCORE_LAST`` best last, next to the question.

With a conversation (``history``: the messages before the question) the system message holds the
system prompt, the documents and past answers, then the conversation's own system texts; its turns
follow as they were, then the question as the last user message. The passages are chosen first
(with no turns), then as many of the newest whole turns as still fit: the oldest go first
(``BuiltPrompt.history_turns_kept``). Without one the prompt is the one above, unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from lookahead_rag.services.common.errors import InvalidArgument
from lookahead_rag.services.common.rules.conversation import Message, newest_that_fit, split_turns

DOCUMENTS_HEADER = "Documents:"
# Past answers (only with [retriever] past_answers_in_prompt) are notes, never a "Q: ... A: ..." turn to continue.
PAST_HEADER = "Notes: earlier answers to similar questions (they may be wrong; the documents decide):"
QUESTION_LABEL = "Question:"
BLOCK_SEP = "\n\n"
# Special tokens inside untrusted text get look-alike characters (same length, so offsets hold).
_LOOKALIKES = str.maketrans({"|": "¦", "<": "‹", ">": "›"})


class PassageOrder(StrEnum):
    CANONICAL = "canonical"  # by document id, then chunk number: the same passages, the same documents block
    SCORE = "score"  # best score first
    SCORE_LAST = "score_last"  # best score last, next to the question ("lost in the middle": ends are used best)


class PromptTooLong(InvalidArgument):
    """Even the question alone does not fit the token budget."""


@dataclass(frozen=True, slots=True)
class Passage:
    title: str
    text: str
    score: float
    doc_id: str = ""  # canonical order: by document id ...
    chunk: int = 0  # ... then by the chunk's number in its document (numeric: #2 before #10)

    def canonical_key(self) -> tuple[str, int]:
        return self.doc_id, self.chunk


@dataclass(frozen=True, slots=True)
class PastAnswer:
    question: str
    answer: str
    score: float


@dataclass(frozen=True, slots=True)
class _Item:
    is_passage: bool
    index: int  # position in the caller's passages / past answers
    score: float
    kept_chars: int  # characters of the text (passage) or answer (past answer) kept

    def cut(self, chars: int) -> _Item:
        return replace(self, kept_chars=chars)


@dataclass(frozen=True, slots=True)
class BuiltPrompt:
    text: str
    ids: list[int]
    passages: list[tuple[int, int]]  # (index into passages, characters of its text kept), prompt order
    answers: list[tuple[int, int]]  # (index into past answers, characters of its answer kept), prompt order
    budget: int
    truncated: bool  # the lowest-scored item kept was cut to fit (wherever the order shows it)
    history_turns_kept: int = 0  # the conversation's newest turns in the prompt (the oldest are cut first)
    turns_total: int = 0  # the conversation's turns (system messages are not turns)


def sanitize(text: str, special_tokens: Sequence[str]) -> str:
    """Defuse special tokens (``<|im_end|>``) in untrusted text without changing its length."""
    for token in special_tokens:
        if token and token in text:
            text = text.replace(token, token.translate(_LOOKALIKES))
    return text


class _Renderer:
    def __init__(
        self,
        tokenizer: Any,
        question: str,
        passages: Sequence[Passage],
        answers: Sequence[PastAnswer],
        system_prompt: str,
        order: PassageOrder,
        history: Sequence[Message] = (),
    ) -> None:
        specials = [t for t in getattr(tokenizer, "all_special_tokens", []) if len(t) > 1]
        self.tokenizer = tokenizer
        self.question = sanitize(question.strip(), specials)
        self.passages = [
            replace(p, title=sanitize(p.title, specials), text=sanitize(p.text, specials)) for p in passages
        ]
        self.answers = [
            replace(a, question=sanitize(a.question, specials), answer=sanitize(a.answer, specials)) for a in answers
        ]
        self.system_prompt = system_prompt
        self.order = order
        self.conversation = bool(history)  # a conversation: its layout (the module's docstring)
        self.system_texts, self.turns = split_turns(history)
        self.system_texts = [sanitize(t, specials) for t in self.system_texts]
        self.turns = [tuple((role, sanitize(text, specials)) for role, text in turn) for turn in self.turns]

    def item_text(self, item: _Item) -> str:
        return self.passages[item.index].text if item.is_passage else self.answers[item.index].answer

    def in_prompt_order(self, items: Sequence[_Item]) -> list[_Item]:
        """Passages (canonical or score order), then past answers (score order); ``items`` are best first."""
        docs = [i for i in items if i.is_passage]
        if self.order is PassageOrder.CANONICAL:
            docs.sort(key=lambda i: self.passages[i.index].canonical_key())  # stable: equal keys keep score order
        elif self.order is PassageOrder.SCORE_LAST:
            docs.reverse()
        return docs + [i for i in items if not i.is_passage]

    def messages(self, items: Sequence[_Item], turns: int = 0) -> list[dict[str, str]]:
        """The chat messages with ``items`` and the newest ``turns`` turns of the conversation."""
        if self.conversation:
            return self.conversation_messages(items, turns)
        if not items:
            return [{"role": "user", "content": self.question}]
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": BLOCK_SEP.join([*self.blocks(items), f"{QUESTION_LABEL} {self.question}"])},
        ]

    def conversation_messages(self, items: Sequence[_Item], turns: int) -> list[dict[str, str]]:
        grounding = [self.system_prompt, *self.blocks(items)] if items else []
        system = BLOCK_SEP.join(t for t in [*grounding, *self.system_texts] if t)
        out = [{"role": "system", "content": system}] if system else []
        for turn in self.turns[len(self.turns) - turns:]:
            out += [{"role": role, "content": text} for role, text in turn]
        return [*out, {"role": "user", "content": self.question}]

    def blocks(self, items: Sequence[_Item]) -> list[str]:
        """The documents and past answers blocks of ``items``, in prompt order."""
        blocks: list[str] = []
        ordered = self.in_prompt_order(items)
        docs = [i for i in ordered if i.is_passage]
        past = [i for i in ordered if not i.is_passage]
        if docs:
            blocks.append(DOCUMENTS_HEADER)
            for n, item in enumerate(docs, start=1):
                p = self.passages[item.index]
                blocks.append(f"[{n}] {p.title}\n{p.text[: item.kept_chars]}")
        if past:
            blocks.append(PAST_HEADER)
            for item in past:
                a = self.answers[item.index]
                blocks.append(f"- asked \"{a.question}\", answered \"{a.answer[: item.kept_chars]}\"")
        return blocks

    def render(self, items: Sequence[_Item], turns: int = 0) -> tuple[str, list[int]]:
        messages = self.messages(items, turns)
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return text, ids

    def token_ends(self, item: _Item) -> list[int]:
        """Character offset where each token of the item's text ends."""
        enc = self.tokenizer(self.item_text(item), add_special_tokens=False, return_offsets_mapping=True)
        return [end for _, end in enc["offset_mapping"]]


def _fit_truncated(
    r: _Renderer, kept: list[_Item], item: _Item, overflow: int, budget: int, min_tokens: int
) -> _Item | None:
    """The item cut so that kept + [it] fits, or None if fewer than ``min_tokens`` of it would remain.

    Every try renders the whole prompt (in its prompt order, wherever the cut item lands), so the
    budget check is exact; ``overflow`` only sets where the search starts.
    """
    ends = r.token_ends(item)
    keep = len(ends) - overflow
    while keep >= min_tokens:
        candidate = item.cut(ends[keep - 1])
        _, ids = r.render([*kept, candidate])
        if len(ids) <= budget:
            return candidate
        keep -= len(ids) - budget  # token counts are near-additive: one or two rounds
    return None


def build_prompt(
    tokenizer: Any,
    question: str,
    passages: Sequence[Passage],
    answers: Sequence[PastAnswer],
    budget: int,
    system_prompt: str,
    min_truncated_tokens: int,
    order: PassageOrder = PassageOrder.CANONICAL,
    history: Sequence[Message] = (),
) -> BuiltPrompt:
    """The chat-templated prompt (ending in the assistant turn) of at most ``budget`` tokens.

    What is kept is chosen best score first; ``order`` says how the kept passages are shown; then the
    newest turns of ``history`` that still fit (the oldest are cut first, whole turns).
    """
    r = _Renderer(tokenizer, question, passages, answers, system_prompt, PassageOrder(order), history)
    text, ids = r.render([])
    if len(ids) > budget:
        alone = "the question and the conversation's system messages" if r.system_texts else "the question alone"
        raise PromptTooLong(f"{alone} needs {len(ids)} prompt tokens; the budget is {budget}")
    candidates = [_Item(True, i, p.score, len(p.text)) for i, p in enumerate(r.passages)]
    candidates += [_Item(False, i, a.score, len(a.answer)) for i, a in enumerate(r.answers)]
    candidates.sort(key=lambda item: -item.score)  # stable: passages first on equal scores
    kept: list[_Item] = []
    truncated = False
    for item in candidates:
        t, i = r.render([*kept, item])
        if len(i) <= budget:
            kept.append(item)
            text, ids = t, i
            continue
        cut = _fit_truncated(r, kept, item, len(i) - budget, budget, min_truncated_tokens)
        if cut is not None:
            kept.append(cut)
            text, ids = r.render(kept)
            truncated = True
        break  # everything scored lower is dropped
    turns = newest_that_fit(lambda n: len(r.render(kept, n)[1]) <= budget, len(r.turns))
    if turns:
        text, ids = r.render(kept, turns)
    shown = r.in_prompt_order(kept)
    return BuiltPrompt(
        text=text,
        ids=ids,
        passages=[(k.index, k.kept_chars) for k in shown if k.is_passage],
        answers=[(k.index, k.kept_chars) for k in shown if not k.is_passage],
        budget=budget,
        truncated=truncated,
        history_turns_kept=turns,
        turns_total=len(r.turns),
    )
