"""The served model, in one place (the [model] table, env ``LAR_MODEL_*``).

The generator decodes with it and the retriever builds prompts with its tokenizer and chat
template, so both read this one section; two services started with different models refuse each
other (at start-up, or on the call with FAILED_PRECONDITION), never silently.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from lookahead_core.defaults import DEFAULT_MODEL
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from lookahead_rag.services.common.settings import ServiceSettings

DEVICE_PATTERN = r"^(cpu|cuda(:\d+)?)$"  # torch device strings the generator accepts
Dtype = Literal["float32", "bfloat16", "float16"]


class ModelSettings(ServiceSettings):
    """Which model is served, on which device and in which precision."""

    model_config = SettingsConfigDict(env_prefix="LAR_MODEL_")
    section: ClassVar[str] = "model"

    name: str = Field(DEFAULT_MODEL, description="served model: built-in name (`lookahead-rag models list`), "
                      "a .gguf file (converted once), a directory or a hub id")
    device: str = Field("cpu", pattern=DEVICE_PATTERN, description="where the generator runs it: cpu, cuda or cuda:N")
    dtype: Dtype = Field("float32", description="weights and activations: float32, bfloat16 or float16")
