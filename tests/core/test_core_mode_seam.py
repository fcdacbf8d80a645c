"""One seam for draft sources: a request's ``mode`` is read in exactly one function outside config parsing.

``proposers/build.py::drafting_spec`` turns the mode into proposers; everything else asks the spec or
the proposers. The test walks the library and the services and names every function that compares a
mode (``DraftMode.X``) or, in the library, reads a ``.mode`` attribute.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "libs" / "lookahead_core"
SERVICES = ROOT / "services"
# config parsing: where a mode is named, checked and defaulted, not acted on
PARSING = {"libs/lookahead_core/config.py", "services/generator/settings.py", "services/generator/params.py"}
THE_SEAM = {"libs/lookahead_core/proposers/build.py::drafting_spec"}


def mode_readers(path: Path, library: bool, root: Path = ROOT) -> set[str]:
    """``file::function`` of every mode read in ``path`` (module level reads as ``file::<module>``)."""
    rel = path.relative_to(root).as_posix()
    found: set[str] = set()

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                inner = child.name
            if isinstance(child, ast.Attribute):
                member = isinstance(child.value, ast.Name) and child.value.id == "DraftMode"
                attribute = library and child.attr == "mode" and isinstance(child.ctx, ast.Load)
                if member or attribute:
                    found.add(f"{rel}::{inner}")
            visit(child, inner)

    visit(ast.parse(path.read_text()), "<module>")
    return found


def test_mode_is_read_in_one_function() -> None:
    readers: set[str] = set()
    for base, library in ((LIBRARY, True), (SERVICES, False)):
        for path in sorted(base.rglob("*.py")):
            if path.relative_to(ROOT).as_posix() not in PARSING and "_pb2" not in path.name:
                readers |= mode_readers(path, library)
    assert readers == THE_SEAM


def test_the_check_finds_a_mode_read(tmp_path: Path) -> None:
    # the walk has teeth: a function comparing a mode, and a library attribute read, are both named
    probe = tmp_path / "probe.py"
    probe.write_text("X = DraftMode.JACOBI\n\ndef f(cfg):\n    return cfg.mode\n")
    assert mode_readers(probe, library=True, root=tmp_path) == {"probe.py::<module>", "probe.py::f"}
    assert mode_readers(probe, library=False, root=tmp_path) == {"probe.py::<module>"}  # services: members only
