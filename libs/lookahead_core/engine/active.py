"""A request the engine runs, built whole at admission: its cache, chooser, proposers and trie owner.

The scheduler (scheduler.py) owns the model and calls these methods from its one thread: a request
never runs a forward itself, and never edits its cache: every change of it (the accepted path kept, a
cached prefix loaded, a prefill chunk's entries made valid) is the backend's that granted it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch

from ..config import DecodingConfig
from ..drafting.draft import DraftTree
from ..drafting.trie import OutputCursor
from ..forward.backend import Backend
from ..kv.kvstore import KV, RequestKV
from ..kv.prefix_cache import PrefixKVCache
from ..proposers.base import Ask, Drafting
from ..proposers.build import DraftingSpec
from ..sampling.chooser import TokenChooser
from ..sampling.logprobs import TokenLogprob, token_logprobs
from .finish import trim_step
from .gains import Step
from .request import ServeRequest


def _untimed(_phase: str) -> AbstractContextManager[None]:
    return nullcontext()


@dataclass(frozen=True)
class Emitting:
    """What emitting a step's tokens needs from the engine: handed to each call, never kept by a request."""

    decode: Callable[[list[int]], str]  # token ids -> text (stop strings are searched in it)
    timed: Callable[[str], AbstractContextManager[None]] = _untimed  # the step profile by phase (no-op unless on)


