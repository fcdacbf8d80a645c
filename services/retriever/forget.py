"""``ForgetWriter``: the Forget RPC as a ``ForgetRequested`` event that every consumer applies.

    writer = ForgetWriter(core, bus)                 # bus=None: this replica's past sessions only
    event_id = writer.forget("acme", "")             # everything derived for the tenant
    event_id = writer.forget("acme", "json.dumps")   # only what derives from that document

The call validates (InvalidArgument, nothing published), applies the event to this replica's past
sessions, then publishes it on the GENERATIONS stream under the tenant's key (ordered with the
tenant's answers; the draft cache, every retriever replica and every generator replica apply it),
so a Retrieve here sees the forget at once (the bus's delivery is then a duplicate, skipped by event
id). Applying first, unlike Ingest and Delete: if the publish fails, this replica has forgotten more
than the others, which is the safe direction for a forget (the caller retries; forgets are
idempotent in effect). The documents themselves stay: Delete removes those.
"""

from __future__ import annotations

from lookahead_rag.services.common.errors import InvalidArgument
from lookahead_rag.services.common.telemetry.logs import current_request_id
from lookahead_rag.services.events.forget import EVERYTHING, forget_event
from lookahead_rag.services.events.protocols import EventPublisher
from lookahead_rag.services.retriever.core import RetrieverCore


def check_forget(core: RetrieverCore, tenant: str, doc_id: str) -> None:
    """Refuse what a forget cannot name (InvalidArgument): a bad tenant, a blank or over-long doc id."""
    core.limits.check_tenant(tenant)
    if doc_id == EVERYTHING:
        return
    if not doc_id.strip():
        raise InvalidArgument("doc_id is blank (leave it empty to forget everything of the tenant)")
    limit = core.settings.max_doc_id_chars
    if len(doc_id) > limit:
        raise InvalidArgument(f"doc_id is {len(doc_id)} characters; the limit is {limit}")


class ForgetWriter:
    """Validate, publish, apply locally: the Forget RPC."""

    def __init__(self, core: RetrieverCore, publisher: EventPublisher | None = None) -> None:
        self.core = core
        self.publisher = publisher

    def forget(self, tenant: str, doc_id: str = EVERYTHING) -> str:
        """Forget the tenant's derived data (all, or what derives from ``doc_id``); the event's id."""
        check_forget(self.core, tenant, doc_id)
        event = forget_event(tenant, doc_id, current_request_id() or "")
        self.core.sessions.apply(event)  # first: no Retrieve here cites a forgotten session once it is stamped
        if self.publisher is not None:
            self.publisher.publish(event)
        return event.event_id
