"""Serving benchmark: closed-loop clients against the three gRPC services, speculation on vs off vs serial HF.

    lookahead-rag-bench serve [--corpus C.jsonl --questions Q.jsonl] --pool 100 --requests 200 --zipf 1.1 \\
        --concurrency 1,4,16 --max-new-tokens 128 --json out.json [--png out.png] [--tenants-by-title] \\
        [--kafka HOST:PORT] [--model NAME] [--threads N] [--seed S] [--ways on,off,serial_hf] \\
        [--temperature T --top-p P --top-k K] [--record REQUESTS.json] [--replay REQUESTS.json [--replay-from C:WAY]]
    lookahead-rag-bench serve --replay REQUESTS.json --replicas 2 --routing round_robin,tenant [--tenants 8] \\
        --concurrency 4 --threads 2 --json out.json     # real replicas behind HAProxy: bench/serve_replicas.py

Without --corpus/--questions it serves the small bundled set (bench/data: 44 questions, so the
pool is 44): a smoke test; quote figures measured on a named dataset. The three services run in
this process on loopback gRPC. At each concurrency level c, c closed-loop
clients send the same Zipf-popular request sequence (bench/serve_load.py) in each of ``--ways``, each on
fresh services (cold caches) sharing one loaded model:

- ``on``: speculation on (the server's default mode, or ``--mode M`` in every request: jacobi,
  draft-model, or the lossy mjsd, whose exact match then says how often its answers differ);
- ``on_tls``: ``on`` with every gRPC channel over TLS (a CA and a server certificate made at run time,
  services.common.auth.devpki; needs the ``cryptography`` package): what TLS costs;
- ``on_safe``: ``on`` with GenerationParams.safe_stream (fixed cadence, fixed-size padded chunks:
  docs/SECURITY.md): what the mode costs in TTFT and tokens/s; set its cadence with
  ``--gen safe_stream_interval_ms=MS --gen safe_stream_chunk_tokens=N``. Its final messages carry no
  prompt ids, so its exact match is not computed (with ``--replay`` it is: the ids sent are its prompt);
- ``off``: GenerationParams.mode="none": same engine, scheduler and batching, one token per step;
- ``serial_hf``: transformers' generate(do_sample=False) on the stock model, one request at a time,
  over the prompt ids the ``on`` way assembled, or the replayed ones (no retrieval; timed once, as the same
  prompts are every level's); its TTFT is re-timed as if the c clients queued for the one-at-a-time
  server (bench/serve_stats.py: serial_queue). With
  ``--temperature T > 0`` it runs the reference sampler (lookahead_core.sampling.generate_sampled)
  instead, with the same temperature / top-p / top-k and seed.

Exact match compares every answer with the serial baseline's answer to its own prompt ids (serial_hf's
outputs, computed untimed for prompts it did not cover): batch-1 greedy, or the reference sampler's
output for the same seed. Sampling: every request carries --temperature/--top-p/--top-k and the
one seed --seed (which also fixes the request sequence). Metric definitions: bench/serve_stats.py.

Like with like: each answer is fed back into later prompts (the retriever's past sessions), so the
prompts, and so the answer lengths, differ between levels and ways. ``--record FILE`` writes every
request of every (level, way): client and order, prompt ids, output ids, the serial reference, times
and server stats (bench/serve_record.py; the llama.cpp peer's serve_replay.py reads it as it is).
``--replay FILE`` sends one recorded (level, way)'s prompts (the first level's ``on``, or
``--replay-from C:WAY``), in index order with their tenants, at every level and in every way, with
``Generator.Generate(prompt_ids=...)`` instead of Answer; ``serial_hf`` and the exact-match
references take the same prompt ids. Recorded requests without prompt ids (failed, or on_safe) are
skipped; --pool, --requests and --zipf then do not apply. Both flags may be given together.

``lookahead-rag-bench serve``'s command line; the benchmark (bench/serve.py, torch) loads only
once the arguments are parsed, so ``--help`` stays light.
"""

from __future__ import annotations

import argparse

from lookahead_rag.bench.common import add_placement_args, parse_workload, workload_parser
from lookahead_rag.bench.haproxy_proxy import BALANCE_FACTOR, TENANT_MAX_IN_FLIGHT
from lookahead_rag.bench.serve_record import DEFAULT_WAY, ReplayError, load_replay, parse_source

WAYS = ("on", "on_tls", "on_safe", "off", "serial_hf")  # run in this order: serial_hf replays on's prompts
DEFAULT_WAYS = ("on", "off", "serial_hf")  # on_tls / on_safe: the cost of TLS / the safe stream, beside on


