"""One Fetch: the bounded, request-scoped continuations of a tenant scope relevant to a request.

Two parts, in this order, ``budget`` tokens in all:

1. whole past outputs (LLMA references) sharing the most n-grams with prompt + references, best
   first, within ``whole_output_share`` of the budget: long copyable spans for a repeated or
   similar question; weight = how many applied outputs had exactly these ids;
2. chained continuations of n-grams of prompt + references, found in the trie, most frequent first,
   in what is left; weight = output frequency of the continuation's seed n-gram followed by its
   first token.

Every returned sequence comes from the scope's past outputs only: part 1 is a prefix of a stored
output; in part 2 every run of ``min(seed_ngrams) + 1`` consecutive tokens is an n-gram of some
stored output (a chain may join outputs where they share such a run). The caller inserts each
sequence with all its windows; a step (``max(seed_ngrams)`` tokens, next token) that an earlier
returned sequence already holds is not returned again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from lookahead_core.drafting.trie import TokenTrie

from lookahead_rag.services.draftcache.continuations import Coverage, WalkLimits, trie_continuations
from lookahead_rag.services.draftcache.references import ReferenceStore, distinct_ngrams
from lookahead_rag.services.draftcache.settings import DraftCacheSettings


class Continuation(NamedTuple):
    """A fetched token sequence and its weight (an occurrence count, see the module docstring)."""

    ids: list[int]
    weight: float


class Fetcher(Protocol):
    """What answers a Fetch: a DraftCacheStore, or its StoreMeter (which times each fetch)."""

    def fetch(self, tenant: str, tokenizer_id: str, prompt_ids: Sequence[int],
              reference_ids: Sequence[int] = (), budget: int = 0) -> list[Continuation]: ...


def walk_limits(settings: DraftCacheSettings) -> WalkLimits:
    return WalkLimits(
        seed_ngrams=tuple(sorted(set(settings.seed_ngrams), reverse=True)),
        max_seed_children=settings.max_seed_children,
        max_chain_tokens=settings.max_chain_tokens,
        max_match=settings.branch_length - 1,
    )


def whole_outputs(
    refs: ReferenceStore, query: Sequence[int], budget: int, settings: DraftCacheSettings, coverage: Coverage
) -> list[Continuation]:
    """Past outputs sharing the most n-grams with ``query``, cut so their total stays within ``budget``."""
    grams = distinct_ngrams(query, settings.similarity_ngram)
    matches = refs.best(grams, settings.max_whole_outputs, settings.min_shared_ngrams)
    out: list[Continuation] = []
    room = budget
    for match in matches:
        if room < min(len(match.ids), settings.branch_length):  # too little left for a useful span
            break
        ids = list(match.ids[:room])
        coverage.add_sequence(ids)
        out.append(Continuation(ids, float(match.count)))
        room -= len(ids)
    return out


def fetch_continuations(
    trie: TokenTrie,
    refs: ReferenceStore,
    prompt_ids: Sequence[int],
    reference_ids: Sequence[int],
    budget: int,
    settings: DraftCacheSettings,
) -> list[Continuation]:
    """Whole past outputs first, then chained trie continuations; ``sum(len(ids)) <= budget``."""
    query = [*prompt_ids, *reference_ids]
    limits = walk_limits(settings)
    coverage = Coverage(context=max(limits.seed_ngrams))
    out = whole_outputs(refs, query, int(budget * settings.whole_output_share), settings, coverage)
    used = sum(len(b.ids) for b in out)
    out += [Continuation(ids, w) for ids, w in trie_continuations(trie, query, budget - used, limits, coverage)]
    return out
