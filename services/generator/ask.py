"""``lookahead-rag ask --tenant T "question"``: stream an answer from a running generator.

Greedy by default; ``--temperature`` > 0 samples (``--top-p``, ``--top-k``, ``--min-p``,
``--repetition-penalty``), and the seed used is printed at the end: ``--seed`` with it gives the
same answer again.
"""

from __future__ import annotations

import argparse
import sys

import grpc

from lookahead_rag.services.common.auth.callers import add_key_argument, bearer_metadata
from lookahead_rag.services.common.auth.tls import add_tls_arguments, sync_channel, tls_from_args
from lookahead_rag.services.common.ports import GENERATOR_GRPC_PORT
from lookahead_rag.services.common.rpc.tenant_route import tenant_metadata
from lookahead_rag.services.common.settings import ConfigError
from lookahead_rag.v1 import generator_pb2, generator_pb2_grpc

EXIT_BAD_CONFIG = 2


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, generator_pb2.AnswerRequest]:
    """The command line and the AnswerRequest it asks for."""
    p = argparse.ArgumentParser(prog="lookahead-rag ask", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("question")
    p.add_argument("--tenant", required=True)
    p.add_argument("--target", default=f"127.0.0.1:{GENERATOR_GRPC_PORT}", help="generator HOST:PORT")
    p.add_argument("--max-new-tokens", type=int, default=0, help="0 = server default")
    p.add_argument("--mode", default="", help="hierarchical | parallel | llma | jacobi | draft-model | none, or mjsd "
                   "(lossy: may differ from plain decoding) (default: server's)")
    p.add_argument("--k", type=int, default=0, help="documents to retrieve (0 = server default)")
    p.add_argument("--timeout", type=float, default=120.0, help="deadline in seconds")
    s = p.add_argument_group("sampling", "transformers' GenerationConfig semantics; the same seed gives the same text")
    s.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (the default)")
    s.add_argument("--top-p", type=float, default=0.0, help="nucleus, in (0, 1] (0 = off)")
    s.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    s.add_argument("--min-p", type=float, default=0.0, help="in [0, 1] (0 = off)")
    s.add_argument("--repetition-penalty", type=float, default=0.0, help="> 0 (0 = the model's)")
    s.add_argument("--seed", type=int, default=None, help="sampling seed (default: a random one, printed at the end)")
    add_tls_arguments(p)
    add_key_argument(p)
    args = p.parse_args(argv or [])
    if args.top_k < 0:  # the range checks of the float knobs are the server's (one place)
        p.error("--top-k must be >= 0")
    if args.seed is not None and not 0 <= args.seed < 2**64:
        p.error("--seed must be in [0, 2**64)")
    req = generator_pb2.AnswerRequest(
        tenant=args.tenant, question=args.question, k=args.k,
        params=generator_pb2.GenerationParams(
            max_new_tokens=args.max_new_tokens, mode=args.mode, temperature=args.temperature, top_p=args.top_p,
            top_k=args.top_k, min_p=args.min_p, repetition_penalty=args.repetition_penalty, seed=args.seed))
    return args, req


def main(argv: list[str] | None = None) -> int:
    args, req = parse(argv)
    try:
        tls = tls_from_args(args)
    except ConfigError as exc:
        print(f"lookahead-rag ask: {exc}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    with sync_channel(args.target, tls) as channel:
        stub = generator_pb2_grpc.GeneratorStub(channel)
        try:
            for chunk in stub.Answer(req, timeout=args.timeout,
                                     metadata=(*bearer_metadata(args.api_key), *tenant_metadata(req.tenant))):
                if chunk.HasField("delta"):
                    print(chunk.delta.text, end="", flush=True)
                else:
                    st = chunk.final.stats
                    print(f"\n\n[{st.new_tokens} tokens, {st.forward_steps} steps, "
                          f"{st.mean_accepted_per_step:.2f} tokens/step, {st.wall_s:.2f} s; "
                          f"documents {'yes' if st.documents_available else 'NO'}, "
                          f"drafts {'yes' if st.drafts_available else 'NO'}]")
                    if st.unverified:
                        print("[mode mjsd is lossy: this answer was not verified against plain decoding and may "
                              "differ from it]")
                    if st.sampled:  # how to get this very answer again
                        print(f"[sampled with seed {st.seed}: add --seed {st.seed} to reproduce it]")
        except grpc.RpcError as err:
            print(f"\nerror: {err.code().name}: {err.details()}", file=sys.stderr)
            return 1
    return 0
