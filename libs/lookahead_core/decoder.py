"""The decoding loop: draft from the trie, verify the tree in one forward, keep the accepted path."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from .calibration import decoder_kernels
from .config import DecodingConfig, DraftMode
from .detok import TextStreamer
from .draft import DraftTree, retrieve_draft
from .finish import trim_step
from .kernels import KernelSet
from .kvcache import compact_cache, rollback_cache
from .support import check_supported
from .tree_inputs import build_tree_inputs
from .trie import TokenTrie
from .verify import accept_longest


@dataclass
class GenerationStats:
    """What one generation cost and how well drafting worked."""

    new_tokens: int = 0  # tokens emitted (the first token from prefill included)
    forward_steps: int = 0  # verification forwards after prefill
    accepted_per_step: list[int] = field(default_factory=list)  # tokens emitted by each forward
    draft_tokens: int = 0  # draft tokens sent through the model
    accepted_paths: list[tuple[int, ...]] = field(default_factory=list)  # per step: flattened path indices
    prefill_s: float = 0.0  # prompt forward
    draft_s: float = 0.0  # building drafts (trie lookups)
    forward_s: float = 0.0  # verification forwards (tree inputs + model + argmax)
    cache_s: float = 0.0  # KV-cache compaction
    wall_s: float = 0.0  # whole generation
    finish_reason: str = ""  # "eos" | "stop" | "length" | "cancelled"

    @property
    def mean_accepted_per_step(self) -> float:
        """Tokens per verification forward (1.0 for plain greedy)."""
        steps = self.forward_steps
        return (sum(self.accepted_per_step) / steps) if steps else 0.0


@dataclass
class GenerationResult:
    """Token ids (without the prompt), their text and the stats."""

    output_ids: list[int]
    text: str
    stats: GenerationStats


# (full context ids, budget, max depth) -> draft tree; replaces trie drafting when given
Drafter = Callable[[list[int], int, int], DraftTree]


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return frozenset()
    return frozenset(eos if isinstance(eos, list) else [eos])


class LookaheadDecoder:
    """Lossless lookahead decoding over any Hugging Face causal LM.

    Greedy output is token-for-token that of ``model.generate(do_sample=False)``. Concurrency:
    one decoder may serve concurrent requests from several threads; each call has its own KV
    cache, and the shared trie (if any) guards every read and write with its own lock. The model
    is only read. Throughput does not scale on CPU (the threads share the cores).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        config: DecodingConfig | None = None,
        trie: TokenTrie | None = None,
        kernels: KernelSet | str = "auto",
    ) -> None:
        check_supported(model)  # refuse attention the tree mask would get wrong (support.py)
        self.model = model
        # Twins the loop runs, one per forward size (kernels.py): "auto" times stock vs packed once per
        # process, "stock" / "packed" force one; a KernelSet is used as given (shared, calibrated).
        self.kernels = kernels if isinstance(kernels, KernelSet) else decoder_kernels(model, kernels)
        self.tokenizer = tokenizer
        self.config = config or DecodingConfig()
        self.trie = trie  # shared trie (outputs accumulate); None = a fresh trie per request
        self.eos = _eos_ids(model, tokenizer)
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype

    # ------------------------------------------------------------------------------------------
    def generate(self, prompt_ids: Sequence[int], **kwargs: object) -> GenerationResult:
        """Decode to the end; see ``steps`` for the arguments."""
        run = self.steps(prompt_ids, **kwargs)  # type: ignore[arg-type]
        ids: list[int] = []
        for new in run:
            ids.extend(new)
        streamer = TextStreamer(self.tokenizer, run.config.stop_strings)
        text = streamer.push(ids) + streamer.finish()  # cut before a stop string
        return GenerationResult(ids, text, run.stats)

    def stream(self, prompt_ids: Sequence[int], **kwargs: object) -> Iterator[str]:
        """Yield text as tokens are verified: whole characters, never past a stop string."""
        run = self.steps(prompt_ids, **kwargs)  # type: ignore[arg-type]
        streamer = TextStreamer(self.tokenizer, run.config.stop_strings)
        for new in run:
            text = streamer.push(new)
            if text:
                yield text
        tail = streamer.finish()
        if tail:
            yield tail

    def steps(
        self,
        prompt_ids: Sequence[int],
        config: DecodingConfig | None = None,
        trie: TokenTrie | None = None,
        references: Sequence[Sequence[int]] = (),
        branches: Sequence[tuple[Sequence[int], int]] = (),
        should_stop: Callable[[], bool] | None = None,
        drafter: Drafter | None = None,
    ) -> DecodeRun:
        """A run that yields the token ids verified by each forward.

        ``references`` (token id lists: retrieved documents, past answers) are inserted like the
        prompt; ``branches`` are (ids, count) pairs from a tenant's draft cache inserted as
        output branches; ``should_stop`` is polled once per step (client cancel, deadline);
        ``drafter`` replaces trie drafting (tests feed adversarial trees through it).
        """
        return DecodeRun(
            self, list(prompt_ids), config or self.config, trie, references, branches, should_stop, drafter
        )


