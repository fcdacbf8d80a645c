"""Capture a test's log lines as JSON (INFO and above), the format a deployment ships."""

from __future__ import annotations

import contextlib
import io
import json
import logging
from collections.abc import Iterator
from typing import Any

from lookahead_rag.services.common.telemetry.logs import setup_logging


@contextlib.contextmanager
def json_logs() -> Iterator[io.StringIO]:
    """Every log line written inside the block, in a buffer; the root logger is put back after."""
    root = logging.getLogger()
    level, stream = root.level, io.StringIO()
    handler = setup_logging("INFO", stream=stream)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def json_lines(stream: io.StringIO) -> list[dict[str, Any]]:
    """The captured lines, parsed."""
    return [json.loads(line) for line in stream.getvalue().splitlines()]
