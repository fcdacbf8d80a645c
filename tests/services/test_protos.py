"""The committed generated code (protos/**/_pb2*.py, .pyi) must match what the .proto files generate."""

from __future__ import annotations

from pathlib import Path

from lookahead_rag.services.common.rpc.protogen import ROOT, generate, proto_files

GENERATED_PATTERNS = ("*_pb2.py", "*_pb2.pyi", "*_pb2_grpc.py")


def generated_files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for pattern in GENERATED_PATTERNS
        for p in root.rglob(pattern)
    }


def test_there_are_protos() -> None:
    names = {p.name for p in proto_files()}
    assert {"retriever.proto", "draftcache.proto", "generator.proto", "events.proto"} <= names


def test_generated_code_is_not_stale(tmp_path: Path) -> None:
    generate(tmp_path)
    fresh = generated_files(tmp_path)
    committed = generated_files(ROOT)
    assert fresh, "protoc produced nothing"
    missing = sorted(set(fresh) - set(committed))
    extra = sorted(set(committed) - set(fresh))
    stale = sorted(name for name in fresh.keys() & committed.keys() if fresh[name] != committed[name])
    hint = "run `make protos` (python -m lookahead_rag.services.common.rpc.protogen) and commit the result"
    assert (missing, extra, stale) == ([], [], []), hint
