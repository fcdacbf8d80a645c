"""Schema-driven fuzzing of every RPC of the three services (issue 12, item 6).

    python -m tests.fuzz.run --cases 10000 --report fuzz-report.json

Requests come from the protobuf descriptors (``messages``: any message type, its fields drawn by
``values``) and from the wire format itself (``wire``: invalid UTF-8 in string fields, truncated
and malformed encodings, random bytes); ``cases`` mixes them and names each case's bad-input
classes (``classes``). ``targets`` lists every RPC from the service descriptors and calls it with
identity serializers, so the raw bytes reach the server's deserializer; ``server`` runs the three
services in a child process (a crash there is seen, not shared); ``driver`` runs the cases and
judges each reply (``outcome``); ``probes`` checks health, calls in flight and a normal request
afterwards; ``report`` writes the JSON and the text table.
"""
