"""The three services for a fuzz run, in a process of their own (a crash there is seen, not shared).

    python -m tests.fuzz.server --root DIR [--max-new-tokens 4] [--max-doc-chars 2000] [--auth]

Starts the pipeline on real gRPC (loopback, any free ports, /metrics on any free port), ingests
the test documents for one known tenant and gives it one cached output, then prints one JSON line
(``ServerInfo``: ports, message size limits, the fuzz dictionary: names the servers accept and
every number their settings are set to, and with ``--auth`` the known tenant's API key) and
serves until its stdin closes; then it stops gracefully.
The settings are the test pipeline's (tests.pipeline.helpers) with answers kept short and
documents small, so that the cases that pass validation stay cheap.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

KNOWN_TENANT = "fuzz-known"
CHAT_ROLES = ("system", "user", "assistant")
DEFAULT_MAX_NEW_TOKENS = 4  # generated answers stay this short (the limit, and twice it, are drawn too)
DEFAULT_MAX_DOC_CHARS = 2_000  # ingested documents stay this small (embedding is the costly part)
DICTIONARY_INT_MAX = 10**7  # settings numbers above this are not drawn as limits


def _settings_ints(*sections: Any) -> list[int]:
    """Every positive integer a settings section holds (limits, sizes, budgets): boundaries to draw."""
    out: set[int] = set()
    for section in sections:
        for value in section.model_dump().values():
            if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= DICTIONARY_INT_MAX:
                out.add(value)
    return sorted(out)


def auth_section(root: Path) -> tuple[dict[str, Any], str]:
    """``[auth]`` requiring a key, with a key file of two keys: the known tenant's (returned, for the
    driver) and the services' own (every tenant, for the generator's calls to the other two)."""
    from lookahead_rag.services.common.auth.keys import KeyFile

    keys = KeyFile(root / "keys.json")
    _, tenant_key = keys.add([KNOWN_TENANT], "fuzz-known-tenant", ["answer", "write"])  # every tenant RPC
    _, service_key = keys.add(["*"], "fuzz-services")  # scope answer: Retrieve, Fetch, Stats
    return {"mode": "required", "keys_file": keys.path, "service_key": service_key}, tenant_key


async def serve(root: Path, max_new_tokens: int, max_doc_chars: int, auth: bool) -> None:
    from lookahead_core.config import DraftMode

    from lookahead_rag.services.app import Pipeline
    from tests.pipeline.helpers import DOCS, QUESTION, pipeline_settings, shared_model

    auth_settings, api_key = auth_section(root) if auth else ({}, "")
    settings = pipeline_settings(
        root,
        auth=auth_settings,
        limits={"max_new_tokens": 2 * max_new_tokens, "default_max_new_tokens": max_new_tokens},
        retriever={"max_doc_chars": max_doc_chars},
        http={"enabled": False},
    )
    model, tokenizer = shared_model()
    pipeline = await Pipeline.start(settings, grpc_servers=True, model=model, tokenizer=tokenizer, metrics_port=0)
    try:
        await asyncio.to_thread(pipeline.retriever.ingest, KNOWN_TENANT, DOCS)
        tokenizer_id = pipeline.retriever.tokenizer_id
        answer_ids = tokenizer(DOCS[0].text, add_special_tokens=False)["input_ids"]
        pipeline.draftcache.add_output(KNOWN_TENANT, tokenizer_id, answer_ids, "fuzz-seed-output")
        strings = [KNOWN_TENANT, tokenizer_id, QUESTION, *CHAT_ROLES, *(m.value for m in DraftMode),
                   *(d.id for d in DOCS)]
        numbers = _settings_ints(settings.limits, settings.retriever, settings.draftcache, settings.generator)
        info = {
            "pid": os.getpid(),
            "ports": pipeline.ports,
            "metrics_port": pipeline.metrics_port,
            "max_message_bytes": {name: s.max_message_bytes for name, s in pipeline.services.items()},
            "known_tenant": KNOWN_TENANT,
            "tokenizer_id": tokenizer_id,
            "question": QUESTION,
            "strings": strings,
            "ints": [*numbers, len(tokenizer)],
            "api_key": api_key,
        }
        print(json.dumps(info), flush=True)
        await asyncio.to_thread(sys.stdin.read)  # until the driver closes our stdin
    finally:
        await pipeline.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz.server", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, required=True, help="data directories go here")
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    parser.add_argument("--max-doc-chars", type=int, default=DEFAULT_MAX_DOC_CHARS)
    parser.add_argument("--auth", action="store_true", help="require API keys ([auth] mode = required)")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    asyncio.run(serve(args.root, args.max_new_tokens, args.max_doc_chars, args.auth))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
