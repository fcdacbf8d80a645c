"""Real generator replicas: N ``lookahead-rag serve generator`` processes beside one shared draft cache
(``serve draftcache``), all on loopback, events through Kafka when a broker is given.

    with ReplicaSet(ReplicaConfig(root, replicas=2, threads=1, kafka=broker.bootstrap)) as replicas:
        replicas.grpc_upstreams()     # ["127.0.0.1:41001", ...]: what the proxy balances over
        replicas.kill(0)              # SIGKILL: a crash, nothing drained (its outbox stays on disk)
        replicas.restart(0)           # the same ports and data directory: its outbox drains

Every process is configured through ``LAR_*`` variables only (the way the containers are), with its
own data directory and ``[kafka] replica_id``; each generator's gRPC and HTTP ports are fixed at
first start and kept across a restart, so the proxy's upstream list stays valid. Used by
``bench serve --replicas`` (bench/serve_replicas.py) and tests/pipeline/test_replica_faults.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lookahead_rag.services.events.kafka.broker import free_port

HOST = "127.0.0.1"  # every process binds loopback (plaintext is allowed there)
READY_TIMEOUT_S = 180.0  # a generator loads the model and times its kernels before it serves
READY_POLL_S = 0.5  # pause between two health checks while a process starts
HEALTH_CALL_S = 1.0  # deadline of one health check
STOP_TIMEOUT_S = 30.0  # SIGTERM grace (drain, in-flight streams, the outbox flush) before SIGKILL
LOAD_GAUGES = {  # a generator's load on its /metrics (services/generator/metrics.py) -> our name
    "lookahead_rag_generator_running_requests": "running",
    "lookahead_rag_generator_queue_depth": "waiting",
    "lookahead_rag_generator_kv_bytes": "kv_bytes",
}


@dataclass
class ReplicaConfig:
    """What the replicas of one run share."""

    root: Path  # one subfolder per process (data dir, log)
    replicas: int  # generator processes
    threads: int  # engine threads of EACH generator
    kafka: str = ""  # bootstrap HOST:PORT; empty = each process's in-process bus (no events shared)
    model: str = ""  # [model] name ('' = the default model)
    generator: dict[str, str] = field(default_factory=dict)  # extra [generator] settings, as strings
    limits: dict[str, str] = field(default_factory=dict)  # extra [limits] settings, as strings
    drain_s: float = 0.0  # [server] drain_s of every generator
    extra_env: dict[str, str] = field(default_factory=dict)  # more LAR_* variables for every process


@dataclass
class Proc:
    """One service process: its command's environment, ports and the running Popen."""

    name: str  # "draftcache" or "generator-<i>"
    env: dict[str, str]  # its LAR_* settings
    grpc_port: int  # where it serves gRPC
    http_port: int | None = None  # the OpenAI door (generators)
    metrics_port: int | None = None  # its /metrics (generators: the load gauges)
    popen: subprocess.Popen[bytes] | None = None


def lar_binary() -> str:
    """The ``lookahead-rag`` command of this environment."""
    beside = Path(sys.executable).with_name("lookahead-rag")
    return str(beside) if beside.exists() else (shutil.which("lookahead-rag") or "lookahead-rag")


def _section(prefix: str, values: dict[str, str]) -> dict[str, str]:
    return {f"LAR_{prefix}_{k.upper()}": str(v) for k, v in values.items()}


