"""The model is driven through transformers' current API, on the versions the tests cover."""

from __future__ import annotations

import inspect
import re
import tomllib
import warnings
from importlib.metadata import version
from pathlib import Path

from packaging.requirements import Requirement
from transformers.models.llama.modeling_llama import LlamaForCausalLM
from transformers.utils.deprecation import deprecate_kwarg

REPO = Path(__file__).resolve().parents[2]
CODE = [REPO / "libs", REPO / "services", REPO / "bench"]


def pinned_transformers() -> Requirement:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(Requirement(d) for d in deps if Requirement(d).name == "transformers")


def test_the_installed_transformers_is_inside_the_pinned_range() -> None:
    # the suite runs on a version the pin admits, so the pin names what was tested
    assert pinned_transformers().specifier.contains(version("transformers"))


def test_the_model_forward_takes_the_cache_argument() -> None:
    # `cache` is the argument our code passes the KV cache as; a transformers without it would be refused by the pin
    assert "cache" in inspect.signature(LlamaForCausalLM.forward).parameters


def test_no_code_passes_the_deprecated_past_key_values() -> None:
    # a keyword spelled the old way anywhere in the library, the services or the benchmarks
    offenders = [str(p.relative_to(REPO)) for root in CODE for p in root.rglob("*.py")
                 if "past_key_values=" in p.read_text()]
    assert offenders == []


def test_the_pytest_filter_catches_transformers_deprecation_warning() -> None:
    # the pyproject filter turns the very warning transformers emits for the old keyword into a test failure
    (rule,) = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["filterwarnings"]
    action, pattern, category = rule.split(":")[:3]

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(cache: object = None) -> object:
        return cache

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert forward(past_key_values=1) == 1  # the old keyword still reaches the new argument, with a warning
    (warning,) = seen
    assert action == "error" and re.match(pattern, str(warning.message)) and category == warning.category.__name__
