"""The driver's side of ``tests.fuzz.server``: start the child, read its ``ServerInfo``, watch it, restart it.

    with ServerProcess(workdir) as server:
        channel = server.channel("retriever")
        ...
        server.alive()        # False once the child has died (a crash)
        server.restart()      # a fresh child (fresh data directories), new ports and channels

The child's stderr goes to ``workdir/server-<n>.log`` (tracebacks of INTERNAL errors land there).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO

import grpc

from lookahead_rag.services.common.auth.callers import bearer_metadata
from tests.fuzz.targets import open_channel

START_TIMEOUT_S = 300.0  # loading the model and the embedder on 2 busy cores
STOP_TIMEOUT_S = 120.0  # a graceful stop (in-flight calls finish within their grace)
REPO_ROOT = Path(__file__).resolve().parents[2]
INFO_PREFIX = '{"pid"'  # how the child's ServerInfo line starts (tests.fuzz.server prints it first)


@dataclass(frozen=True)
class ServerInfo:
    """What the child printed: where each service listens and what to draw from."""

    pid: int
    ports: dict[str, int]
    metrics_port: int | None
    max_message_bytes: dict[str, int]
    known_tenant: str
    tokenizer_id: str
    question: str
    strings: list[str] = field(default_factory=list)
    ints: list[int] = field(default_factory=list)
    api_key: str = ""  # the known tenant's API key when the servers require one (--auth), else ""

    def target(self, service: str) -> str:
        return f"127.0.0.1:{self.ports[service]}"


def _pump(stream: IO[str], lines: queue.Queue[str]) -> None:
    """Read the child's stdout to its end (so it never blocks on a full pipe); "" marks the end."""
    for line in stream:
        lines.put(line)
    lines.put("")


def _info_line(lines: queue.Queue[str], timeout_s: float) -> str:
    """The child's ServerInfo line (a library may print other lines first); "" if the child ended first."""
    end = time.monotonic() + timeout_s
    while (left := end - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            break
        if not line or line.startswith(INFO_PREFIX):
            return line
    raise TimeoutError(f"the fuzz server printed no ServerInfo in {timeout_s:.0f} s")


class ServerProcess:
    def __init__(self, workdir: Path, extra_args: list[str] | None = None) -> None:
        self.workdir = workdir
        self.extra_args = extra_args or []
        self.starts = 0
        self.proc: subprocess.Popen[str] | None = None
        self.info: ServerInfo | None = None
        self._channels: dict[str, grpc.Channel] = {}
        self._log: IO[str] | None = None

    @property
    def log_path(self) -> Path:
        return self.workdir / f"server-{self.starts}.log"

    def start(self) -> ServerInfo:
        self.starts += 1
        root = self.workdir / f"data-{self.starts}"
        root.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("w")
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fuzz.server", "--root", str(root), *self.extra_args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True, cwd=REPO_ROOT, env=env,
        )
        assert self.proc.stdout is not None
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=_pump, args=(self.proc.stdout, lines), daemon=True).start()
        try:
            line = _info_line(lines, START_TIMEOUT_S)
        except TimeoutError:
            self.stop()
            raise
        if not line:
            code = self.stop()
            raise RuntimeError(f"the fuzz server exited ({code}) before serving; see {self.log_path}")
        self.info = ServerInfo(**json.loads(line))
        return self.info

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """What a well-behaved client of the known tenant sends: its key, when the servers require one."""
        assert self.info is not None, "start() first"
        return bearer_metadata(self.info.api_key)

    def channel(self, service: str) -> grpc.Channel:
        if service not in self._channels:
            assert self.info is not None, "start() first"
            self._channels[service] = open_channel(self.info.target(service))
        return self._channels[service]

    def stop(self) -> int | None:
        """Close the child's stdin (it stops gracefully); kill it if it does not exit in time."""
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
        proc, self.proc = self.proc, None
        code = None
        if proc is not None:
            if proc.stdin is not None:
                with contextlib.suppress(OSError):  # a child that died leaves a broken pipe
                    proc.stdin.close()
            try:
                code = proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    def restart(self) -> ServerInfo:
        self.stop()
        return self.start()

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()
