"""The events package stands alone: importing any of its modules pulls in no service package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHECK = """
import importlib, pkgutil, sys
import lookahead_rag.services.events
events = lookahead_rag.services.events
names = [m.name for m in pkgutil.walk_packages(events.__path__, "lookahead_rag.services.events.")]
assert "lookahead_rag.services.events.kafka.bus" in names and "lookahead_rag.services.events.metrics" in names, names
for name in names:
    importlib.import_module(name)
svc = "lookahead_rag.services."
prefixes = tuple(svc + s for s in ("retriever", "draftcache", "generator"))
services_loaded = [m for m in sys.modules if m.startswith(prefixes)]
assert not services_loaded, services_loaded
print(len(names))
"""


def test_importing_every_events_module_pulls_in_no_service_package() -> None:
    done = subprocess.run([sys.executable, "-c", CHECK], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) >= 12  # the root, inprocess, factory, metrics, protocols and the kafka modules
