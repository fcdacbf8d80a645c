"""``lookahead-rag-bench hostile``: another tenant's answers under a hostile mix (issue 51's target), against alone.

    lookahead-rag-bench hostile [--corpus C.jsonl --questions Q.jsonl] [--requests 24] [--concurrency 2] \\
        [--max-new-tokens 64] [--threads 2] [--doc-mib 4] [--title-mib 2] [--hold-connections 4] \\
        [--hold-streams 100] [--json out.json]

Two runs on fresh stacks, in one process, each the three services with keys required ([auth] mode =
"required", a key per caller) and the OpenAI door on, HAProxy (deploy/haproxy) in front of the generator's
gRPC and HTTP doors: ``alone`` (the victim tenant's Zipf-drawn questions over its corpus, closed-loop
``Answer`` calls through the proxy with its key: the baseline) and ``hostile`` (the same questions while
the uploader and the holder run, bench/hostile_mix.py). The uploader tenant, with its write key, sends
back to back (a) documents of ``--doc-mib`` MiB text under a ``--title-mib`` MiB title, alternately over
the retriever's Ingest and ``POST /v1/documents`` (each should be refused, 400 / INVALID_ARGUMENT naming
``title``), and (b) ``--doc-mib`` MiB documents with a short title over Ingest (each accepted, its chunks
embedded). The holder keeps ``--hold-connections`` x ``--hold-streams`` HTTP/2 streams with
``x-tenant: <victim>``, no key and no DATA frame, open at the proxy's gRPC door (a stream answered is
replaced at once).

Per run: the victim's completed answers and errors (any RESOURCE_EXHAUSTED / 429 is a failure), TTFT
p50/p99, goodput, the answers that kept their documents (FinalInfo.documents not empty) and the
generator's degraded-retrieval count; the uploader's calls by outcome (door:code) with a message each, chunks
embedded; the holder's streams opened, answered and held. Issue 51's target: the victim's answers keep
their documents and their first token stays within ``--target-s`` (1.5 s) of alone (TTFT p50 and p99);
the table says PASS or MISS (a benchmark reports, it does not fail). A table, the JSON (``"kind":
"hostile"``) and a PNG (bench/hostile_plot.py).
"""

from __future__ import annotations

import argparse

from lookahead_rag.bench.hog_args import parse_stack_args, victim_parser

TARGET_S = 1.5  # issue 51: the victim's first token within this of alone
ATTACKERS = ("refuse", "accept", "hold")  # the oversized titles, the 4 MiB uploads, the headers-only streams


def parse(argv: list[str]) -> argparse.Namespace:
    p = victim_parser("lookahead-rag-bench hostile", __doc__)
    p.add_argument("--doc-mib", type=float, default=4.0, help="text of every upload, MiB")
    p.add_argument("--title-mib", type=float, default=2.0, help="title of the refused uploads, MiB")
    p.add_argument("--hold-connections", type=int, default=4, help="the holder's HTTP/2 connections")
    p.add_argument("--hold-streams", type=int, default=100, help="headers-only streams each connection holds")
    p.add_argument("--attackers", default=",".join(ATTACKERS),
                   help=f"which attackers run in the hostile way, a subset of {','.join(ATTACKERS)} (to tell "
                        "their harms apart)")
    p.add_argument("--attack-lead-s", type=float, default=5.0,
                   help="seconds the attackers run before the victim's first question")
    p.add_argument("--upload-wait-s", type=float, default=900.0,
                   help="after the victim's run, how long to wait for an accepted upload to finish embedding "
                        "(so its chunks are counted; 0: not at all)")
    p.add_argument("--target-s", type=float, default=TARGET_S, help="the target: TTFT within this of alone")
    args = parse_stack_args(p, argv)
    args.attackers = tuple(a for a in ATTACKERS if a in args.attackers.split(","))
    if not args.attackers:
        p.error(f"--attackers: at least one of {','.join(ATTACKERS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv or [])  # --help exits here, before torch is imported
    from lookahead_rag.bench.hostile import run  # torch: only once the benchmark runs

    return run(args)
