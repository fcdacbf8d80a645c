"""The largest ``DocumentChanged`` a retriever can publish, in bytes, from the limits it enforces.

The bus must take it (``[kafka] max_record_bytes``: the producer's ``max_request_size`` and the topics'
``max.message.bytes``), or one large document would never leave the outbox; ``services.config`` refuses a
configuration where it does not fit. Computed from the limits, never by building the event.
"""

from __future__ import annotations

from lookahead_rag.services.common.rules.limits import RequestLimits
from lookahead_rag.services.retriever.settings import RetrieverSettings

UTF8_MAX_BYTES = 4  # bytes of one character in UTF-8, at most
JSON_MAX_BYTES = 6  # bytes of one character inside a JSON string, at most (an escape: \u001f)
FIELD_OVERHEAD_BYTES = 6  # a protobuf string field's tag and length varint, at most (below 2**28 bytes)
KEY_OVERHEAD_BYTES = 8  # the record key's JSON brackets, quotes and comma (streams.document_key)
FIXED_BYTES = 16 * 1024  # the rest: event id, version, time, request id (gRPC metadata: 8 KiB at most),
# the record's headers (type, trace context) and framing


def largest_change_bytes(settings: RetrieverSettings, limits: RequestLimits) -> int:
    """Bytes of the largest DocumentChanged record (value, key, headers) the retriever's limits allow."""
    tenant, doc_id = limits.max_tenant_chars, settings.max_doc_id_chars
    strings = (tenant, doc_id, limits.max_doc_title_chars, settings.max_doc_chars, limits.max_doc_source_chars)
    value = sum(chars * UTF8_MAX_BYTES + FIELD_OVERHEAD_BYTES for chars in strings)
    key = (tenant + doc_id) * JSON_MAX_BYTES + KEY_OVERHEAD_BYTES
    return value + key + FIXED_BYTES
