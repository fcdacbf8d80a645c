"""Where one decoding step's verified tokens end: EOS, max_new_tokens or a stop string.

The step's tokens are scanned one at a time, in order, and the first event wins, exactly as if
they had been generated one per forward (``generate(stop_strings=...)`` semantics): so token ids,
text and finish reason never depend on how many tokens a step accepted.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

FinishReason = Literal["", "eos", "stop", "length"]  # "" while generation goes on

UTF8_MAX_BYTES = 4  # a character is at most 4 UTF-8 bytes and a byte-level token carries at least one
LOOKBACK_MARGIN = 8  # extra tokens decoded before a stop string's span (dropped leading space, split chars)


def eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """The tokens that end generation: the model's generation config first, else the tokenizer's."""
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return frozenset()
    return frozenset(eos if isinstance(eos, list) else [eos])


def stop_lookback(stop_strings: Sequence[str]) -> int:
    """Tokens of earlier output to decode with a step: enough to hold the longest stop string."""
    return UTF8_MAX_BYTES * max((len(s) for s in stop_strings), default=0) + LOOKBACK_MARGIN


def trim_step(
    output: Sequence[int],
    new: Sequence[int],
    eos: Collection[int],
    max_new_tokens: int,
    stop_strings: Sequence[str],
    decode: Callable[[list[int]], str],
) -> tuple[list[int], FinishReason]:
    """Keep ``new`` (a step's verified tokens after ``output``) up to the first finishing event.

    Per token, in order: an EOS token is kept and ends with "eos"; a token after which the text
    holds a stop string it did not hold before is kept and ends with "stop"; a token that brings
    the output to ``max_new_tokens`` ends with "length" (after the stop check, so a stop string
    completed by the last allowed token reads "stop"). Returns (kept tokens, reason).

    Stop strings are looked for in the decode of a bounded tail (``stop_lookback`` tokens of
    ``output`` plus the step), never of the whole output.
    """
    stops = [s for s in stop_strings if s]  # "" would match everywhere
    room = max_new_tokens - len(output)
    if room <= 0:
        return [], "length"
    window = list(output[max(0, len(output) - stop_lookback(stops)) :])
    before = decode(window) if stops else ""
    for i, token in enumerate(new):
        kept = list(new[: i + 1])
        if token in eos:
            return kept, "eos"
        if stops:
            window.append(token)
            text = decode(window)
            if any(s in text and s not in before for s in stops):
                return kept, "stop"
            before = text
        if i + 1 >= room:
            return kept, "length"
    return list(new), ""
