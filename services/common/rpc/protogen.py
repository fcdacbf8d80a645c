"""Regenerate the Python code for protos/ (``make protos`` / ``python -m lookahead_rag.services.common.rpc.protogen``).

The generated ``*_pb2.py`` / ``*_pb2_grpc.py`` files live beside their ``.proto`` files and are
committed; tests/test_protos.py regenerates into a temp dir and fails when they are stale.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3] / "protos"


def proto_files(root: Path = ROOT) -> list[Path]:
    """All .proto files under protos/, sorted for reproducible output."""
    return sorted(root.rglob("*.proto"))


def generate(out_dir: Path, root: Path = ROOT) -> None:
    """Run protoc (grpc_tools) over every proto into out_dir; raises on failure."""
    from grpc_tools import protoc  # dev dependency: only needed to regenerate

    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{root}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *[str(p.relative_to(root)) for p in proto_files(root)],
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")


def main() -> None:
    generate(ROOT)
    print(f"generated code for {len(proto_files())} protos under {ROOT}", file=sys.stderr)


if __name__ == "__main__":
    main()