class DecodeRun:
    """One request's decoding loop, as an iterator of per-step token lists (see ``steps``)."""

    def __init__(
        self,
        decoder: LookaheadDecoder,
        prompt_ids: list[int],
        config: DecodingConfig,
        trie: TokenTrie | None,
        references: Sequence[Sequence[int]],
        branches: Sequence[tuple[Sequence[int], int]],
        should_stop: Callable[[], bool] | None,
        drafter: Drafter | None = None,
    ) -> None:
        if not prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        self.d = decoder
        self.config = config
        self.prompt_ids = prompt_ids
        self.trie = trie or decoder.trie or TokenTrie(config.trie)
        self.references = references
        self.branches = branches
        self.should_stop = should_stop
        self.drafter = drafter
        self.stats = GenerationStats()
        self.output: list[int] = []
        self.done = False
        self._iter = self._run()

    def __iter__(self) -> Iterator[list[int]]:
        return self

    def __next__(self) -> list[int]:
        return next(self._iter)

    # ------------------------------------------------------------------------------------------
    def _forward(self, cache: DynamicCache, past_len: int, **inputs: torch.Tensor) -> torch.Tensor:
        """One model forward (the kernels that win at its size); on failure the cache is cut back to ``past_len``."""
        runner = self.d.kernels.runner(inputs["input_ids"].shape[-1])  # input_ids: [1, q]
        try:
            return runner(past_key_values=cache, use_cache=True, **inputs).logits
        except BaseException:
            rollback_cache(cache, past_len)
            raise

    def _finish(self, new: list[int]) -> list[int]:
        """Trim a step's tokens at EOS / max_new_tokens / stop strings and set finish_reason."""
        cfg, tok = self.config, self.d.tokenizer

        def decode(ids: list[int]) -> str:
            return tok.decode(ids, skip_special_tokens=True)

        # The first event in token order wins, so the step size never changes the result (finish.py).
        new, self.stats.finish_reason = trim_step(
            self.output, new, self.d.eos, cfg.max_new_tokens, cfg.stop_strings, decode
        )
        return new

    def _run(self) -> Iterator[list[int]]:
        cfg, d, stats = self.config, self.d, self.stats
        start = time.perf_counter()
        owner = f"req-{uuid.uuid4().hex}"
        trie = self.trie
        trie.insert_prompt(self.prompt_ids, owner)
        for ref in self.references:
            trie.insert_prompt(list(ref), owner)
        for ids, count in self.branches:
            trie.insert_branch(list(ids), count)
        cursor = trie.output_cursor() if cfg.insert_output else None
        cache = DynamicCache()
        try:
            with torch.inference_mode():
                t0 = time.perf_counter()
                ids = torch.tensor([self.prompt_ids], dtype=torch.long, device=d.device)  # [1, prompt]
                logits = self._forward(cache, 0, input_ids=ids, logits_to_keep=1)  # [1, 1, vocab]
                first = int(logits[0, -1].argmax())
                stats.prefill_s = time.perf_counter() - t0
                past_len = len(self.prompt_ids)
                new = self._finish([first])
                yield from self._emit(new, cursor)
                while not stats.finish_reason:
                    if self.should_stop is not None and self.should_stop():
                        stats.finish_reason = "cancelled"
                        break
                    root = self.output[-1]
                    t0 = time.perf_counter()
                    tree = self._draft()
                    t1 = time.perf_counter()
                    inputs = build_tree_inputs(tree, root, past_len, d.dtype, d.device)
                    logits = self._forward(
                        cache,
                        past_len,
                        input_ids=inputs.input_ids,
                        position_ids=inputs.position_ids,
                        attention_mask=inputs.attention_mask,
                    )  # logits: [1, q, vocab]
                    predicted = logits[0].argmax(-1).tolist()  # [q]
                    path = accept_longest(tree.tokens, tree.parents, predicted)
                    t2 = time.perf_counter()
                    compact_cache(cache, past_len, path)
                    t3 = time.perf_counter()
                    past_len += len(path)
                    stats.draft_s += t1 - t0
                    stats.forward_s += t2 - t1
                    stats.cache_s += t3 - t2
                    stats.forward_steps += 1
                    stats.draft_tokens += len(tree)
                    # Best-first trees are prefixes of bigger ones, so a budget of D keeps the path's
                    # nodes with index <= D: lets a bench size the tree from one run.
                    stats.accepted_paths.append(tuple(path[1:]))
                    new = [tree.tokens[i - 1] for i in path[1:]] + [predicted[path[-1]]]
                    new = self._finish(new)
                    stats.accepted_per_step.append(len(new))
                    yield from self._emit(new, cursor)
        finally:
            trie.remove_owner(owner)
            if cursor is not None:
                cursor.close()
            self.done = True
            stats.new_tokens = len(self.output)
            stats.wall_s = time.perf_counter() - start

    def _emit(self, new: list[int], cursor: object) -> Iterator[list[int]]:
        self.output.extend(new)
        if cursor is not None:
            cursor.feed(new)  # type: ignore[attr-defined]
        if self.stats.finish_reason:
            self.done = True
        if new:
            yield new

    def _draft(self) -> DraftTree:
        cfg = self.config
        if cfg.mode is DraftMode.NONE:
            return DraftTree()
        # A step emits at most depth + 1 tokens: never draft past max_new_tokens.
        room = cfg.max_new_tokens - len(self.output) - 1
        context = self.prompt_ids[-cfg.max_match :] + self.output
        if self.drafter is not None:
            return self.drafter(self.prompt_ids + self.output, cfg.decoding_length, room)
        return retrieve_draft(
            self.trie, context, cfg, budget=cfg.decoding_length, max_depth=room, banned=self.d.eos
        )
