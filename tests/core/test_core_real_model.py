"""The real SmolLM2-135M-Instruct (fp32, CPU): every mode's output equals stock greedy on grounded prompts.

The prompts are built here from Python stdlib docstrings (the project must not need ../shared): a short
document plus a question about it, in the model's chat template.
"""

from __future__ import annotations

import base64
import bisect
import collections
import fnmatch
import functools
import heapq
import inspect
import itertools
import json
import math
import os
import pathlib
import re
import shutil
import statistics
import textwrap
from collections.abc import Callable

import pytest
from lookahead_core import DecodingConfig, DraftMode
from lookahead_core.detok import REPLACEMENT
from lookahead_core.engine.decoder import LookaheadDecoder
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tests.core.helpers import MODES, busy_engine, greedy, serve_mixed_modes

pytestmark = pytest.mark.slow

MAX_NEW = 40
DOC_CHARS = 600  # document length in the prompt (keeps prefill and CI time modest)
SYSTEM = "You answer questions about Python using only the documentation given."

# (object documented, question about it)
DOCUMENTED: list[tuple[Callable[..., object], str]] = [
    (json.dumps, "What does json.dumps return, and what does skipkeys do?"),
    (os.path.join, "How does os.path.join treat an absolute path component?"),
    (textwrap.dedent, "What does textwrap.dedent remove?"),
    (itertools.groupby, "What does itertools.groupby return?"),
    (functools.lru_cache, "What happens when maxsize is None in lru_cache?"),
    (collections.Counter, "What is a Counter? Give an example."),
    (re.sub, "What can the repl argument of re.sub be?"),
    (math.isclose, "What do rel_tol and abs_tol mean in math.isclose?"),
    (shutil.copyfile, "How does shutil.copyfile handle symlinks?"),
    (pathlib.PurePath.with_suffix, "What does with_suffix do if the path has no suffix?"),
    (heapq.merge, "What do the key and reverse arguments of heapq.merge do?"),
    (bisect.bisect_left, "Where does bisect_left insert x if x is already present?"),
    (str.split, "What happens when sep is not given to str.split?"),
    (str.join, "Which string is inserted between the pieces by str.join?"),
    (sorted, "What do the key and reverse arguments of sorted do?"),
    (zip, "What happens when strict is true and the inputs have different lengths?"),
    (os.makedirs, "What does exist_ok change in os.makedirs?"),
    (fnmatch.fnmatch, "Which shell-style patterns does fnmatch support?"),
    (base64.b64encode, "What does the altchars argument of b64encode do?"),
    (statistics.median, "How is the median computed when the number of data points is even?"),
]


def chat_ids(tok: PreTrainedTokenizerBase, document: str, question: str) -> list[int]:
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Documentation:\n{document}\n\nQuestion: {question}"},
    ]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if not isinstance(ids, list):  # transformers 5 returns a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)


def grounded_prompts(tok: PreTrainedTokenizerBase) -> list[list[int]]:
    out = []
    for obj, question in DOCUMENTED:
        doc = inspect.cleandoc(obj.__doc__ or "")[:DOC_CHARS]
        out.append(chat_ids(tok, f"{obj.__qualname__}\n{doc}", question))
    return out


@pytest.fixture(scope="module")
def prompts(smollm: tuple[PreTrainedModel, PreTrainedTokenizerBase]) -> list[list[int]]:
    return grounded_prompts(smollm[1])


@pytest.fixture(scope="module")
def reference(
    smollm: tuple[PreTrainedModel, PreTrainedTokenizerBase], prompts: list[list[int]]
) -> Callable[[int], list[int]]:
    """Stock greedy output of prompt i, computed once per prompt."""
    model = smollm[0]

    @functools.cache
    def ref(i: int) -> list[int]:
        return greedy(model, prompts[i], MAX_NEW)

    return ref


@pytest.fixture(scope="module")
def decoder(smollm: tuple[PreTrainedModel, PreTrainedTokenizerBase]) -> LookaheadDecoder:
    model, tok = smollm
    return LookaheadDecoder(model, tok, DecodingConfig(max_new_tokens=MAX_NEW))


