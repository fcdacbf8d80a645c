"""``lookahead-rag ask --tenant T "question"``: stream an answer from a running generator."""

from __future__ import annotations

import argparse
import sys

import grpc
from lookahead_rag.v1 import generator_pb2, generator_pb2_grpc

from services.common.ports import GENERATOR_GRPC_PORT


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="lookahead-rag ask", description=__doc__)
    p.add_argument("question")
    p.add_argument("--tenant", required=True)
    p.add_argument("--target", default=f"127.0.0.1:{GENERATOR_GRPC_PORT}", help="generator HOST:PORT")
    p.add_argument("--max-new-tokens", type=int, default=0, help="0 = server default")
    p.add_argument("--mode", default="", help="hierarchical | parallel | llma | none (default: server's)")
    p.add_argument("--k", type=int, default=0, help="documents to retrieve (0 = server default)")
    p.add_argument("--timeout", type=float, default=120.0, help="deadline in seconds")
    args = p.parse_args(argv or [])
    req = generator_pb2.AnswerRequest(
        tenant=args.tenant, question=args.question, k=args.k,
        params=generator_pb2.GenerationParams(max_new_tokens=args.max_new_tokens, mode=args.mode))
    with grpc.insecure_channel(args.target) as channel:
        stub = generator_pb2_grpc.GeneratorStub(channel)
        try:
            for chunk in stub.Answer(req, timeout=args.timeout):
                if chunk.HasField("delta"):
                    print(chunk.delta.text, end="", flush=True)
                else:
                    st = chunk.final.stats
                    print(f"\n\n[{st.new_tokens} tokens, {st.forward_steps} steps, "
                          f"{st.mean_accepted_per_step:.2f} tokens/step, {st.wall_s:.2f} s; "
                          f"documents {'yes' if st.documents_available else 'NO'}, "
                          f"drafts {'yes' if st.drafts_available else 'NO'}]")
        except grpc.RpcError as err:
            print(f"\nerror: {err.code().name}: {err.details()}", file=sys.stderr)
            return 1
    return 0
