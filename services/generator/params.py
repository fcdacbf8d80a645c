"""A request's GenerationParams (services.generator.domain) -> its DecodingConfig, checked (one-line
InvalidArgument on bad input); the server's default DecodingConfig from its settings."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from lookahead_core import DecodingConfig, DraftMode, TrieConfig, parse_mode

from lookahead_rag.services.common.auth.settings import ALL_TENANTS
from lookahead_rag.services.common.errors import InvalidArgument
from lookahead_rag.services.common.rules.limits import RequestLimits
from lookahead_rag.services.generator.domain import GenerationParams
from lookahead_rag.services.generator.settings import GeneratorSettings


def _f32(value: float) -> float:
    """``value`` at the proto ``float``'s precision, as the decimal its sender wrote: 0.7 arrives over
    gRPC as 0.699999988 and is read as 0.7, and over HTTP as 0.7 and stays so (the same draws either
    way); past float32's range it is infinite (refused), as on the wire."""
    with np.errstate(over="ignore"):
        return float(str(np.float32(value)))


def _mode(params: GenerationParams, s: GeneratorSettings) -> DraftMode:
    """The request's mode (empty: the server's), parsed once."""
    try:
        return parse_mode(params.mode or s.mode)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None


def check_mode(params: GenerationParams, tenant: str, s: GeneratorSettings) -> None:
    """Refuse a mode the operator has not allowed ``tenant``: the server's default and ``none`` always are,
    others only as ``[generator] tenant_modes`` lists them for the tenant or for every tenant (``*``)."""
    mode = _mode(params, s)
    allowed = {parse_mode(s.mode), DraftMode.NONE}
    allowed |= {parse_mode(m) for m in (*s.tenant_modes.get(ALL_TENANTS, ()), *s.tenant_modes.get(tenant, ()))}
    if mode not in allowed:
        raise InvalidArgument(f"mode {mode.value!r} is not allowed for tenant {tenant!r} (allowed: "
                              f"{', '.join(sorted(m.value for m in allowed))}; [generator] tenant_modes)")


def sampling_fields(params: GenerationParams) -> dict[str, object]:
    """DecodingConfig's sampling fields from the request's params (0 = off / greedy / the model's).

    Refuses out-of-range values with a one-line InvalidArgument (NaN and infinities included).
    """
    temperature, top_p, min_p = _f32(params.temperature), _f32(params.top_p), _f32(params.min_p)
    penalty = _f32(params.repetition_penalty)
    if not (math.isfinite(temperature) and temperature >= 0):
        raise InvalidArgument(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature}")
    if not (0 <= top_p <= 1):
        raise InvalidArgument(f"top_p must be in (0, 1] (0 = off), got {top_p}")
    if not (0 <= min_p <= 1):
        raise InvalidArgument(f"min_p must be in [0, 1] (0 = off), got {min_p}")
    if not (math.isfinite(penalty) and penalty >= 0):
        raise InvalidArgument(f"repetition_penalty must be a finite number > 0 (0 = the model's), got {penalty}")
    return {
        "temperature": temperature,
        "top_p": top_p or 1.0,
        "top_k": params.top_k,
        "min_p": min_p,
        "repetition_penalty": penalty or None,
        "seed": params.seed,
    }


def server_config(s: GeneratorSettings, limits: RequestLimits) -> DecodingConfig:
    """The server's default decoding config, from ``[generator]`` and ``[limits]``."""
    return DecodingConfig(
        mode=parse_mode(s.mode), decoding_length=s.decoding_length, max_decoding_length=s.max_decoding_length,
        max_new_tokens=limits.default_max_new_tokens, trie=TrieConfig(branch_length=s.branch_length),
        jacobi_window=s.jacobi_window, jacobi_ngram=s.jacobi_ngram, jacobi_guesses=s.jacobi_guesses,
        draft_layers=s.draft_layers, draft_top_k=s.draft_top_k, draft_depth=s.draft_depth,
        mjsd_beams=s.mjsd_beams, mjsd_threshold=s.mjsd_threshold,
    )


def decoding_config(params: GenerationParams, base: DecodingConfig, s: GeneratorSettings,
                    limits: RequestLimits) -> DecodingConfig:
    """The request's decoding config: ``base`` (the server's) changed by ``params`` (0 / empty = the
    server default; temperature 0 = greedy); bad values raise a one-line InvalidArgument."""
    max_new = limits.resolve_max_new_tokens(params.max_new_tokens)
    mode = _mode(params, s)
    if len(params.stop) > limits.max_stop_strings:
        raise InvalidArgument(f"{len(params.stop)} stop strings; the limit is {limits.max_stop_strings}")
    if any(not stop for stop in params.stop):
        raise InvalidArgument("empty stop string")
    length = params.decoding_length or base.decoding_length
    if length > s.max_decoding_length:
        raise InvalidArgument(f"decoding_length {length} is over the limit of {s.max_decoding_length}")
    trie = base.trie
    if params.branch_length:
        if not 2 <= params.branch_length <= s.branch_length:
            raise InvalidArgument(f"branch_length must be in 2..{s.branch_length}")
        trie = TrieConfig(branch_length=params.branch_length, prompt_weight=trie.prompt_weight,
                          capacity=trie.capacity)
    sampling = sampling_fields(params)
    try:
        return replace(base, mode=mode, max_new_tokens=max_new, decoding_length=length,
                       stop_strings=tuple(params.stop), trie=trie, logprobs=params.logprobs,
                       top_logprobs=params.top_logprobs, **sampling)
    except ValueError as exc:  # DecodingConfig's own checks: a value the lines above let through
        raise InvalidArgument(str(exc)) from None
