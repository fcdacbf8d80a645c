"""``lookahead-rag ingest --tenant T [--target HOST:PORT] PATH...``: send documents to a running retriever.

Reads JSONL / text / markdown files (directories are walked), sends them in batches over gRPC with
a progress bar, and prints how many documents and chunks went in. Any one retriever replica will
do: it publishes each document on the documents topic and every other replica indexes it too.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import grpc
from tqdm import tqdm

from lookahead_rag.services.common.auth.callers import add_key_argument, bearer_metadata
from lookahead_rag.services.common.auth.tls import TlsSettings, add_tls_arguments, tls_from_args
from lookahead_rag.services.common.errors import ServiceError
from lookahead_rag.services.common.ports import RETRIEVER_GRPC_PORT
from lookahead_rag.services.common.rpc.grpcutil import open_channel
from lookahead_rag.services.common.settings import ConfigError
from lookahead_rag.services.retriever.documents import Document
from lookahead_rag.services.retriever.ingest import read_documents
from lookahead_rag.services.retriever.settings import INGEST_MESSAGE_BYTES
from lookahead_rag.v1 import retriever_pb2, retriever_pb2_grpc

DEFAULT_TARGET = f"127.0.0.1:{RETRIEVER_GRPC_PORT}"  # a retriever served on its default port
DEFAULT_BATCH_DOCS = 64
BATCH_BYTES_FRACTION = 0.5  # a batch's text stays under half the message limit (room for framing)
DEFAULT_TIMEOUT_S = 600.0  # per batch: embedding a large batch on a small CPU takes a while
EXIT_BAD_INPUT = 2
EXIT_RPC_FAILED = 1


def batches(docs: Iterable[Document], max_docs: int, max_bytes: int) -> Iterator[list[Document]]:
    """Consecutive groups of at most ``max_docs`` documents and about ``max_bytes`` of text."""
    batch: list[Document] = []
    size = 0
    for doc in docs:
        doc_size = len(doc.text.encode()) + len(doc.id) + len(doc.title) + len(doc.source)
        if batch and (len(batch) >= max_docs or size + doc_size > max_bytes):
            yield batch
            batch, size = [], 0
        batch.append(doc)
        size += doc_size
    if batch:
        yield batch


def to_proto(doc: Document) -> retriever_pb2.Document:
    return retriever_pb2.Document(id=doc.id, title=doc.title, text=doc.text, source=doc.source)


async def send(
    target: str, tenant: str, docs: list[Document], batch_docs: int, timeout_s: float, progress: bool = True,
    tls: TlsSettings | None = None, key: str | None = None,
) -> tuple[int, int, int]:
    """Ingest ``docs`` in batches (over TLS when ``tls`` says so, with API key ``key`` when given);
    returns (documents accepted, chunks added, tenant's total chunks)."""
    accepted = added = total = 0
    max_bytes = int(INGEST_MESSAGE_BYTES * BATCH_BYTES_FRACTION)  # the retriever's default message limit
    async with open_channel(target, tls=tls) as channel:
        stub = retriever_pb2_grpc.RetrieverStub(channel)
        with tqdm(total=len(docs), unit="doc", desc=f"ingest {tenant}", disable=not progress) as bar:
            for batch in batches(docs, batch_docs, max_bytes):
                request = retriever_pb2.IngestRequest(tenant=tenant, documents=[to_proto(d) for d in batch])
                reply = await stub.Ingest(request, timeout=timeout_s, metadata=bearer_metadata(key))
                accepted += reply.documents
                added += reply.chunks
                total = reply.total_chunks
                bar.update(len(batch))
    return accepted, added, total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lookahead-rag ingest", description=__doc__.splitlines()[0])
    parser.add_argument("--tenant", required=True, help="tenant whose index receives the documents")
    parser.add_argument("--target", default=DEFAULT_TARGET, help=f"retriever HOST:PORT (default {DEFAULT_TARGET})")
    parser.add_argument("--batch-docs", type=int, default=DEFAULT_BATCH_DOCS, help="documents per request")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per request")
    parser.add_argument("paths", nargs="+", type=Path, help="JSONL, .txt or .md files, or directories")
    add_tls_arguments(parser)
    add_key_argument(parser)
    args = parser.parse_args(argv)
    try:
        tls = tls_from_args(args)
    except ConfigError as exc:
        print(f"lookahead-rag ingest: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        docs = list(read_documents(args.paths))
    except (ServiceError, OSError, UnicodeDecodeError) as exc:
        print(f"lookahead-rag ingest: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not docs:
        print("lookahead-rag ingest: no documents found", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        accepted, added, total = asyncio.run(
            send(args.target, args.tenant, docs, args.batch_docs, args.timeout, tls=tls, key=args.api_key))
    except grpc.aio.AioRpcError as exc:
        print(f"lookahead-rag ingest: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return EXIT_RPC_FAILED
    unchanged = len(docs) - accepted
    print(
        f"tenant {args.tenant!r}: {accepted} documents ingested ({unchanged} unchanged), "
        f"{added} chunks added, {total} chunks in total"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
