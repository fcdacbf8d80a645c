"""``--help`` of every command answers without importing torch (or transformers): asking how to
run something must not cost seconds of imports, nor fail on a machine where torch is broken."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lookahead_rag.bench.cli import COMMANDS as BENCH_COMMANDS
from lookahead_rag.services.cli import COMMANDS

HEAVY = ("torch", "transformers", "sentence_transformers", "faiss")
PROBE = """
import sys
from {module} import main
try:
    code = main([{command!r}, "--help"])
except SystemExit as exc:
    code = exc.code
print(code, *sorted(m for m in {heavy!r} if m in sys.modules))
"""
TIMEOUT_S = 120


def help_probe(module: str, command: str) -> list[str]:
    """Run ``<cli> <command> --help`` in a fresh interpreter: [exit code, heavy modules it imported...]."""
    code = PROBE.format(module=module, command=command, heavy=HEAVY)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT_S, check=True)
    return out.stdout.strip().splitlines()[-1].split()


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_lookahead_rag_help_imports_no_torch(command: str) -> None:
    # `lookahead-rag <command> --help`: exit 0, and none of the heavy modules loaded
    assert help_probe("lookahead_rag.services.cli", command) == ["0"]


@pytest.mark.parametrize("command", sorted(BENCH_COMMANDS))
def test_bench_help_imports_no_torch(command: str) -> None:
    # `lookahead-rag-bench <command> --help`: exit 0, and none of the heavy modules loaded
    assert help_probe("lookahead_rag.bench.cli", command) == ["0"]
