"""Plugins for every test folder (only the root conftest may declare ``pytest_plugins``)."""

pytest_plugins = ["tests.kafka.fixtures"]  # the ``broker`` fixture: tests/kafka and tests/pipeline
