"""--device and --dtype: every benchmark that loads a model parses them (bench/common.py's
``add_placement_args``) and hands them to ``load_model``. ``load_model`` is replaced by a recorder that
stops the run there: no model is loaded."""

from __future__ import annotations

import argparse
import importlib
from typing import Any

import pytest
import torch

from lookahead_rag.bench.cli import main as bench_main
from lookahead_rag.bench.common import add_placement_args, placement

# command -> the module whose ``load_model`` it calls (and that --device/--dtype must reach)
LOADERS = {
    "decoding": "lookahead_rag.bench.decoding",
    "draft-agreement": "lookahead_rag.bench.draft_agreement",
    "exactness": "lookahead_rag.bench.exactness",
    "logprobs": "lookahead_rag.bench.logprobs",
    "prompt-order": "lookahead_rag.bench.prompt_order",
    "serve": "lookahead_rag.bench.serve",
}


class Loaded(Exception):
    """Raised by the recorder in place of loading a model."""

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        super().__init__("load_model was reached")
        self.args, self.kwargs = args, kwargs


def record_load(*args: Any, **kwargs: Any) -> None:
    raise Loaded(args, kwargs)


@pytest.mark.parametrize("command", sorted(LOADERS))
def test_device_and_dtype_reach_load_model(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    module = importlib.import_module(LOADERS[command])
    monkeypatch.setattr(module, "load_model", record_load)
    if command == "serve":  # it would give torch one thread for the rest of this process
        monkeypatch.setattr(module, "serve_single_threaded", lambda: None)
    with pytest.raises(Loaded) as loaded:
        bench_main([command, "--model", "some-model", "--device", "cpu", "--dtype", "bfloat16", "--weights", "int8",
                    "--activations", "float32"])
    assert loaded.value.args == ("some-model",)
    assert loaded.value.kwargs == {"device": "cpu", "dtype": "bfloat16", "weights": "int8", "activations": "float32"}


@pytest.mark.parametrize("command", sorted(LOADERS))
def test_the_default_is_float32(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    module = importlib.import_module(LOADERS[command])
    monkeypatch.setattr(module, "load_model", record_load)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # serve's "auto" device: the CPU here
    if command == "serve":
        monkeypatch.setattr(module, "serve_single_threaded", lambda: None)
    with pytest.raises(Loaded) as loaded:
        bench_main([command])
    dense = {"device": "cpu", "dtype": "float32", "weights": "float32", "activations": "int8"}  # dense by default
    assert loaded.value.kwargs == dense


def test_an_unknown_dtype_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    p = argparse.ArgumentParser()
    add_placement_args(p)
    with pytest.raises(SystemExit):
        p.parse_args(["--dtype", "int8"])
    assert "--dtype" in capsys.readouterr().err


def test_auto_is_cuda_only_where_torch_sees_one(monkeypatch: pytest.MonkeyPatch) -> None:
    p = argparse.ArgumentParser()
    add_placement_args(p, "auto")
    args = p.parse_args(["--dtype", "float16"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    dense = {"weights": "float32", "activations": "int8"}  # --weights' and --activations' defaults
    assert placement(args) == {"device": "cuda", "dtype": "float16", **dense}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert placement(args) == {"device": "cpu", "dtype": "float16", **dense}
    assert placement(p.parse_args(["--device", "cuda:1"])) == {"device": "cuda:1", "dtype": "float32", **dense}
