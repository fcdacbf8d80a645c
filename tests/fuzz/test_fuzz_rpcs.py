"""The fuzzer checked on itself (fast, no model), then a short fuzz run of every RPC of the three
services over real gRPC: nothing crashes or hangs, every refusal is a proper status, and normal
requests still get normal answers afterwards. ``make fuzz`` runs the long one (tests.fuzz.run)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from google.protobuf.message import DecodeError
from google.protobuf.message_factory import GetMessageClass
from hypothesis import HealthCheck, given, settings

from tests.fuzz.cases import Case, case_strategy, fixed_cases
from tests.fuzz.classes import message_classes
from tests.fuzz.credentials import CYCLE, KEY, auth_class, credential
from tests.fuzz.driver import FuzzOptions, Report, run_fuzz
from tests.fuzz.messages import messages
from tests.fuzz.outcome import Judgement, Verdict, judge
from tests.fuzz.report import class_summary, text_table, to_json
from tests.fuzz.synthetic import synthetic_file
from tests.fuzz.targets import CallResult, discover, invoke, open_channel
from tests.fuzz.values import FuzzDictionary
from tests.fuzz.wire import wire_cases

EVERYTHING = synthetic_file().message_types_by_name["Everything"]
WORDS = FuzzDictionary.of(["acme", "user"], [128, 4000])
DRAWS = 400  # examples drawn when a test collects classes (derandomized: the same every run)
SHORT_CASES = 80  # cases per RPC in the short run
SHORT_SECONDS_PER_RPC = 10.0  # ... or fewer, when an RPC's time budget is spent first
MIN_CASES = 20  # every RPC gets at least this many even on a loaded machine
DEADLINE_S = 1.0
SHORT_SEED = 20261123  # the short run draws the same cases every time; LAR_FUZZ_SEED explores others
SEED_ENV = "LAR_FUZZ_SEED"

MESSAGE_CLASSES = {
    "string:empty", "string:blank", "string:huge", "string:long", "string:nul", "string:astral",
    "string:noncharacter", "string:control-or-format", "bytes:empty", "bytes:invalid-utf8", "bytes:huge",
    "int:zero", "int:max", "int:min", "int:negative", "int:over-int32",
    "float:nan", "float:+inf", "float:-inf", "float:-0.0", "float:subnormal", "float:max-finite",
    "enum:unknown", "repeated:empty", "repeated:few", "repeated:many", "message:unset", "message:empty",
    "oneof:set", "oneof:unset", "optional:set", "optional:unset",
}
WIRE_CLASSES = {
    "wire:invalid-utf8", "wire:wrong-wire-type", "wire:unknown-field", "wire:bad-field-number",
    "wire:bad-wire-type", "wire:length-past-end", "wire:overlong-varint", "wire:varint-out-of-range",
    "wire:bad-packed", "wire:bad-group", "wire:deep-nesting", "wire:nested", "wire:truncated", "wire:bitflip",
    "wire:random-insert", "wire:duplicated", "wire:random-bytes",
}
COLLECT = settings(max_examples=DRAWS, database=None, deadline=None, derandomize=True,
                   suppress_health_check=list(HealthCheck))


# ---- the strategies, on a proto with every kind of field ------------------------------------------


def test_messages_reach_every_bad_value_class() -> None:
    seen: set[str] = set()

    @COLLECT
    @given(messages(EVERYTHING, WORDS))
    def draw(message: object) -> None:
        seen.update(message_classes(message))  # type: ignore[arg-type]

    draw()
    assert seen >= MESSAGE_CLASSES, sorted(MESSAGE_CLASSES - seen)


def test_wire_cases_reach_every_wire_class_and_invalid_utf8_never_parses() -> None:
    seen: set[str] = set()
    everything = GetMessageClass(EVERYTHING)

    @COLLECT
    @given(wire_cases(EVERYTHING, WORDS))
    def draw(encoded: object) -> None:
        seen.update(encoded.classes)  # type: ignore[attr-defined]
        if "wire:invalid-utf8" in encoded.classes:  # type: ignore[attr-defined]
            with pytest.raises(DecodeError):  # it reaches the deserializer as it is, and fails there
                everything.FromString(encoded.data)  # type: ignore[attr-defined]

    draw()
    assert seen >= WIRE_CLASSES, sorted(WIRE_CLASSES - seen)


def test_schema_valid_cases_parse_back_and_fixed_cases_are_there() -> None:
    everything = GetMessageClass(EVERYTHING)

    @settings(max_examples=200, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case_strategy(EVERYTHING, WORDS))
    def draw(case: Case) -> None:
        if case.origin == "message":
            everything.FromString(case.payload)

    draw()
    limit = 1000
    fixed = {c: case for case in fixed_cases(limit) for c in case.classes}
    assert set(fixed) == {"fixed:empty", "fixed:oversize", "fixed:deep-nesting"}
    assert fixed["fixed:empty"].payload == b"" and len(fixed["fixed:oversize"].payload) > limit


def test_a_service_no_one_wrote_code_for_is_discovered_and_fuzzed() -> None:
    rpcs = discover({"selftest": synthetic_file()})
    assert [(r.name, r.server_streaming) for r in rpcs] == [("Everywhere.Call", False), ("Everywhere.Watch", True)]
    services = discover()
    assert {r.service for r in services} == {"retriever", "draftcache", "generator"}
    assert {"Retriever.Retrieve", "DraftCache.Fetch", "Generator.Answer", "Generator.Generate"} <= {
        r.name for r in services}


# ---- judging: each failure kind is caught ------------------------------------------------------------


RPC = discover({"selftest": synthetic_file()})[0]


@pytest.mark.parametrize(("code", "details", "elapsed", "verdict"), [
    (grpc.StatusCode.OK, "", 0.1, Verdict.OK),
    (grpc.StatusCode.INVALID_ARGUMENT, "tenant is empty", 0.1, Verdict.REFUSED),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "Received message larger than max (9 vs. 8)", 0.1, Verdict.REFUSED),
    (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", DEADLINE_S, Verdict.SLOW),
    (grpc.StatusCode.UNKNOWN, "Unexpected <class 'KeyError'>", 0.1, Verdict.ERROR),
    (grpc.StatusCode.INTERNAL, "internal error: KeyError: 'x'", 0.1, Verdict.ERROR),
    (grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!", 0.1, Verdict.ERROR),
    (grpc.StatusCode.INVALID_ARGUMENT, "two\nlines", 0.1, Verdict.ERROR),
    (grpc.StatusCode.INVALID_ARGUMENT, "", 0.1, Verdict.ERROR),
    (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", 3 * DEADLINE_S, Verdict.HANG),
])
def test_judge(code: grpc.StatusCode, details: str, elapsed: float, verdict: Verdict) -> None:
    got = judge(RPC, CallResult(code, details, [b""] if code is grpc.StatusCode.OK else [], elapsed),
                DEADLINE_S, DEADLINE_S)
    assert got.verdict is verdict, got


def test_a_reply_that_does_not_parse_is_caught() -> None:
    got = judge(RPC, CallResult(grpc.StatusCode.OK, "", [b"\xff\xff"], 0.1), DEADLINE_S, DEADLINE_S)
    assert got == Judgement(Verdict.BAD_RESPONSE, got.reason) and "does not parse" in got.reason


def _boom(request: bytes, context: grpc.ServicerContext) -> bytes:
    raise KeyError("unhandled")


def _stream(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
    yield b""
    raise ValueError("unhandled, mid-stream")


def test_invoke_sends_raw_bytes_and_an_unhandled_exception_is_an_error() -> None:
    """A real (sync) gRPC server whose handlers take raw bytes and fail: both kinds of call report it."""
    handlers = {"Call": grpc.unary_unary_rpc_method_handler(_boom),
                "Watch": grpc.unary_stream_rpc_method_handler(_stream)}
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("fuzz.selftest.Everywhere", handlers)])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with open_channel(f"127.0.0.1:{port}") as channel:
            for rpc in discover({"selftest": synthetic_file()}):
                result = invoke(channel, rpc, b"\xff\xfe not protobuf", DEADLINE_S * 10)
                assert result.code is grpc.StatusCode.UNKNOWN, result
                assert judge(rpc, result, DEADLINE_S * 10, DEADLINE_S).verdict is Verdict.ERROR
    finally:
        server.stop(None)


# ---- the short run against the three services ---------------------------------------------------


@pytest.fixture(scope="module")
def short_run(tmp_path_factory: pytest.TempPathFactory) -> Report:
    options = FuzzOptions(workdir=Path(tmp_path_factory.mktemp("fuzz")), cases=SHORT_CASES,
                          seconds_per_rpc=SHORT_SECONDS_PER_RPC, seed=int(os.environ.get(SEED_ENV, SHORT_SEED)))
    return run_fuzz(options)


def _explain(report: Report) -> str:
    return f"seed {report.seed} (python -m tests.fuzz.run --seed {report.seed})\n{text_table(report)}"


def test_short_run_fuzzes_every_rpc(short_run: Report) -> None:
    fuzzed = {t.rpc: t.cases for t in short_run.tallies}
    assert set(fuzzed) == {r.name for r in discover()}, _explain(short_run)
    assert min(fuzzed.values()) >= MIN_CASES, _explain(short_run)


def test_short_run_nothing_crashes_hangs_or_fails_unhandled(short_run: Report) -> None:
    summary = to_json(short_run)["summary"]
    assert (summary["crashes"], summary["hangs"], summary["errors"]) == (0, 0, 0), _explain(short_run)
    assert all(t.failed == 0 for t in short_run.tallies), _explain(short_run)
    assert short_run.restarts == 0, _explain(short_run)


def test_short_run_services_answer_normally_afterwards(short_run: Report) -> None:
    assert short_run.probes and all(p.ok for p in short_run.probes), _explain(short_run)


def test_short_run_gets_past_validation_and_refuses_many_classes(short_run: Report) -> None:
    """Deep enough: the retriever and the draft cache answered some fuzz cases OK, and many bad-input
    classes were refused."""
    answered = {t.service for t in short_run.tallies if t.verdicts[Verdict.OK.value]}
    assert {"retriever", "draftcache"} <= answered, _explain(short_run)  # the generator's many checks: see make fuzz
    summary = to_json(short_run)["summary"]
    assert summary["bad_input_classes_refused"] >= len(WIRE_CLASSES), _explain(short_run)


# ---- the same with API keys required: the auth interceptor is fuzzed with the bodies --------------
AUTH_CASES = 30  # cases per RPC in the short run with auth (every tenth+ sends a bad credential)
AUTH_SECONDS_PER_RPC = 5.0


def test_credential_cycle_sends_the_key_mostly_and_each_bad_variant() -> None:
    variants = [credential(n, "k3y")[0] for n in range(len(CYCLE))]
    assert variants.count(KEY) > len(CYCLE) // 2  # most cases reach the servicers
    assert {"none", "unknown-key", "malformed", "basic-scheme"} <= set(variants)
    assert credential(0, "k3y")[1] == (("authorization", "Bearer k3y"),)
    assert credential(CYCLE.index("none"), "k3y")[1] == ()
    assert credential(7, "") == ("", ())  # auth off: nothing is sent
    assert auth_class(KEY) == auth_class("") == frozenset()


@pytest.fixture(scope="module")
def auth_run(tmp_path_factory: pytest.TempPathFactory) -> Report:
    options = FuzzOptions(workdir=Path(tmp_path_factory.mktemp("fuzz-auth")), cases=AUTH_CASES,
                          seconds_per_rpc=AUTH_SECONDS_PER_RPC, seed=int(os.environ.get(SEED_ENV, SHORT_SEED)),
                          server_args=["--auth"])
    return run_fuzz(options)


def test_auth_run_nothing_fails_and_no_bad_credential_gets_through(auth_run: Report) -> None:
    summary = to_json(auth_run)["summary"]
    assert (summary["crashes"], summary["hangs"], summary["errors"]) == (0, 0, 0), _explain(auth_run)
    assert auth_run.probes and all(p.ok for p in auth_run.probes), _explain(auth_run)  # with the key: served
    classes = class_summary(auth_run.tallies)
    for variant in ("none", "unknown-key", "malformed", "basic-scheme"):
        counts = classes.get(f"auth:{variant}", {})
        assert counts.get("tried", 0) >= len(auth_run.tallies), (variant, _explain(auth_run))  # every RPC tried it
        assert counts.get(Verdict.OK.value, 0) == 0, (variant, _explain(auth_run))  # and none got through
    answered = {t.service for t in auth_run.tallies if t.verdicts[Verdict.OK.value]}
    assert {"retriever", "draftcache"} <= answered, _explain(auth_run)  # the key's cases reach the servicers
