"""Plugins for every test folder (only the root conftest may declare ``pytest_plugins``), and the model the
tests serve: the 135M built-in, whatever else is fetched on the machine (``[model] name`` defaults to auto,
the largest built-in the machine can run; a test that checks auto unsets this)."""

import os

from lookahead_core.defaults import DEFAULT_MODEL

os.environ.setdefault("LAR_MODEL_NAME", DEFAULT_MODEL)  # subprocesses (serve all, the fuzzer) inherit it
# the suite's services serve fp32 (their answers are checked against HF greedy over the same weights); the block
# kernel's path ([model] weights = "file", the served default) has its own tests (tests/core/test_core_quant.py)
os.environ.setdefault("LAR_MODEL_WEIGHTS", "float32")
os.environ.setdefault("LAR_DEMO_FETCH", "0")  # a demo run by a test never downloads a model (services/demo.py)

pytest_plugins = ["tests.kafka.fixtures"]  # the ``broker`` fixture: tests/kafka and tests/pipeline
