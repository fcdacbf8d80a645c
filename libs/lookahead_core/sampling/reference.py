"""The reference sampler: plain incremental decoding, one token per forward, no drafts.

Lookahead decoding with the same config (seed included) must give token-for-token this output, in
every draft mode and in the serving engine. It chooses with the same ``TokenChooser`` (processors
from the model's generation_config, keyed Gumbel noise by output position) and stops the same way
(``finish.trim_step``: EOS, max_new_tokens, stop strings). At temperature 0 it is greedy decoding
with the model's processors, i.e. ``model.generate(do_sample=False)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from ..config import DecodingConfig
from ..engine.finish import eos_ids, trim_step
from .chooser import TokenChooser, resolve_seed


def generate_sampled(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: Sequence[int],
    config: DecodingConfig,
) -> list[int]:
    """Output token ids (prompt excluded) of one-token-per-forward decoding under ``config``.

    A sampling config without a seed draws a random one (then the output is not reproducible:
    give ``config.seed`` to compare runs).
    """
    prompt = list(prompt_ids)
    if not prompt:
        raise ValueError("prompt_ids must not be empty")
    device = next(model.parameters()).device
    chooser = TokenChooser.for_request(model.generation_config, config, len(prompt), resolve_seed(config), device)
    eos = eos_ids(model, tokenizer)

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)

    cache = DynamicCache()
    output: list[int] = []
    with torch.inference_mode():
        ids = torch.tensor([prompt], dtype=torch.long, device=device)  # [1, prompt]
        while True:
            out = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
            logits = out.logits  # [1, 1, vocab]
            token = chooser.choose(logits[0, -1:], prompt + output, position=len(output))[0]
            kept, reason = trim_step(output, [token], eos, config.max_new_tokens, config.stop_strings, decode)
            output.extend(kept)
            if reason:
                return output
            ids = torch.tensor([[token]], dtype=torch.long, device=device)  # [1, 1]
