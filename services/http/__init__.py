"""The OpenAI-compatible HTTP front door (``/v1/chat/completions``) over the generator (GeneratorCore).

``schema`` (the request body) -> ``translate`` (OpenAI JSON <-> the generator's domain types) -> ``routes``
(the endpoints over ``GeneratorCore``) with ``streaming`` (SSE, client disconnects) and
``errors`` (the one ServiceError -> HTTP status mapping); ``server`` runs it in-process with
uvicorn. ``lookahead_rag.services.app.Pipeline`` starts it beside the generator's gRPC server. See docs/HTTP.md.
"""
