"""The tenant-routing proxy in front of generator replicas: HAProxy running deploy/haproxy/haproxy.cfg as
shipped, its upstreams, ports, routing and limits given through the file's environment variables.

    with HaproxyProxy(ProxyConfig(grpc=replicas.grpc_upstreams(), http=replicas.http_upstreams(),
                                  routing="tenant", log=root / "haproxy.log")) as proxy:
        channel = grpc.aio.insecure_channel(proxy.grpc_target)
        proxy.in_flight(address)   # HAProxy's view: calls in flight on one replica now

The binary is Debian's ``haproxy`` package (2.6: ``apt-get install haproxy``), found on PATH or in /usr/sbin.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lookahead_rag.bench.replica_set import terminate
from lookahead_rag.services.common.until_ready import wait_until_ready
from lookahead_rag.services.events.kafka.broker import free_port

HOST = "127.0.0.1"
DEPLOY_HAPROXY = Path(__file__).resolve().parent.parent / "deploy" / "haproxy"  # in a checkout of the repository
HAPROXY_CFG = DEPLOY_HAPROXY / "haproxy.cfg"
ROUTINGS = ("round_robin", "tenant")  # the file's PROXY_ROUTING values
SLOTS = 8  # replicas the file names (PROXY_GRPC_1..8, PROXY_HTTP_1..8)
SBIN = Path("/usr/sbin/haproxy")  # Debian's place, when /usr/sbin is not on PATH
TENANT_MAX_IN_FLIGHT = 4  # PROXY_TENANT_MAX_IN_FLIGHT, the file's default
BALANCE_FACTOR = 150  # PROXY_BALANCE_FACTOR (%), the file's default (as Envoy's in deploy/k8s/routing)
REQUEST_TIMEOUT_S = 10.0  # PROXY_REQUEST_TIMEOUT, the file's default: a request's headers and body arrive within it
MS_PER_S = 1000  # HAProxy time values are given here in milliseconds
START_TIMEOUT_S = 15.0  # until the stats page answers and every upstream has passed a health check
POLL_S = 0.1  # pause between two looks while starting
STATS_CALL_S = 2.0  # deadline of one stats request
STOP_TIMEOUT_S = 5.0  # SIGTERM grace before SIGKILL
CHECK_PASSED = "L7OK"  # the stats' check_status of a server whose last health check passed
RUNNING = "* "  # check_status's prefix while the next check runs
BACKENDS = ("grpc_replicas", "http_replicas")  # the file's backends, each one server per replica


class HaproxyMissingError(RuntimeError):
    """No haproxy binary here: install Debian's haproxy package."""


def haproxy_binary() -> Path:
    """haproxy on PATH, else Debian's /usr/sbin/haproxy; HaproxyMissingError when there is none."""
    found = shutil.which("haproxy")
    if found is not None:
        return Path(found)
    if SBIN.exists():
        return SBIN
    raise HaproxyMissingError("no haproxy binary: apt-get install haproxy (HAProxy 2.6 or later)")


@dataclass
class ProxyConfig:
    """One proxy run."""

    grpc: list[str]  # the replicas' gRPC HOST:PORT, in replica order
    http: list[str]  # their OpenAI doors, same order
    routing: str = "tenant"  # one of ROUTINGS
    tenant_max_in_flight: int = TENANT_MAX_IN_FLIGHT  # calls one tenant may have in flight through the proxy
    balance_factor: int = BALANCE_FACTOR  # no replica above this % of the average load (tenant routing)
    request_timeout_s: float = REQUEST_TIMEOUT_S  # a request not whole by then is answered 408, never forwarded
    log: Path | None = None  # haproxy's own log (None: discarded)
    config: Path = HAPROXY_CFG  # the configuration run (deploy/'s)


def proxy_env(cfg: ProxyConfig, grpc_port: int, http_port: int, stats_port: int) -> dict[str, str]:
    """The configuration's variables for one run."""
    env = {"PROXY_BIND": HOST, "PROXY_GRPC_PORT": str(grpc_port), "PROXY_HTTP_PORT": str(http_port),
           "PROXY_STATS_PORT": str(stats_port), "PROXY_ROUTING": cfg.routing,
           "PROXY_TENANT_MAX_IN_FLIGHT": str(cfg.tenant_max_in_flight),
           "PROXY_BALANCE_FACTOR": str(cfg.balance_factor),
           "PROXY_REQUEST_TIMEOUT": f"{round(cfg.request_timeout_s * MS_PER_S)}ms"}
    for door, upstreams in (("GRPC", cfg.grpc), ("HTTP", cfg.http)):
        env |= {f"PROXY_{door}_{i}": address for i, address in enumerate(upstreams, start=1)}
    return env


