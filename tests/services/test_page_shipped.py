"""The chat page (issue 47) reaches every install: ``pip install .`` packages it (package data, read with
importlib.resources, not a path into the source tree), the image's build context keeps it, and
``deploy/podman-check.sh`` (the image built and run with podman, checked where a user would look) is valid
shell that asks only for routes the endpoint serves."""

from __future__ import annotations

import fnmatch
import re
import subprocess
import tomllib
from pathlib import Path

from lookahead_rag.services.common.auth.scopes import HTTP_SCOPES

REPO = Path(__file__).resolve().parents[2]
HTTP = REPO / "services" / "http"


def test_the_page_is_package_data_and_in_the_image_context() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["lookahead_rag.services.http"]
    shipped = [p.relative_to(HTTP).as_posix() for p in (HTTP / "static").rglob("*") if p.is_file()]
    assert "static/index.html" in shipped
    assert all(any(fnmatch.fnmatch(f, g) for g in globs) for f in shipped), (shipped, globs)
    assert "resources.files(" in (HTTP / "page.py").read_text()  # read from the installed package
    context = (REPO / "deploy" / "Dockerfile.dockerignore").read_text().split()
    assert "!services/**" in context and "COPY services ./services" in (REPO / "deploy" / "Dockerfile").read_text()


def test_the_podman_check_is_valid_shell_over_served_routes() -> None:
    script = REPO / "deploy" / "podman-check.sh"
    assert script.stat().st_mode & 0o111  # executable
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    asked = set(re.findall(r"\$base(/[\w/.-]*)", script.read_text()))
    assert asked == {"/health", "/", "/v1/documents", "/v1/chat/completions"}
    assert asked <= {path for _, path in HTTP_SCOPES}
