"""Protobuf stays at the edge: servicers, clients and ``convert.py`` (from_pb -> domain -> to_pb), the
gRPC plumbing, and the event bus, whose events are its protobuf messages. Everything else (the
services' cores, the generator's included, and the decoding library) works on domain types.

Read from the source with ``ast`` (every import, also those inside functions): a ``*_pb2`` or
``*_pb2_grpc`` module imported anywhere else fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("services", "libs")  # bench/ and tests/ drive the wire from outside: not checked
EDGE_FILES = frozenset({"servicer.py", "client.py", "convert.py"})  # in any service: they own the wire
# build.py registers its servicer with the server (add_*Servicer_to_server): the _grpc stubs only
REGISTRATION_FILES = frozenset({"build.py"})
# (file, why): the rest of the edge, named one by one
EDGE_MODULES: dict[str, str] = {
    "services/common/errors.py": "gRPC status details (google.rpc RetryInfo)",
    "services/common/rpc/grpcutil.py": "the gRPC server's health service",
    "services/common/rpc/protogen.py": "generates and checks the stubs",
    "services/generator/ask.py": "a command-line gRPC client",
    "services/retriever/ingest_cli.py": "a command-line gRPC client",
}
EVENTS = "events_pb2"  # the event bus's schema: the events on it are these messages
# the bus and the modules that publish or apply its events (ARCHITECTURE.md, "The event path")
EVENT_MODULES = frozenset({
    "services/draftcache/store.py", "services/generator/forget.py", "services/retriever/sessions.py",
    "services/retriever/doc_applier.py", "services/retriever/doc_events.py",
})


def pb2_imports(source: str, name: str) -> set[str]:
    """The ``*_pb2`` / ``*_pb2_grpc`` modules ``source`` imports, by their last name."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [f"{node.module or ''}.{alias.name}" for alias in node.names]
        else:
            continue
        for full in names:
            for part in full.split("."):
                if part.endswith(("_pb2", "_pb2_grpc")):
                    found.add(part)
    return found


def allowed(rel: str, module: str) -> bool:
    """Whether the file at ``rel`` (repo-relative, POSIX) may import the stub ``module``."""
    file = rel.rpartition("/")[2]
    if rel.startswith("libs/"):
        return False
    if file in EDGE_FILES or rel in EDGE_MODULES:
        return True
    if file in REGISTRATION_FILES and module.endswith("_pb2_grpc"):
        return True
    return module == EVENTS and (rel.startswith("services/events/") or rel in EVENT_MODULES)


def violations(repo: Path) -> list[str]:
    out = []
    for root in ROOTS:
        for path in sorted((repo / root).rglob("*.py")):
            rel = path.relative_to(repo).as_posix()
            out += [f"{rel} imports {m}" for m in sorted(pb2_imports(path.read_text(), rel)) if not allowed(rel, m)]
    return out


def test_protobuf_stays_at_the_edge() -> None:
    assert violations(REPO) == []


def test_the_allowlist_names_files_that_exist() -> None:
    assert [rel for rel in (*EDGE_MODULES, *EVENT_MODULES) if not (REPO / rel).is_file()] == []


def test_the_check_sees_protobuf_past_the_edge(tmp_path: Path) -> None:
    for root in ROOTS:
        (tmp_path / root).mkdir()
    generator = tmp_path / "services" / "generator"
    generator.mkdir()
    # the core reading a reply, hidden in a function; the same import in convert.py is the edge
    (generator / "core.py").write_text("def f():\n    from lookahead_rag.v1 import retriever_pb2\n")
    (generator / "convert.py").write_text("from lookahead_rag.v1 import retriever_pb2\n")
    # build.py may register a servicer, not read messages
    (generator / "build.py").write_text("import lookahead_rag.v1.generator_pb2_grpc\nfrom x import events_pb2\n")
    assert violations(tmp_path) == [
        "services/generator/build.py imports events_pb2",
        "services/generator/core.py imports retriever_pb2",
    ]
