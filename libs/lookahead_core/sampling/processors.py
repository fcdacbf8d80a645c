"""The logits processors of one request, built as transformers' ``generate`` would build them.

The request's ``DecodingConfig`` (temperature, top_p, top_k, min_p, repetition_penalty) is merged
over the model's ``generation_config`` (everything else: no_repeat_ngram_size, suppress_tokens,
min_new_tokens, ...), then the processors are listed in ``GenerationMixin._get_logits_processor``'s
order (transformers 5.x), reusing transformers' own classes:

    sequence_bias, repetition_penalty, no_repeat_ngram_size, bad_words_ids, min_length,
    min_new_tokens, forced_bos_token_id, forced_eos_token_id, remove_invalid_values,
    exponential_decay_length_penalty, suppress_tokens, begin_suppress_tokens,
    then, when sampling only (the former "warpers"):
    temperature, top_h, top_k, top_p, min_p, typical_p, epsilon_cutoff, eta_cutoff,
    and renormalize_logits last.

The EOS-bearing processors (min_length, min_new_tokens, bad words, decay penalty) read the
generation config's ``eos_token_id`` exactly as ``generate`` does: None means no EOS, so they are
left out. Settings ``generate`` would honour but a tree step cannot (classifier-free guidance,
encoder-side penalties, watermarking, beam search's processors) are refused, never ignored.
"""

from __future__ import annotations

import copy

