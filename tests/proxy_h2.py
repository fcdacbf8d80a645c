"""The proxy tests' hostile HTTP/2 client: bench/hostile_h2.py (bench hostile's holder sends the same streams)."""

from lookahead_rag.bench.hostile_h2 import HeadersOnly

__all__ = ["HeadersOnly"]
