"""The credential a fuzz case sends when the servers require one (``python -m tests.fuzz.run --auth``).

The server process makes one API key for the known tenant and prints it; most cases send it, so the
request bodies reach the servicers. Every ``len(CYCLE)``-th case in a cycle sends instead no credential,
an unknown key, a malformed header or the key in another scheme, so the auth interceptor is fuzzed
together with the bodies; those cases carry the bad-input class ``auth:<variant>``. Without ``--auth``
nothing is sent and no class is added.
"""

from __future__ import annotations

from lookahead_rag.services.common.auth.callers import AUTHORIZATION, bearer_metadata

KEY = "key"  # the known tenant's key (not a bad-input class)
CYCLE = (KEY, KEY, KEY, KEY, KEY, KEY, "none", "unknown-key", "malformed", "basic-scheme")
UNKNOWN_KEY = "lar_fuzz_this_key_was_never_issued_0000000000"
Metadata = tuple[tuple[str, str], ...]


def credential(n: int, api_key: str) -> tuple[str, Metadata]:
    """Case ``n``'s credential variant and the metadata that sends it; ``("", ())`` with auth off."""
    if not api_key:
        return "", ()
    variant = CYCLE[n % len(CYCLE)]
    metadata: dict[str, Metadata] = {
        KEY: bearer_metadata(api_key),
        "none": (),
        "unknown-key": bearer_metadata(UNKNOWN_KEY),
        "malformed": ((AUTHORIZATION, f"Bearer {api_key} trailing"),),
        "basic-scheme": ((AUTHORIZATION, f"Basic {api_key}"),),
    }
    return variant, metadata[variant]


def auth_class(variant: str) -> frozenset[str]:
    """The bad-input class a variant adds to its case (none for the right key or auth off)."""
    return frozenset() if variant in ("", KEY) else frozenset({f"auth:{variant}"})