import torch
from transformers import (
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    ExponentialDecayLengthPenalty,
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    GenerationConfig,
    InfNanRemoveLogitsProcessor,
    LogitNormalization,
    LogitsProcessorList,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    NoBadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    SuppressTokensAtBeginLogitsProcessor,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopHLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

from ..config import DecodingConfig

# Processors whose output row depends on that row's scores alone, never on the context
# (input_ids): they run over all of a step's nodes at once.
CONTEXT_FREE = (
    TemperatureLogitsWarper,
    TopHLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    MinPLogitsWarper,
    TypicalLogitsWarper,
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    SuppressTokensLogitsProcessor,
    InfNanRemoveLogitsProcessor,
    LogitNormalization,
)


class UnsupportedGenerationConfig(ValueError):
    """The model's generation_config asks for processing a lookahead tree step cannot reproduce."""


def merged_generation_config(base: GenerationConfig, config: DecodingConfig) -> GenerationConfig:
    """A copy of the model's generation config with the request's sampling fields over it.

    Temperature, top_k, top_p and min_p always come from the request (its defaults mean "off");
    repetition_penalty comes from the request unless it is None (then the model's, else 1.0).
    """
    g = copy.deepcopy(base)
    g.do_sample = config.sampling
    g.temperature = config.temperature if config.sampling else None
    g.top_k = config.top_k
    g.top_p = config.top_p
    g.min_p = config.min_p or None  # generate adds MinPLogitsWarper for any non-None min_p; 0 is off
    if config.repetition_penalty is not None:
        g.repetition_penalty = config.repetition_penalty
    return g


def _refuse_unsupported(g: GenerationConfig) -> None:
    refused = {
        "guidance_scale": g.guidance_scale is not None and g.guidance_scale != 1,
        "encoder_repetition_penalty": g.encoder_repetition_penalty not in (None, 1.0),
        "encoder_no_repeat_ngram_size": bool(g.encoder_no_repeat_ngram_size),
        "watermarking_config": g.watermarking_config is not None,
        "num_beams": g.num_beams is not None and g.num_beams > 1,
    }
    bad = [name for name, on in refused.items() if on]
    if bad:
        raise UnsupportedGenerationConfig(f"generation_config sets {', '.join(bad)}: lookahead cannot apply it")


def eos_tensor(g: GenerationConfig, device: torch.device | str) -> torch.Tensor | None:
    """The generation config's EOS ids as generate holds them ([n] long), or None."""
    eos = g.eos_token_id
    if eos is None:
        return None
    return torch.tensor(eos if isinstance(eos, list) else [eos], dtype=torch.long, device=device)  # [n]


def build_processors(
    base: GenerationConfig,
    config: DecodingConfig,
    prompt_len: int,
    device: torch.device | str = "cpu",
) -> LogitsProcessorList:
    """The request's processors, in generate's order (empty for plain greedy on a plain model).

    ``prompt_len``: tokens of the prompt (min_new_tokens and begin_suppress_tokens count from it).
    """
    g = merged_generation_config(base, config)
    _refuse_unsupported(g)
    eos = eos_tensor(g, device)
    dev = str(device)
    procs = LogitsProcessorList()
    if g.sequence_bias is not None:
        procs.append(SequenceBiasLogitsProcessor(sequence_bias=g.sequence_bias))
    if g.repetition_penalty is not None and g.repetition_penalty != 1.0:
        procs.append(RepetitionPenaltyLogitsProcessor(g.repetition_penalty))
    if g.no_repeat_ngram_size is not None and g.no_repeat_ngram_size > 0:
        procs.append(NoRepeatNGramLogitsProcessor(g.no_repeat_ngram_size))
    if g.bad_words_ids is not None:
        procs.append(NoBadWordsLogitsProcessor(g.bad_words_ids, eos))
    # generate turns min_new_tokens into min_length (prompt + min_new_tokens) and keeps both processors
    min_length = prompt_len + g.min_new_tokens if g.min_new_tokens is not None else g.min_length
    if min_length is not None and min_length > 0 and eos is not None:
        procs.append(MinLengthLogitsProcessor(min_length, eos, device=dev))
    if g.min_new_tokens is not None and g.min_new_tokens > 0 and eos is not None:
        procs.append(MinNewTokensLengthLogitsProcessor(prompt_len, g.min_new_tokens, eos, device=dev))
    if g.forced_bos_token_id is not None:
        procs.append(ForcedBOSTokenLogitsProcessor(g.forced_bos_token_id))
    if g.forced_eos_token_id is not None:  # generate's max_length: prompt + max_new_tokens
        procs.append(ForcedEOSTokenLogitsProcessor(prompt_len + config.max_new_tokens, g.forced_eos_token_id, dev))
    if g.remove_invalid_values:
        procs.append(InfNanRemoveLogitsProcessor())
    if g.exponential_decay_length_penalty is not None:
        procs.append(ExponentialDecayLengthPenalty(g.exponential_decay_length_penalty, eos, prompt_len))
    if g.suppress_tokens is not None:
        procs.append(SuppressTokensLogitsProcessor(g.suppress_tokens, device=dev))
    if g.begin_suppress_tokens is not None:
        begin = prompt_len if (prompt_len > 1 or g.forced_bos_token_id is None) else prompt_len + 1
        procs.append(SuppressTokensAtBeginLogitsProcessor(g.begin_suppress_tokens, begin, device=dev))
    if g.do_sample:
        procs.extend(_warpers(g, dev))
    if g.renormalize_logits:
        procs.append(LogitNormalization())
    return procs


def _warpers(g: GenerationConfig, device: str) -> LogitsProcessorList:
    """Sampling-only processors, in generate's order (min_tokens_to_keep 1: no beams)."""
    out = LogitsProcessorList()
    if g.temperature is not None and g.temperature != 1.0:
        out.append(TemperatureLogitsWarper(g.temperature))
    if g.top_h is not None:
        out.append(TopHLogitsWarper(top_h=g.top_h))
    if g.top_k is not None and g.top_k != 0:
        out.append(TopKLogitsWarper(top_k=g.top_k))
    if g.top_p is not None and g.top_p < 1.0:
        out.append(TopPLogitsWarper(top_p=g.top_p))
    if g.min_p is not None:
        out.append(MinPLogitsWarper(min_p=g.min_p))
    if g.typical_p is not None and g.typical_p < 1.0:
        out.append(TypicalLogitsWarper(mass=g.typical_p))
    if g.epsilon_cutoff is not None and 0.0 < g.epsilon_cutoff < 1.0:
        out.append(EpsilonLogitsWarper(epsilon=g.epsilon_cutoff))
    if g.eta_cutoff is not None and 0.0 < g.eta_cutoff < 1.0:
        out.append(EtaLogitsWarper(epsilon=g.eta_cutoff, device=device))
    return out