def test_prompts_are_grounded_chat_prompts(
    smollm: tuple[PreTrainedModel, PreTrainedTokenizerBase], prompts: list[list[int]]
) -> None:
    tok = smollm[1]
    assert len(prompts) == 20
    assert len({tuple(p) for p in prompts}) == 20
    for prompt in prompts:
        text = tok.decode(prompt)
        assert "Documentation:" in text and "Question:" in text
        assert text.rstrip().endswith("assistant")  # the generation prompt is there
        assert 60 < len(prompt) < 400


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("idx", range(len(DOCUMENTED)))
def test_real_model_equals_greedy(
    idx: int,
    mode: str,
    decoder: LookaheadDecoder,
    prompts: list[list[int]],
    reference: Callable[[int], list[int]],
) -> None:
    want = reference(idx)
    res = decoder.generate(prompts[idx], config=DecodingConfig(mode=DraftMode(mode), max_new_tokens=MAX_NEW))
    assert res.output_ids == want
    assert len(res.output_ids) <= MAX_NEW
    assert res.stats.finish_reason in ("eos", "length")
    if mode == "none":
        assert res.stats.forward_steps == len(want) - 1


# the issue-13 draft sources on the real model: (mode, DecodingConfig overrides)
DRAFT_SOURCES = [
    ("jacobi", {}),  # the Jacobi window's n-gram pool alone (window from the measured cost, at least 1)
    ("hierarchical", {"jacobi_window": 4}),  # the trie's drafts and the pool, one forward
    ("draft-model", {}),  # the trie's tree merged with the self-draft's top-k tree
]


@pytest.mark.parametrize(("mode", "extra"), DRAFT_SOURCES, ids=["jacobi", "hierarchical+jacobi", "draft-model"])
@pytest.mark.parametrize("idx", range(len(DOCUMENTED)))
def test_real_model_draft_sources_equal_greedy(
    idx: int,
    mode: str,
    extra: dict[str, int],
    decoder: LookaheadDecoder,
    prompts: list[list[int]],
    reference: Callable[[int], list[int]],
) -> None:
    config = DecodingConfig(mode=DraftMode(mode), max_new_tokens=MAX_NEW, **extra)
    res = decoder.generate(prompts[idx], config=config)
    assert res.output_ids == reference(idx)
    if mode == "draft-model":
        assert res.stats.draft_tokens > 0  # the draft model proposes every step


@pytest.mark.parametrize("idx", [7])
def test_real_model_stock_kernels_equal_greedy(
    idx: int,
    smollm: tuple[PreTrainedModel, PreTrainedTokenizerBase],
    prompts: list[list[int]],
    reference: Callable[[int], list[int]],
) -> None:
    model, tok = smollm
    stock = LookaheadDecoder(model, tok, DecodingConfig(max_new_tokens=MAX_NEW), kernels="stock")
    assert stock.generate(prompts[idx]).output_ids == reference(idx)


@pytest.mark.parametrize(
    "question",
    [
        # a grounded question from the set above (ASCII answer)
        None,
        # asks for non-ASCII output: multi-byte characters must stream whole
        "Write the words café, naïve and 東京 in one short sentence.",
    ],
)
def test_real_model_stream(
    question: str | None,
    decoder: LookaheadDecoder,
    smollm: tuple[PreTrainedModel, PreTrainedTokenizerBase],
    prompts: list[list[int]],
    reference: Callable[[int], list[int]],
) -> None:
    tok = smollm[1]
    if question is None:
        prompt, want = prompts[3], reference(3)
    else:  # ids checked against greedy elsewhere: here only the text of the decoder's own ids
        prompt = chat_ids(tok, "Unicode text may contain accents and CJK characters.", question)
        want = decoder.generate(prompt).output_ids
    chunks = list(decoder.stream(prompt))
    text = "".join(chunks)
    assert text == tok.decode(want, skip_special_tokens=True)
    assert text.strip()
    assert REPLACEMENT not in text
    assert all(REPLACEMENT not in c for c in chunks)


def test_real_model_batched_scheduler_equals_greedy(
    smollm: tuple[PreTrainedModel, PreTrainedTokenizerBase],
    prompts: list[list[int]],
    reference: Callable[[int], list[int]],
) -> None:
    # all 20 prompts at once through the step scheduler (every mode, 8 running, chunked prefill, some
    # repeated so the prefix cache serves them): each answer is its own batch-1 greedy run
    sched = busy_engine(*smollm, calibration_counts=(1, 8, 64), calibration_repeats=1)
    order = [*range(len(prompts)), 3, 7]  # two repeats: prefix-cache hits
    reqs = serve_mixed_modes(sched, [prompts[i] for i in order], MAX_NEW)
    for i, req in zip(order, reqs, strict=True):
        assert req.output == reference(i), f"prompt {i} in mode {req.config.mode}"
    assert reqs[-1].stats.prefix_hit_tokens == len(prompts[7]) - 1
    state = sched.state()
    assert (state.waiting, state.running, state.kv_bytes) == (0, 0, 0)
