"""The events package stands alone: importing any of its modules pulls in no service package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHECK = """
import importlib, pkgutil, sys
import services.events
names = [m.name for m in pkgutil.walk_packages(services.events.__path__, "services.events.")]
assert "services.events.kafka.bus" in names and "services.events.metrics" in names, names
for name in names:
    importlib.import_module(name)
services_loaded = [m for m in sys.modules if m.startswith(("services.retriever", "services.draftcache",
                                                            "services.generator"))]
assert not services_loaded, services_loaded
print(len(names))
"""


def test_importing_every_events_module_pulls_in_no_service_package() -> None:
    done = subprocess.run([sys.executable, "-c", CHECK], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) >= 12  # the root, inprocess, factory, metrics, protocols and the kafka modules
