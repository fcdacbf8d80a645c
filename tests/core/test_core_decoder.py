"""LookaheadDecoder API: stop strings, streaming text, limits, cancel, shared trie, failures, threads.

A tiny random llama with the real SmolLM2 vocabulary, so the text parts go through the real tokenizer.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

import pytest
from lookahead_core import DecodingConfig, DraftMode, TokenTrie
from lookahead_core.engine.decoder import LookaheadDecoder

from tests.core.helpers import MODES, eos_as, greedy, pfreq_table, text_model, tok
from tests.core.peek import contains_path, insert_branch

pytestmark = pytest.mark.usefixtures("one_thread")

MAX_NEW = 40
TEXTS = [
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "Serialize obj to a JSON formatted str. Serialize obj to a JSON",
    "naïve café, 東京 and 🙂: multi-byte text streams whole characters.",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):",
]


@functools.cache
def reference(idx: int) -> tuple[list[int], list[int]]:
    """(prompt ids, greedy output ids) of TEXTS[idx], fixed length."""
    prompt = tok().encode(TEXTS[idx])
    with eos_as(text_model(), None):
        return prompt, greedy(text_model(), prompt, MAX_NEW)


def decoder(config: DecodingConfig | None = None, **kw: object) -> LookaheadDecoder:
    with eos_as(text_model(), None):
        return LookaheadDecoder(text_model(), tok(), config or DecodingConfig(max_new_tokens=MAX_NEW), **kw)  # type: ignore[arg-type]


def decode(ids: list[int]) -> str:
    return tok().decode(ids, skip_special_tokens=True)


# ---- stop strings --------------------------------------------------------------------------------
def piece(ids: list[int], i: int) -> str:
    """Text of output token i (as it reads inside the whole text)."""
    return decode(ids[: i + 1])[len(decode(ids[:i])) :]


def _inside_token(ids: list[int]) -> list[str]:
    i = next(i for i in range(8, len(ids)) if len(piece(ids, i)) >= 4)
    return [piece(ids, i)[1:3]]


def _across_tokens(ids: list[int]) -> list[str]:
    i = next(i for i in range(12, len(ids) - 1) if len(piece(ids, i)) >= 2 and len(piece(ids, i + 1)) >= 2)
    return [piece(ids, i)[-2:] + piece(ids, i + 1)[:2]]


# name -> stop strings built from a greedy output's ids
STOP_CASES: dict[str, Callable[[list[int]], list[str]]] = {
    # the stop string sits inside one token: that token completes it, text after it is cut
    "inside-token": _inside_token,
    # the stop string spans two tokens: its first half must be held back until the second arrives
    "across-tokens": _across_tokens,
    # the very first (prefill) token completes the stop string
    "first-token": lambda ids: [piece(ids, 0).strip()[:2] or piece(ids, 0)],
    # a long stop string covering several tokens
    "long": lambda ids: [decode(ids)[30:50]],
    # two stop strings, the one listed second occurs first
    "two-stops": lambda ids: [piece(ids, 25)[-2:] + piece(ids, 26), piece(ids, 6)],
}


def stopped(ids: list[int], stops: list[str]) -> tuple[list[int], str]:
    """Expected (ids, text): the shortest prefix of ``ids`` whose text holds a stop, text cut before it."""
    for n in range(1, len(ids) + 1):
        text = decode(ids[:n])
        cuts = [text.find(s) for s in stops if s in text]
        if cuts:
            return ids[:n], text[: min(cuts)]
    raise AssertionError(f"no stop string of {stops} in the output")


STOP_RUNS = [(name, idx) for name in STOP_CASES for idx in range(2)]  # every case on TEXTS[0] and TEXTS[1]


def stop_run(name: str, idx: int) -> tuple[list[str], list[int], str, DecodingConfig, list[int]]:
    """(stop strings, expected ids, expected text, config, prompt) of STOP_CASES[name] on TEXTS[idx]."""
    prompt, ids = reference(idx)
    stops = STOP_CASES[name](ids)
    want_ids, want_text = stopped(ids, stops)
    return stops, want_ids, want_text, DecodingConfig(max_new_tokens=MAX_NEW, stop_strings=tuple(stops)), prompt


@pytest.mark.parametrize(("name", "idx"), STOP_RUNS)
def test_stop_strings_end_the_output_ids(name: str, idx: int) -> None:
    stops, want_ids, _, config, prompt = stop_run(name, idx)
    res = decoder().generate(prompt, config=config)
    assert res.output_ids == want_ids, stops
    assert res.stats.finish_reason == "stop"


def test_absent_stop_string_changes_nothing() -> None:
    prompt, ids = reference(0)
    res = decoder().generate(prompt, config=DecodingConfig(max_new_tokens=MAX_NEW, stop_strings=("\x00never",)))
    assert res.output_ids == ids and res.stats.finish_reason == "length"
    assert res.text == decode(ids)


@pytest.mark.parametrize(("name", "idx"), STOP_RUNS)
def test_generate_text_is_cut_before_the_stop_string(name: str, idx: int) -> None:
    stops, _, want_text, config, prompt = stop_run(name, idx)
    text = decoder().generate(prompt, config=config).text
    assert text == want_text, (stops, text)
    assert not any(s in text for s in stops)


@pytest.mark.parametrize(("name", "idx"), STOP_RUNS)
def test_stream_is_cut_before_the_stop_string(name: str, idx: int) -> None:
    stops, _, want_text, config, prompt = stop_run(name, idx)
    text = "".join(decoder().stream(prompt, config=config))
    assert text == want_text, (stops, text)


# ---- streaming -------------------------------------------------------------------------------------
@pytest.mark.parametrize("idx", range(len(TEXTS)))
@pytest.mark.parametrize("mode", MODES)
def test_stream_concatenates_to_the_result_text(mode: str, idx: int) -> None:
    dec = decoder(DecodingConfig(mode=DraftMode(mode), max_new_tokens=MAX_NEW))
    prompt, ids = reference(idx)
    chunks = list(dec.stream(prompt))
    res = dec.generate(prompt)
    assert res.output_ids == ids
    assert "".join(chunks) == res.text == decode(ids)
    assert all(chunks), "no empty chunks"


# ---- limits, cancel, errors --------------------------------------------------------------------------
@pytest.mark.parametrize("max_new", [1, 2, 3, 17])
def test_max_new_tokens_is_exact(max_new: int) -> None:
    prompt, ids = reference(0)
    res = decoder().generate(prompt, config=DecodingConfig(max_new_tokens=max_new))
    assert res.output_ids == ids[:max_new]
    assert res.stats.finish_reason == "length"
    if max_new == 1:
        assert res.stats.forward_steps == 0  # the prefill alone gives the one token


def test_eos_stops_and_is_emitted() -> None:
    prompt, ids = reference(1)
    model = text_model()
    eos = ids[len(ids) // 2]
    with eos_as(model, eos):
        want = greedy(model, prompt, MAX_NEW)
        dec = LookaheadDecoder(model, tok(), DecodingConfig(max_new_tokens=MAX_NEW))
    res = dec.generate(prompt)
    assert res.output_ids == want and res.output_ids[-1] == eos
    assert res.stats.finish_reason == "eos"


def test_should_stop_cancels_between_steps() -> None:
    prompt, ids = reference(0)
    polls = 0

    def stop() -> bool:
        nonlocal polls
        polls += 1
        return polls > 2

    res = decoder().generate(prompt, should_stop=stop)
    assert res.stats.finish_reason == "cancelled"
    assert res.stats.forward_steps == 2
    assert res.output_ids == ids[: len(res.output_ids)]


def test_empty_prompt_is_refused() -> None:
    with pytest.raises(ValueError):
        decoder().generate([])


class Boom(RuntimeError):
    pass


def test_failed_forward_propagates_and_releases_the_request() -> None:
    """A forward raising in layer 1 (layer 0 already grew): the error surfaces, prompt branches go."""
    prompt, ids = reference(0)
    trie = TokenTrie()
    dec = decoder(trie=trie, kernels="stock")
    calls = 0

    def boom(*_: object) -> None:
        nonlocal calls
        calls += 1
        if calls == 4:  # prefill, two verification forwards, then this one fails
            raise Boom

    hook = dec.kernels.runner(1).model.layers[1].register_forward_pre_hook(boom)
    try:
        with pytest.raises(Boom):
            dec.generate(prompt)
    finally:
        hook.remove()
    assert pfreq_table(trie) == {}  # the request's prompt branches were removed
    assert dec.generate(prompt).output_ids == ids  # and the decoder still works


# ---- shared trie ---------------------------------------------------------------------------------------
def test_shared_trie_keeps_outputs_not_prompts() -> None:
    prompt, ids = reference(3)
    trie = TokenTrie()
    dec = decoder(trie=trie)
    first = dec.generate(prompt)
    assert first.output_ids == ids
    assert pfreq_table(trie) == {}
    assert trie.outputs_inserted == 1
    assert contains_path(trie, ids[:8]) and contains_path(trie, ids[-5:])
    # the output went in after the prompt's last extend_min_match - 1 tokens: asked again, the answer's
    # first token and the prompt's tail match it, long enough to copy from the first decode step
    lead = prompt[1 - DecodingConfig().extend_min_match :]
    assert contains_path(trie, [*lead, *ids[:8]])
    second = dec.generate(prompt)  # the same question again: its own past answer is the draft
    assert second.output_ids == ids
    assert second.stats.mean_accepted_per_step > 3
    assert second.stats.forward_steps < first.stats.forward_steps


def test_insert_output_false_leaves_the_trie_empty() -> None:
    prompt, ids = reference(3)
    trie = TokenTrie()
    res = decoder(DecodingConfig(max_new_tokens=MAX_NEW, insert_output=False), trie=trie).generate(prompt)
    assert res.output_ids == ids
    assert trie.node_count == 0


def test_branches_from_a_draft_cache_are_used() -> None:
    prompt, ids = reference(2)
    dec = decoder()
    plain = dec.generate(prompt)
    # what a tenant's draft cache returns: branches of a past answer (from every start, as inserted),
    # put into the trie the request decodes with as output branches
    branches = [(prompt[-1:] + ids[:30], 1)] + [(ids[i : i + 30], 1) for i in range(len(ids))]
    trie = TokenTrie()
    for branch, count in branches:
        insert_branch(trie, branch, count)
    fed = dec.generate(prompt, trie=trie)
    assert fed.output_ids == plain.output_ids == ids
    assert fed.stats.forward_steps < plain.stats.forward_steps


def test_threads_share_one_decoder_and_trie() -> None:
    trie = TokenTrie()
    dec = decoder(trie=trie)
    results: dict[tuple[int, int], list[int]] = {}
    errors: list[BaseException] = []
    want = {idx: reference(idx) for idx in range(len(TEXTS))}

    def work(worker: int) -> None:
        try:
            for round_ in range(2):
                for idx in range(len(TEXTS)):
                    results[(worker, round_ * 10 + idx)] = dec.generate(want[idx][0]).output_ids
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(results) == 2 * 2 * len(TEXTS)
    for (_, key), out in results.items():
        assert out == want[key % 10][1], key
    assert pfreq_table(trie) == {}  # every request removed its own prompt branches