class ReplicaSet:
    """The shared draft cache and N generator replicas as processes (a context manager)."""

    def __init__(self, cfg: ReplicaConfig) -> None:
        self.cfg = cfg
        self.draftcache = Proc("draftcache", {}, free_port(HOST))
        self.generators = [Proc(f"generator-{i}", {}, free_port(HOST), free_port(HOST), free_port(HOST))
                           for i in range(cfg.replicas)]
        self.draftcache.env = self._common("draftcache") | _section("DRAFTCACHE", {
            "host": HOST, "port": str(self.draftcache.grpc_port), "data_dir": str(cfg.root / "draftcache")})
        for proc in self.generators:
            proc.env = self._generator_env(proc)

    def _common(self, name: str) -> dict[str, str]:
        env = {"LAR_LOG_FORMAT": "text", "LAR_KAFKA_REPLICA_ID": name, "HF_HUB_OFFLINE": "1"}
        if self.cfg.kafka:
            env["LAR_KAFKA_BOOTSTRAP_SERVERS"] = self.cfg.kafka
        if self.cfg.model:
            env["LAR_MODEL_NAME"] = self.cfg.model
        return env | self.cfg.extra_env

    def _generator_env(self, proc: Proc) -> dict[str, str]:
        own = {"host": HOST, "port": str(proc.grpc_port), "data_dir": str(self.cfg.root / proc.name),
               "threads": str(self.cfg.threads), "draftcache_target": f"{HOST}:{self.draftcache.grpc_port}",
               "retriever_target": f"{HOST}:{free_port(HOST)}",  # Generate never retrieves; nothing listens
               "drain_s": str(self.cfg.drain_s), "metrics_port": str(proc.metrics_port)}
        return (self._common(proc.name) | _section("GENERATOR", own | self.cfg.generator)
                | _section("HTTP", {"host": HOST, "port": str(proc.http_port)}) | _section("LIMITS", self.cfg.limits))

    # ---- processes ------------------------------------------------------------------------------
    def _spawn(self, proc: Proc, service: str) -> None:
        log = open(self.cfg.root / f"{proc.name}.log", "ab")  # noqa: SIM115 (the child keeps it)
        try:
            proc.popen = subprocess.Popen([lar_binary(), "serve", service], env={**os.environ, **proc.env},
                                          stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()

    def start(self) -> None:
        """Start every process and wait until each one's gRPC health says SERVING."""
        self.cfg.root.mkdir(parents=True, exist_ok=True)
        self._spawn(self.draftcache, "draftcache")
        for proc in self.generators:
            self._spawn(proc, "generator")
        for proc in [self.draftcache, *self.generators]:
            self.wait_ready(proc)

    def wait_ready(self, proc: Proc, timeout_s: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not serving(f"{HOST}:{proc.grpc_port}"):
            if proc.popen is None or proc.popen.poll() is not None:
                raise RuntimeError(f"{proc.name} exited while starting: see {self.cfg.root / proc.name}.log")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{proc.name} was not serving after {timeout_s:g} s")
            time.sleep(READY_POLL_S)

    def kill(self, index: int) -> None:
        """Crash generator ``index`` (SIGKILL: no drain, no flush)."""
        popen = self.generators[index].popen
        if popen is not None and popen.poll() is None:
            popen.kill()
            popen.wait()

    def restart(self, index: int) -> None:
        """Start generator ``index`` again on its ports and data directory, and wait until it serves."""
        self.kill(index)
        proc = self.generators[index]
        self._spawn(proc, "generator")
        self.wait_ready(proc)

    def stop(self) -> None:
        """SIGTERM every process (generators first: their outboxes flush to the broker), SIGKILL stragglers."""
        terminate([p.popen for p in [*self.generators, self.draftcache] if p.popen is not None], STOP_TIMEOUT_S)

    # ---- addresses ------------------------------------------------------------------------------
    def grpc_upstreams(self) -> list[str]:
        return [f"{HOST}:{p.grpc_port}" for p in self.generators]

    def http_upstreams(self) -> list[str]:
        return [f"{HOST}:{p.http_port}" for p in self.generators]

    def draftcache_target(self) -> str:
        return f"{HOST}:{self.draftcache.grpc_port}"

    def load(self, index: int) -> dict[str, float]:
        """What generator ``index`` reports of its load on /metrics: running, waiting, kv_bytes."""
        url = f"http://{HOST}:{self.generators[index].metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=HEALTH_CALL_S) as reply:
            text = reply.read().decode()
        found = {}
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name in LOAD_GAUGES:
                found[LOAD_GAUGES[name]] = float(value)
        return found

    def __enter__(self) -> ReplicaSet:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def terminate(popens: list[subprocess.Popen[bytes]], timeout_s: float) -> None:
    """SIGTERM each process still running, in order; SIGKILL whichever has not exited ``timeout_s`` later."""
    for popen in popens:
        if popen.poll() is None:
            popen.send_signal(signal.SIGTERM)
    for popen in popens:
        try:
            popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()


def serving(target: str) -> bool:
    """Whether the server at ``target`` answers its gRPC health check with SERVING."""
    try:
        with grpc.insecure_channel(target) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=HEALTH_CALL_S)
    except grpc.RpcError:
        return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)