class Active:
    """A running request: ``req`` (the caller's ticket) plus everything the engine needs to step it."""

    def __init__(self, req: ServeRequest, spec: DraftingSpec, drafting: Drafting, kv: RequestKV, backend: Backend,
                 chooser: TokenChooser, eos: frozenset[int]) -> None:
        self.req = req
        self.drafting = drafting
        self.kv = kv  # read here (length, capacity), changed only through ``backend``
        self.backend = backend  # what granted ``kv``: every edit of it
        self.chooser = chooser
        self.eos = eos
        self.prefilled = 0  # prompt tokens whose KV is in the cache
        self.prefix_seen = -1  # the prefix cache's ``stores`` when this request last looked it up
        self.copying = True  # every step so far verified its tree's deepest branch whole (a repeated answer)
        self.history: list[Step] = []  # (accepted path indices, nodes drafted) of every decode step
        self.paused = False  # a lent running place given back: kept whole, left out of the steps (lending.py)
        req.config, req.proposers = spec.config, drafting.proposers  # what it runs with (its window resolved)
        req.stats.queue_wait_s = time.perf_counter() - req.submitted
        req.fill_trie()  # a no-op when the caller filled it on its own thread
        self.cursor: OutputCursor | None = req.trie.output_cursor() if self.config.insert_output else None
        if self.cursor is not None and self.config.extend_min_match > 1:
            # The output goes in after the prompt's last extend_min_match - 1 tokens (a chat prompt's answer
            # header): the same answer asked again then matches from its first token, long enough to be
            # copied as one chain at its first decode step (proposers.trie.extend_chain).
            self.cursor.feed(req.prompt_ids[1 - self.config.extend_min_match :])

    @staticmethod
    def capacity(req: ServeRequest, spec: DraftingSpec) -> int:
        """Cache entries a request can ever need: prompt, output and one step's tokens beyond it."""
        return len(req.prompt_ids) + spec.config.max_new_tokens + spec.max_step_tokens

    # ---- what a step reads ----------------------------------------------------------------------
    @property
    def config(self) -> DecodingConfig:
        """The config it runs with (the ticket's, its Jacobi window resolved at admission)."""
        return self.req.config

    @property
    def id(self) -> str:
        """The request's id: how a step's plan names it."""
        return self.req.id

    @property
    def prompt_ids(self) -> list[int]:
        return self.req.prompt_ids

    @property
    def emitted(self) -> int:
        """Output tokens so far."""
        return len(self.req.output)

    @property
    def room(self) -> int:
        """Draft depth left: a step emits at most depth + 1 tokens, never past max_new_tokens."""
        return self.config.max_new_tokens - len(self.req.output) - 1

    def context(self) -> list[int]:
        """Prompt and output so far: what the chooser's processors see before this step's tree."""
        return self.prompt_ids + self.req.output

    def root(self) -> int:
        """The last emitted token: verified, not yet in the cache; every tree hangs below it."""
        return self.req.output[-1]

    def max_budget(self) -> int:
        """Most draft tokens worth asking for now (none once a step could not emit past the root; the
        tree's depth is bounded by ``room`` separately, so a wide tree near the end keeps its forks)."""
        return self.drafting.budget if self.room > 0 else 0

    def max_extend(self) -> int:
        """Most nodes a tree may grow to with confident copies: the config's ``max_decoding_length``, or,
        while the request is copying (every step verified its deepest branch whole: a repeated answer),
        the rest of the answer (``room``) along past outputs, as one chain. Once a step stops short the
        answer is not a copy, and a long chain would mostly be thrown away. The cache holds it: capacity
        is prompt + max_new_tokens + max_step_tokens, and a tree beyond ``max_decoding_length`` is at most
        ``room`` = max_new_tokens - output - 1 nodes."""
        if not self.max_budget():
            return 0
        return max(self.config.max_decoding_length, self.room) if self.copying else self.config.max_decoding_length

    def draft(self, budget: int, extend_to: int) -> DraftTree:
        """This step's tree from every proposer: ``budget`` best nodes, confident copies up to ``extend_to``."""
        return self.drafting.draft(Ask(self.context(), budget, self.room, extend_to, self.eos))

    # ---- what a step writes ---------------------------------------------------------------------
    def take_prefix(self, cache: PrefixKVCache) -> int:
        """Before its first chunk runs: load the longest cached prefix of the prompt if it is longer than
        what the cache already holds (a prompt prefilled since, e.g. the same question in the same burst);
        returns the tokens gained. At least one prompt token is left to run (its logits give the first
        output token). Looks again only when the cache has stored something since the last look."""
        req = self.req
        if self.prefilled != req.stats.prefix_hit_tokens or self.prefix_seen == cache.stores:
            return 0  # a chunk already ran, or nothing new was stored
        self.prefix_seen = cache.stores
        hit, pieces = cache.lookup(req.tenant, req.prompt_ids, max_tokens=len(req.prompt_ids) - 1)
        if pieces is None or hit <= self.prefilled:
            return 0
        gained = hit - self.prefilled
        self.backend.load_prefix(self.kv, pieces, hit)
        self.prefilled = req.stats.prefix_hit_tokens = hit
        return gained

    def accept(self, tree: DraftTree, predicted: Sequence[int], rows: torch.Tensor | None,
               budget: int, out: Emitting) -> tuple[int, ...]:
        """The forward verified ``tree`` (``predicted``: the choice after every node, root first; ``rows``
        their logits, given when the acceptor or the request's logprobs need them): keep the accepted
        path's KV, emit its tokens; returns the accepted nodes."""
        path = self.drafting.acceptor.accept(tree, predicted, rows)
        self.backend.keep(self.kv, self.kv.length, path)
        accepted = tuple(path[1:])
        self.copying = self.copying and len(accepted) == tree.depth()
        self.history.append((accepted, len(tree)))
        st = self.req.stats
        st.forward_steps += 1
        st.draft_tokens += len(tree)
        st.budgets.append(budget)
        if self.req.observer is not None:
            self.req.observer.on_step(tree, accepted)
        new = [tree.tokens[i - 1] for i in accepted] + [predicted[path[-1]]]
        # token j of ``new`` was chosen after node path[j]: its distribution is that row's
        logprobs = self.logprobs_of(rows[path], new) if rows is not None and self.config.logprobs else None
        st.accepted_per_step.append(len(self.emit(new, logprobs, out)))
        return accepted

    def prefilled_to(self, end: int) -> None:
        """A prefill chunk's forward wrote the prompt's entries up to ``end``: they are in the cache now."""
        self.backend.extend(self.kv, end)
        self.prefilled = end

    def prompt_kv(self) -> KV:
        """Views of the whole prompt's entries in the cache (the prefix cache copies what it keeps)."""
        return self.backend.prefix_views(self.kv, len(self.prompt_ids))

    def logprobs_of(self, rows: torch.Tensor, new: list[int]) -> list[TokenLogprob]:
        """``new``'s logprobs (and top alternatives) from ``rows`` [len(new), vocab]: the logits they were chosen
        from (row j: the distribution ``new[j]`` was chosen from)."""
        return token_logprobs(rows, new, self.config.top_logprobs)

    def emit(self, new: list[int], logprobs: list[TokenLogprob] | None, out: Emitting) -> list[int]:
        """Trim a step's verified tokens (EOS, length, stop strings), append and announce them (with
        their ``logprobs`` when the request asked: recorded in ``req.logprobs`` before the callback)."""
        with out.timed("emit"):
            return self._emit(new, logprobs, out.decode)

    def _emit(self, new: list[int], logprobs: list[TokenLogprob] | None,
              decode: Callable[[list[int]], str]) -> list[int]:
        req = self.req
        kept, reason = trim_step(req.output, new, self.eos, self.config.max_new_tokens, self.config.stop_strings,
                                 decode)
        if reason:
            req.finish(reason)
        req.output.extend(kept)
        if logprobs is not None:
            req.logprobs.extend(logprobs[: len(kept)])
        if self.cursor is not None and kept:
            self.cursor.feed(kept)
        if kept and not req.stats.first_token_s:
            req.stats.first_token_s = time.perf_counter() - req.submitted
        if kept and req.on_tokens is not None:
            req.on_tokens(req, kept)
        return kept

    def rode(self, batch: int, tokens: int, kernel: str) -> None:
        """This request rode in a forward of ``batch`` requests and ``tokens`` tokens, run by ``kernel``."""
        st = self.req.stats
        st.batch_sizes.append(batch)
        st.forward_tokens.append(tokens)
        st.kernels.add(kernel)

    def release(self) -> None:
        """Drop the request's prompt branches and output cursor (the cache goes with this object)."""
        self.req.trie.remove_owner(self.req.owner)
        if self.cursor is not None:
            self.cursor.close()
            self.cursor = None
