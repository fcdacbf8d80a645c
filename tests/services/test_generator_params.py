"""The generator's sampling parameters without a model: proto GenerationParams -> domain
GenerationParams (``convert.params_from_proto``) -> DecodingConfig (``sampling_fields``: 0 = off /
greedy / the model's, one-line refusals) and ``lookahead-rag ask``'s flags, request and seed line
(against a stand-in Generator on loopback); mode mjsd only by name."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from lookahead_core import DecodingConfig

from lookahead_rag.services.common.errors import InvalidArgument
from lookahead_rag.services.common.rules.limits import RequestLimits
from lookahead_rag.services.generator import ask
from lookahead_rag.services.generator.convert import params_from_proto
from lookahead_rag.services.generator.domain import GenerationParams
from lookahead_rag.services.generator.params import decoding_config, sampling_fields, server_config
from lookahead_rag.services.generator.settings import GeneratorSettings
from lookahead_rag.v1 import events_pb2, generator_pb2, generator_pb2_grpc

NAN, INF = float("nan"), float("inf")


def grpc_params(**fields: Any) -> GenerationParams:
    """The params a gRPC request with these GenerationParams fields carries to the engine."""
    return params_from_proto(generator_pb2.GenerationParams(**fields))


def test_all_zero_params_are_greedy_with_the_defaults() -> None:
    # an old client (no sampling fields) gets exactly DecodingConfig's defaults: greedy, nothing filtered
    got = DecodingConfig(**sampling_fields(grpc_params()))
    default = DecodingConfig()
    assert not got.sampling
    assert (got.temperature, got.top_p, got.top_k, got.min_p, got.repetition_penalty, got.seed) == (
        default.temperature, default.top_p, default.top_k, default.min_p, default.repetition_penalty, default.seed)
    assert got.top_p == 1.0 and got.repetition_penalty is None and got.seed is None


def test_values_map_to_the_decimals_the_client_wrote() -> None:
    # proto floats are float32: 0.7 travels as 0.699999988 and must be read back as 0.7, so a request
    # samples exactly as DecodingConfig(temperature=0.7, ...) does in Python
    fields = sampling_fields(grpc_params(temperature=0.7, top_p=0.9, top_k=40, min_p=0.05, repetition_penalty=1.1,
                                    seed=12345))
    assert fields == {"temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1,
                      "seed": 12345}
    assert DecodingConfig(**fields).sampling


def test_http_and_grpc_numbers_decode_alike() -> None:
    # the HTTP door hands the engine the JSON's float64 numbers, gRPC float32 ones: both are read at
    # float32 precision, so the same number samples the same answer; one past float32 is refused alike
    exact = GenerationParams(temperature=0.7, top_p=0.9, min_p=0.05, repetition_penalty=1.1)
    assert sampling_fields(exact) == sampling_fields(grpc_params(temperature=0.7, top_p=0.9, min_p=0.05,
                                                            repetition_penalty=1.1))
    with pytest.raises(InvalidArgument, match="finite"):
        sampling_fields(GenerationParams(temperature=1e40))


@pytest.mark.parametrize(("seed", "expected"), [
    (None, None),  # unset: the server picks a random seed
    (0, 0),  # zero is a seed like any other (optional field: presence, not value)
    (2**64 - 1, 2**64 - 1),  # the largest uint64
])
def test_seed_presence_not_value_decides(seed: int | None, expected: int | None) -> None:
    assert sampling_fields(grpc_params(temperature=1.0, seed=seed))["seed"] == expected


@pytest.mark.parametrize(("field", "value", "words"), [
    ("temperature", -0.5, ("temperature", ">= 0")),  # negative
    ("temperature", NAN, ("temperature", "nan")),  # NaN compares false with everything: must still be refused
    ("temperature", INF, ("temperature", "finite")),  # infinite: not a distribution the model gives
    ("top_p", 1.5, ("top_p", "(0, 1]")),  # over 1
    ("top_p", -0.1, ("top_p",)),  # negative (0 means off, below is refused)
    ("top_p", NAN, ("top_p",)),  # NaN
    ("min_p", 1.01, ("min_p", "[0, 1]")),  # over 1
    ("min_p", -0.01, ("min_p",)),  # negative
    ("min_p", NAN, ("min_p",)),  # NaN
    ("repetition_penalty", -1.0, ("repetition_penalty", "> 0")),  # negative
    ("repetition_penalty", NAN, ("repetition_penalty",)),  # NaN
    ("repetition_penalty", INF, ("repetition_penalty",)),  # infinite
])
def test_out_of_range_values_are_refused_in_one_line(field: str, value: float, words: tuple[str, ...]) -> None:
    with pytest.raises(InvalidArgument) as caught:
        sampling_fields(grpc_params(**{field: value}))
    message = str(caught.value)
    assert "\n" not in message
    for word in words:
        assert word.lower() in message.lower(), (word, message)


# ---- lookahead-rag ask ------------------------------------------------------------------------------


def test_ask_flags_fill_the_request() -> None:
    # every sampling flag reaches its GenerationParams field
    _, req = ask.parse(["q?", "--tenant", "acme", "--temperature", "0.7", "--top-p", "0.9", "--top-k", "40",
                        "--min-p", "0.05", "--repetition-penalty", "1.1", "--seed", "7"])
    assert sampling_fields(params_from_proto(req.params)) == {
        "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1, "seed": 7}


def test_ask_without_sampling_flags_asks_for_greedy_and_no_seed() -> None:
    # no flags: temperature 0 (greedy) and the seed left unset, so the server picks one
    _, req = ask.parse(["q?", "--tenant", "acme"])
    assert req.params.temperature == 0 and not req.params.HasField("seed")
    _, zero = ask.parse(["q?", "--tenant", "acme", "--seed", "0"])  # --seed 0 is a seed, not "unset"
    assert zero.params.HasField("seed") and zero.params.seed == 0


@pytest.mark.parametrize("argv", [["--top-k", "-1"], ["--seed", "-1"], ["--seed", str(2**64)]])
def test_ask_refuses_flags_the_proto_cannot_carry(argv: list[str]) -> None:
    # negative or oversize unsigned values would fail inside protobuf with a traceback; argparse says why
    with pytest.raises(SystemExit):
        ask.parse(["q?", "--tenant", "acme", *argv])


class StandIn(generator_pb2_grpc.GeneratorServicer):
    """Answers every request with one delta and a final message carrying ``stats``; keeps the requests."""

    def __init__(self, stats: events_pb2.GenerationStats) -> None:
        self.stats = stats
        self.requests: list[generator_pb2.AnswerRequest] = []

    def Answer(self, request: generator_pb2.AnswerRequest, context: Any) -> Iterator[generator_pb2.AnswerChunk]:
        self.requests.append(request)
        yield generator_pb2.AnswerChunk(delta=generator_pb2.TextDelta(text="Use indent=2."))
        yield generator_pb2.AnswerChunk(final=generator_pb2.FinalInfo(answer_text="Use indent=2.", stats=self.stats))


def run_ask(stats: events_pb2.GenerationStats, *flags: str) -> tuple[int, StandIn]:
    standin = StandIn(stats)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    generator_pb2_grpc.add_GeneratorServicer_to_server(standin, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        rc = ask.main(["How?", "--tenant", "acme", "--target", f"127.0.0.1:{port}", "--timeout", "30", *flags])
    finally:
        server.stop(None)
    return rc, standin


def test_ask_prints_the_seed_of_a_sampled_answer(capsys: pytest.CaptureFixture[str]) -> None:
    # the seed the server used is printed, so the answer can be asked for again
    rc, standin = run_ask(events_pb2.GenerationStats(new_tokens=3, sampled=True, seed=987654321),
                          "--temperature", "0.8")
    assert rc == 0
    (req,) = standin.requests
    assert req.params.temperature == pytest.approx(0.8) and not req.params.HasField("seed")
    out = capsys.readouterr().out
    assert "Use indent=2." in out and "--seed 987654321" in out


def test_ask_prints_no_seed_for_a_greedy_answer(capsys: pytest.CaptureFixture[str]) -> None:
    # greedy answers need no seed to be reproduced: no seed line
    rc, _ = run_ask(events_pb2.GenerationStats(new_tokens=3, sampled=False, seed=0))
    assert rc == 0
    assert "seed" not in capsys.readouterr().out


# ---- mode mjsd: lossy, by name only -------------------------------------------------------------------


def test_mjsd_cannot_be_the_servers_default() -> None:
    # a lossy mode as the default would change every caller's answers without their asking
    with pytest.raises(ValueError, match="lossy"):
        GeneratorSettings(mode="mjsd")
    with pytest.raises(ValueError, match="unknown mode"):
        GeneratorSettings(mode="fastest")
    assert GeneratorSettings().mode == "hierarchical"


def test_a_request_gets_mjsd_only_by_name() -> None:
    s, limits = GeneratorSettings(), RequestLimits()
    base = server_config(s, limits)
    assert not decoding_config(grpc_params(), base, s, limits).lossy  # no mode: the lossless default
    asked = decoding_config(grpc_params(mode="mjsd"), base, s, limits)
    assert asked.lossy and asked.mjsd_beams == s.mjsd_beams and asked.mjsd_threshold == s.mjsd_threshold
    with pytest.raises(InvalidArgument, match="greedy only"):  # a sampled mjsd request: one-line refusal
        decoding_config(grpc_params(mode="mjsd", temperature=0.7), base, s, limits)


def test_ask_says_an_mjsd_answer_is_unverified(capsys: pytest.CaptureFixture[str]) -> None:
    rc, standin = run_ask(events_pb2.GenerationStats(new_tokens=3, unverified=True), "--mode", "mjsd")
    assert rc == 0 and standin.requests[0].params.mode == "mjsd"
    assert "may differ" in capsys.readouterr().out
    rc, _ = run_ask(events_pb2.GenerationStats(new_tokens=3))  # a lossless answer: no such line
    assert "may differ" not in capsys.readouterr().out
