"""The draft cache: per (tenant, tokenizer) token tries and whole recent outputs, fed by the event bus.

Public entry points:

- ``settings.DraftCacheSettings`` (``LAR_DRAFTCACHE_*``): every limit and knob.
- ``store.DraftCacheStore``: the state, no gRPC. ``add_output`` / ``apply`` (EventApplier,
  idempotent by event id), ``fetch`` -> ``[fetch.Continuation(ids, weight)]``, ``stats``,
  ``snapshot`` / ``restore``, ``save_snapshot`` / ``load_snapshot`` (atomic file).
- ``servicer.build(settings) -> (store, servicer)`` (restores the snapshot when present),
  ``servicer.serve(settings, port) -> DraftCacheService`` (``.port``, ``.store``, ``await .stop()``),
  ``servicer.save_if_changed(store)``.

Fetch contract (see ``fetch``): each returned ``ids`` is to be inserted into the per-request trie
with all its windows (``TokenTrie.insert_output(ids, count=max(1, round(weight)), prune=False)``);
``weight`` is an occurrence count among the tenant's outputs. Whole past outputs come first.
"""