def parse_args(argv: list[str], doc: str | None = None) -> argparse.Namespace:
    p = workload_parser("lookahead-rag-bench serve", __doc__ if doc is None else doc)
    p.add_argument("--pool", type=int, default=100, help="the first N answerable questions are drawn from")
    p.add_argument("--requests", type=int, default=200, help="requests per level and way")
    p.add_argument("--zipf", type=float, default=1.1, help="popularity exponent s: rank r has weight 1/r^s")
    p.add_argument("--concurrency", default="1,4,16", help="comma-separated closed-loop client counts")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--ways", default=",".join(DEFAULT_WAYS),
                   help=f"comma-separated subset of {','.join(WAYS)}: on = speculation, off = none, on_tls = on "
                        "over TLS (a run-time CA; the cryptography package), on_safe = on with the "
                        "side-channel-safe stream, serial_hf = transformers one request at a time")
    p.add_argument("--tenants-by-title", action="store_true", help="one tenant per article title")
    p.add_argument("--kafka", default="", help="HOST:PORT of a Kafka broker (default: the in-process bus)")
    p.add_argument("--model", default="smollm2-135m-instruct", help="built-in name, local path or hub id")
    add_placement_args(p, "auto")
    p.add_argument("--threads", type=int, default=0, help="torch threads of the engine and serial HF (0: every core)")
    p.add_argument("--deadline-s", type=float, default=600.0, help="gRPC deadline of one request")
    p.add_argument("--dependency-timeout-s", type=float, default=60.0,
                   help="generator's retrieve / draft-fetch deadlines (generous: load must not degrade prompts)")
    p.add_argument("--mode", default="", help="GenerationParams.mode of the on ways: jacobi, draft-model, mjsd "
                   "(lossy: its exact match says how often it differs), ... ('' = the server's default)")
    p.add_argument("--profile", action="store_true",
                   help="time every engine step's phases for each engine way and level: a table, the JSON's "
                        "'profile' and a stacked-bar PNG next to it (*_profile.png)")
    p.add_argument("--gen", action="append", default=[], metavar="KEY=VALUE",
                   help="extra generator setting (a GeneratorSettings field), repeatable")
    p.add_argument("--record", default="", metavar="FILE",
                   help="write every request of every level and way (prompt ids, output ids, times) here")
    p.add_argument("--replay", default="", metavar="FILE",
                   help="send a --record file's prompts (Generate with prompt ids) at every level and in every way")
    p.add_argument("--replay-from", default="", metavar="C:WAY",
                   help=f"the recorded level and way whose prompts --replay sends (default: the first level's "
                        f"{DEFAULT_WAY})")
    p.add_argument("--replicas", type=int, default=0,
                   help="N > 0: N generator processes behind the HAProxy proxy, per --routing (needs --replay; "
                        "bench/serve_replicas.py); 0: the one-process stack")
    p.add_argument("--routing", default="round_robin,tenant", help="with --replicas: comma-separated proxy "
                   "routings compared side by side: round_robin (the baseline), tenant (hash on x-tenant)")
    p.add_argument("--tenants", type=int, default=0,
                   help="with --replicas: give the prompts N synthetic tenants (each distinct prompt one, by hash)")
    p.add_argument("--tenant-max-in-flight", type=int, default=TENANT_MAX_IN_FLIGHT,
                   help="with --replicas: calls one tenant may have in flight through the proxy")
    p.add_argument("--balance-factor", type=int, default=BALANCE_FACTOR,
                   help="with --replicas, tenant routing: no replica above this %% of the average load")
    seed_help = "fixes the request sequence and, with --temperature > 0, is every request's sampling seed"
    args = parse_workload(p, argv, seed_help)
    ways = [w.strip() for w in args.ways.split(",") if w.strip()]
    if not ways or any(w not in WAYS for w in ways):
        p.error(f"--ways must name some of {','.join(WAYS)}")
    if "serial_hf" in ways and not {"on", "off"} & set(ways) and not args.replay:
        p.error("serial_hf replays the prompts of on (or off): name one of them too (or --replay a file)")
    args.ways = [w for w in WAYS if w in ways]
    args.levels = sorted({int(c) for c in args.concurrency.split(",") if c.strip()})
    if not args.levels or args.levels[0] < 1:
        p.error("--concurrency needs positive integers")
    args.routings = [r.strip() for r in args.routing.split(",") if r.strip()]
    if args.replicas and (not args.replay or set(args.routings) - {"round_robin", "tenant"} or not args.routings):
        p.error("--replicas needs --replay FILE and --routing among round_robin,tenant")
    args.replayed = None  # bench.serve_record.Replay of --replay
    if args.replay_from and not args.replay:
        p.error("--replay-from needs --replay FILE")
    if args.replay:
        try:
            args.replayed = load_replay(args.replay, parse_source(args.replay_from) if args.replay_from else None)
        except ReplayError as exc:
            p.error(f"--replay: {exc}")
    return args



def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv or [])
    if args.replicas:  # processes behind the proxy: this process loads no model
        from lookahead_rag.bench.serve_replicas import run as run_replicas

        return run_replicas(args)
    from lookahead_rag.bench.serve import run  # torch: see the module docstring

    return run(args)
