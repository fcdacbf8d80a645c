"""Issue 32 item 5: a write key can no longer stall the event consumers with forgets. Outputs longer than
``max_reference_tokens`` leave a scope's log incomplete, and a forget then rebuilt the scope from every
logged output (up to 4 tokenizers x 1,000 outputs), serially in the consumer every tenant's events wait
behind. Now a rebuild takes at most ``[draftcache] max_rebuild_tokens`` of the newest logged tokens (a
forget drops more, never less), and AddOutput and Forget count against the tenant's rate by default
(tests/hostile/test_metered_calls.py). Two tenants: the flooder's forgets do bounded work, and the
other tenant's erasure is still exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from lookahead_core.drafting.trie import TokenTrie

from lookahead_rag.services.draftcache.store import DraftCacheStore
from lookahead_rag.services.events.forget import forget_event
from tests.builders import TOKENIZER, completed
from tests.services.draftcache_helpers import small_settings

OUTPUTS, CUT = 200, 64  # the flooder's outputs (all kept in the log) and each one's logged length
LONG = CUT + 8  # each output longer than the cut: the log is incomplete, every forget rebuilds
REBUILD_TOKENS = 256  # [draftcache] max_rebuild_tokens here
TOKENIZERS = ("tok-a", "tok-b", "tok-c", "tok-d")  # the flooder's scopes


def output(n: int, length: int) -> list[int]:
    return [(n * 7 + i) % 500 + 1 for i in range(length)]


def grounded(tenant: str, ids: Sequence[int], doc: str, tokenizer_id: str = TOKENIZER) -> Any:
    event = completed(tenant, output_ids=ids, tokenizer_id=tokenizer_id)
    event.doc_ids.append(doc)
    return event


def test_a_flooders_forget_rebuilds_a_bounded_amount_and_the_other_tenants_erasure_is_exact(
        monkeypatch: pytest.MonkeyPatch) -> None:
    store = DraftCacheStore(small_settings(max_references=OUTPUTS, max_reference_tokens=CUT,
                                           max_tokenizers_per_tenant=len(TOKENIZERS),
                                           max_rebuild_tokens=REBUILD_TOKENS))
    for tok in TOKENIZERS:
        for n in range(OUTPUTS):
            store.apply(grounded("evil", output(n, LONG), f"doc-{n}", tok))
    kept = grounded("victim", output(9001, 16), "kept")
    erased = grounded("victim", output(9002, 16), "secret")
    store.apply(kept)
    store.apply(erased)
    inserted: list[int] = []
    real = TokenTrie.insert_output

    def counting(self: TokenTrie, ids: Sequence[int], *args: Any, **kwargs: Any) -> Any:
        inserted.append(len(ids))
        return real(self, ids, *args, **kwargs)

    monkeypatch.setattr(TokenTrie, "insert_output", counting)
    store.apply(forget_event("evil", "doc-0"))
    assert sum(inserted) <= REBUILD_TOKENS * len(TOKENIZERS), f"the forget rebuilt {sum(inserted)} tokens"
    # the other tenant's erasure: exactly its document's output leaves, the rest stays
    store.apply(forget_event("victim", "secret"))
    (scope,) = [s for s in store.stats("victim")]
    assert scope.outputs == 1
