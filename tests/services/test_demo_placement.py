"""``lookahead-rag demo --device --dtype`` and ``[model] dtype``: both reach ``load_model``. The demo's
``load_model`` is replaced by a recorder that stops it there: no model is loaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lookahead_core.models
import lookahead_core.threads
import pytest

from lookahead_rag.services import demo
from lookahead_rag.services.common.settings import ConfigError
from lookahead_rag.services.config import AllSettings


class Loaded(Exception):
    """Raised by the recorder in place of loading a model."""

    def __init__(self, args: tuple[Any, ...]) -> None:
        super().__init__("load_model was reached")
        self.args = args


def record_load(*args: Any, **kwargs: Any) -> None:
    raise Loaded((*args, *kwargs.values()))


def test_the_flags_override_only_what_they_name() -> None:
    args = demo.parse_args(["--device", "cpu", "--dtype", "bfloat16"])
    assert demo.model_overrides(args) == {"device": "cpu", "dtype": "bfloat16"}
    assert demo.model_overrides(demo.parse_args([])) == {}  # [model]'s own, else the defaults
    with pytest.raises(SystemExit):
        demo.parse_args(["--dtype", "int8"])


def test_demo_device_and_dtype_reach_load_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lookahead_core.models, "load_model", record_load)
    monkeypatch.setattr(lookahead_core.threads, "serve_single_threaded", lambda: None)  # keep this process's threads
    with pytest.raises(Loaded) as loaded:
        demo.main(["--model", "some-model", "--device", "cpu", "--dtype", "bfloat16", "--no-baseline"])
    # [model] weights (the suite pins it) and activations (the default) too
    assert loaded.value.args == ("some-model", "bfloat16", "cpu", "float32", "int8")


def test_model_dtype_bfloat16_is_a_setting(tmp_path: Path) -> None:
    config = tmp_path / "lookahead.toml"
    config.write_text('[model]\ndevice = "cpu"\ndtype = "bfloat16"\n')
    served = AllSettings.load(config).model
    assert (served.device, served.dtype) == ("cpu", "bfloat16")
    config.write_text('[model]\ndtype = "int8"\n')
    with pytest.raises(ConfigError, match="dtype"):
        AllSettings.load(config)