class HaproxyProxy:
    """HAProxy as a subprocess (a context manager)."""

    def __init__(self, cfg: ProxyConfig) -> None:
        if cfg.routing not in ROUTINGS:
            raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}")
        if not 0 < len(cfg.grpc) == len(cfg.http) <= SLOTS:
            raise ValueError(f"1 to {SLOTS} replicas, each with a gRPC and an HTTP door")
        if not cfg.config.exists():
            raise FileNotFoundError(f"{cfg.config}: run from a checkout of the repository")
        self.cfg = cfg
        self.binary = haproxy_binary()
        self.grpc_port, self.http_port, self.stats_port = free_port(HOST), free_port(HOST), free_port(HOST)
        self._popen: subprocess.Popen[bytes] | None = None
        self.grpc_target = f"{HOST}:{self.grpc_port}"  # the gRPC door clients dial
        self.http_base = f"http://{HOST}:{self.http_port}"  # the OpenAI door's base URL

    def start(self) -> None:
        """Run haproxy in the foreground and wait until it holds every replica healthy."""
        out = open(self.cfg.log, "ab") if self.cfg.log else subprocess.DEVNULL  # noqa: SIM115
        env = {k: v for k, v in os.environ.items() if not k.startswith("PROXY_")}  # only this run's slots
        env |= proxy_env(self.cfg, self.grpc_port, self.http_port, self.stats_port)
        try:
            self._popen = subprocess.Popen([str(self.binary), "-db", "-f", str(self.cfg.config)], env=env,
                                           stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            if self.cfg.log:
                out.close()  # type: ignore[union-attr]
        wait_until_ready(self._ready, self._popen, START_TIMEOUT_S, POLL_S,
                         f"haproxy (every replica healthy; log: {self.cfg.log})", self.stop)

    def _ready(self) -> bool:
        try:
            health = self.healthy()
        except OSError:
            return False
        return len(health) == len(self.cfg.grpc) + len(self.cfg.http) and all(health.values())

    def wait_healthy(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Return once haproxy holds every upstream healthy (after a replica came back: its next check)."""
        self._wait(self._ready, timeout_s, "every replica healthy")

    def wait_unhealthy(self, address: str, timeout_s: float = START_TIMEOUT_S) -> None:
        """Return once haproxy's health checks have taken ``address`` out of its pool (after it died)."""
        self._wait(lambda: not self.healthy().get(address, True), timeout_s, f"{address} unhealthy")

    def _wait(self, done: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            if time.monotonic() > deadline:
                raise TimeoutError(f"haproxy did not hold {what} within {timeout_s:g} s")
            time.sleep(POLL_S)

    def servers(self) -> list[dict[str, str]]:
        """HAProxy's stats rows of the replicas (pxname, svname, addr, scur = calls in flight, status)."""
        url = f"http://{HOST}:{self.stats_port}/stats;csv"
        with urllib.request.urlopen(url, timeout=STATS_CALL_S) as reply:
            text = bytes(reply.read()).decode().removeprefix("# ")
        return [row for row in csv.DictReader(io.StringIO(text))
                if row["pxname"] in BACKENDS and row["svname"] not in ("FRONTEND", "BACKEND")]

    def in_flight(self, address: str) -> int:
        """Calls in flight now on the replica door at ``address`` (0 when haproxy has none there)."""
        return sum(int(row["scur"]) for row in self.servers() if row["addr"] == address)

    def healthy(self) -> dict[str, bool]:
        """upstream address -> whether haproxy holds it up on a passed health check (it starts every
        server up, before its first check)."""
        return {row["addr"]: row["status"].startswith("UP")
                and row["check_status"].removeprefix(RUNNING) == CHECK_PASSED for row in self.servers()}

    def stop(self) -> None:
        if self._popen is not None:
            terminate([self._popen], STOP_TIMEOUT_S)
        self._popen = None

    def __enter__(self) -> HaproxyProxy:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
