"""Waiting for a child process to become ready: ready, or it died, or the time ran out."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable


def wait_until_ready(ready: Callable[[], bool], proc: subprocess.Popen[bytes], timeout_s: float, poll_s: float,
                     what: str, on_timeout: Callable[[], None]) -> None:
    """Poll ``ready()`` every ``poll_s`` until it holds; RuntimeError as soon as ``proc`` exits, TimeoutError
    (after ``on_timeout()``, which stops it) past ``timeout_s``. ``what`` names the process in the errors."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        if time.monotonic() > deadline:
            on_timeout()
            raise TimeoutError(f"{what} was not ready within {timeout_s:g} s")
        time.sleep(poll_s)
