"""Dependencies point one way: bench -> services.app -> each service -> events, common -> lookahead_core.

Read from the source with ``ast`` (every import, also those inside functions), so a wrong-way
import fails here before it tangles the graph.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SVC = "lookahead_rag.services"
BENCH = "lookahead_rag.bench"
SERVICE_PACKAGES = (f"{SVC}.retriever", f"{SVC}.draftcache", f"{SVC}.generator")
TOP = tuple(f"{SVC}.{m}" for m in ("app", "serve", "config", "config_cli", "demo", "cli"))

# (files, module prefixes they must never import)
RULES: dict[str, tuple[Path, tuple[str, ...]]] = {
    "core is a library": (REPO / "libs" / "lookahead_core", ("lookahead_rag", "services", "bench", "grpc", "aiokafka")),
    "events import no service": (REPO / "services" / "events", (*SERVICE_PACKAGES, *TOP, BENCH)),
    "common imports no service": (REPO / "services" / "common", (*SERVICE_PACKAGES, *TOP, f"{SVC}.events", BENCH)),
    "services never import bench": (REPO / "services", (BENCH,)),
}


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports (absolute names; relative imports are not used in this repo)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def violations(root: Path, banned: tuple[str, ...]) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        for module in sorted(imported_modules(path)):
            if any(module == b or module.startswith(b + ".") for b in banned):
                out.append(f"{path.relative_to(root)} imports {module}")
    return out


@pytest.mark.parametrize("rule", list(RULES))
def test_imports_point_one_way(rule: str) -> None:
    root, banned = RULES[rule]
    assert violations(root, banned) == []


def test_the_check_sees_a_wrong_way_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    # hidden in a function
    bad.write_text("def f():\n    from lookahead_rag.services.generator.core import GeneratorCore\n")
    assert violations(tmp_path, SERVICE_PACKAGES) == ["bad.py imports lookahead_rag.services.generator.core"]


# the library's faces: the torch-free package itself, and what a server running the engine needs
CORE_FACES = ("lookahead_core", "lookahead_core.serving")


def past_the_faces(root: Path) -> list[str]:
    """Imports under ``root`` of a ``lookahead_core`` module that is not one of its faces."""
    return [f"{path.relative_to(root)} imports {module}" for path in sorted(root.rglob("*.py"))
            for module in sorted(imported_modules(path))
            if module.startswith("lookahead_core.") and module not in CORE_FACES]


def test_the_generator_sees_the_core_through_its_faces() -> None:
    assert past_the_faces(REPO / "services" / "generator") == []


def test_the_check_sees_an_import_past_the_faces(tmp_path: Path) -> None:
    (tmp_path / "ok.py").write_text("from lookahead_core import TokenTrie\nimport lookahead_core.serving\n")
    (tmp_path / "bad.py").write_text("def f():\n    from lookahead_core.engine.scheduler import StepScheduler\n")
    assert past_the_faces(tmp_path) == ["bad.py imports lookahead_core.engine.scheduler"]
