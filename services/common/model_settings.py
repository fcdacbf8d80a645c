"""The served model, in one place (the [model] table, env ``LAR_MODEL_*``).

The generator decodes with it and the retriever builds prompts with its tokenizer and chat
template, so both read this one section; two services started with different models refuse each
other (at start-up, or on the call with FAILED_PRECONDITION), never silently.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, PrivateAttr, model_validator
from pydantic_settings import SettingsConfigDict

from lookahead_rag.services.common.model_choice import AUTO, Choice, Limits, best_model
from lookahead_rag.services.common.settings import ServiceSettings

DEVICE_PATTERN = r"^(cpu|cuda(:\d+)?)$"  # torch device strings the generator accepts
Dtype = Literal["float32", "bfloat16", "float16"]
Weights = Literal["file", "float32", "bfloat16", "int8", "int4"]  # lookahead_core.forward.quant.load.WEIGHTS
Activations = Literal["int8", "float32"]  # lookahead_core.forward.quant.qdot.ACTIVATIONS


class ModelSettings(ServiceSettings):
    """Which model is served, on which device and in which precision."""

    model_config = SettingsConfigDict(env_prefix="LAR_MODEL_")
    section: ClassVar[str] = "model"

    name: str = Field(AUTO, description="served model: built-in name (`lookahead-rag models list`), a .gguf file "
                      "(converted once), a directory, a hub id, or auto: the largest built-in on this machine "
                      "that it can run, its weights counted as served (the auto_* limits)")
    device: str = Field("cpu", pattern=DEVICE_PATTERN, description="where the generator runs it: cpu, cuda or cuda:N")
    dtype: Dtype = Field("float32", description="weights and activations: float32, bfloat16 or float16")
    # what the products run on: file = a GGUF's own blocks on a CPU (the block kernel), else dense as dtype says
    weights: Weights = Field("file", description="file (a GGUF's own quantized blocks, on a CPU), float32, "
                             "bfloat16, int8 (per-channel, from any source; torchao's off the CPU) or int4 "
                             "(torchao's, CUDA only)")
    # what quantized weights multiply: int8 = x rounded per block of 32, integer products (as llama.cpp), where
    # this CPU runs the AVX-512 VNNI kernel (else float32, one log line); float32 = each block de-quantized
    activations: Activations = Field("int8", description="quantized weights times: int8 (x per block of 32, "
                                     "integer products, AVX-512 VNNI where it runs) or float32")
    # auto: of the free memory, the most the model's working set may take
    auto_memory_share: float = Field(0.5, gt=0, le=1, description="auto: share of free memory the model may take")
    # auto: activations, the KV pool and the conversion on top of the weights' bytes
    auto_working_set_factor: float = Field(1.5, ge=1, description="auto: working set / the weights' bytes")
    # auto, on a CPU: the least estimated one-stream speed (2 cores, weights = file: the 0.5B, not the 1.5B)
    auto_min_tokens_per_s: float = Field(15.0, ge=0, description="auto, on a CPU: the least estimated tok/s "
                                         "of one stream (served bytes a token / the cores' read rate)")
    _auto_choice: Choice | None = PrivateAttr(None)  # what auto chose and why (None: a name was given)

    @model_validator(mode="after")
    def _resolve_auto(self) -> ModelSettings:
        """name = auto becomes the built-in it picks, so every reader (and every service) sees one name."""
        if self.name == AUTO:
            self._auto_choice = best_model(self.weights, self.dtype, self.device, self.limits())
            self.name = self._auto_choice.name
        return self

    @property
    def auto_choice(self) -> Choice | None:
        """What name = auto chose and why (``models list``; the demo fetches only for auto); None when named."""
        return self._auto_choice

    def limits(self) -> Limits:
        """The auto_* fields as the choice takes them."""
        return Limits(self.auto_memory_share, self.auto_working_set_factor, self.auto_min_tokens_per_s)
