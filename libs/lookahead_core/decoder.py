"""The decoding loop: draft from the trie, verify the tree in one forward, keep the accepted path."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from .calibration import decoder_kernels
from .chooser import TokenChooser, resolve_seed
from .config import DecodingConfig, DraftMode
from .detok import TextStreamer
from .draft import Drafter, DraftTree, retrieve_draft
from .draft_model import DraftModelProposer, DraftModels, merge_into, proposer_for, trie_is_weak
from .finish import eos_ids, trim_step
from .jacobi_branch import JacobiBranch, branch_for, resolve_window
from .kernels import KernelSet
from .kvcache import compact_cache, rollback_cache
from .mjsd_model import MjsdProposer, mjsd_for
from .observer import StepObserver
from .stats import GenerationStats
from .support import check_supported
from .tree_inputs import build_tree_inputs
from .trie import OutputCursor, TokenTrie
from .verify import accept_longest


@dataclass
class GenerationResult:
    """Token ids (without the prompt), their text and the stats."""

    output_ids: list[int]
    text: str
    stats: GenerationStats


class LookaheadDecoder:
    """Lossless lookahead decoding over any Hugging Face causal LM.

    Greedy output is token-for-token that of ``model.generate(do_sample=False)`` (the model's
    generation_config processors included); sampled output is that of ``sampling.generate_sampled``
    with the same seed, in every draft mode (chooser.py). Concurrency:
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
        draft_model: PreTrainedModel | None = None,
    ) -> None:
        check_supported(model)  # refuse attention the tree mask would get wrong (support.py)
        self.model = model
        # Twins the loop runs, one per forward size (kernels.py): "auto" times stock vs packed once per
        # process, "stock" / "packed" force one; a KernelSet is used as given (shared, calibrated).
        self.kernels = kernels if isinstance(kernels, KernelSet) else decoder_kernels(model, kernels)
        self.tokenizer = tokenizer
        self.config = config or DecodingConfig()
        self.trie = trie  # shared trie (outputs accumulate); None = a fresh trie per request
        self.drafts = DraftModels(model, draft_model)  # mode draft-model: the given draft, else self-drafts
        self.eos = eos_ids(model, tokenizer)
        # Read once, like the EOS: requests build their processors from this copy (processors.py).
        self.generation_config = copy.deepcopy(model.generation_config)
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
        should_stop: Callable[[], bool] | None = None,
        drafter: Drafter | None = None,
        observer: StepObserver | None = None,
    ) -> DecodeRun:
        """A run that yields the token ids verified by each forward.

        ``references`` (token id lists: retrieved documents, past answers) are inserted like the
        prompt; ``should_stop`` is polled once per step (client cancel, deadline); ``drafter``
        replaces trie drafting (tests feed adversarial trees through it); ``observer`` sees every
        verified tree and its accepted path (benchmarks).
        """
        return DecodeRun(
            self, list(prompt_ids), config or self.config, trie, references, should_stop, drafter, observer
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
        should_stop: Callable[[], bool] | None,
        drafter: Drafter | None,
        observer: StepObserver | None,
    ) -> None:
        if not prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        self.decoder = decoder
        curve = decoder.kernels.curve
        self.config = config = resolve_window(config, curve.cost if curve is not None else None)
        self.prompt_ids = prompt_ids
        self.trie = trie or decoder.trie or TokenTrie(config.trie)
        self.references = references
        self.should_stop = should_stop
        self.drafter = drafter
        self.observer = observer
        self.stats = GenerationStats(sampled=config.sampling, seed=resolve_seed(config), unverified=config.lossy)
        self.chooser = TokenChooser.for_request(
            decoder.generation_config, config, len(prompt_ids), self.stats.seed, decoder.device
        )
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
        runner = self.decoder.kernels.runner(inputs["input_ids"].shape[-1])  # input_ids: [1, q]
        try:
            return runner(past_key_values=cache, use_cache=True, **inputs).logits
        except BaseException:
            rollback_cache(cache, past_len)
            raise

    def _trim_step_tokens(self, new: list[int]) -> list[int]:
        """Trim a step's tokens at EOS / max_new_tokens / stop strings and set finish_reason."""
        cfg, tok = self.config, self.decoder.tokenizer

        def decode(ids: list[int]) -> str:
            return tok.decode(ids, skip_special_tokens=True)

        # The first event in token order wins, so the step size never changes the result (finish.py).
        new, self.stats.finish_reason = trim_step(
            self.output, new, self.decoder.eos, cfg.max_new_tokens, cfg.stop_strings, decode
        )
        return new

    def _run(self) -> Iterator[list[int]]:
        cfg, dec, stats = self.config, self.decoder, self.stats
        owner = f"req-{uuid.uuid4().hex}"
        trie = self.trie
        trie.insert_prompt(self.prompt_ids, owner)
        for ref in self.references:
            trie.insert_prompt(list(ref), owner)
        cursor = trie.output_cursor() if cfg.insert_output else None
        cache = DynamicCache()
        try:
            with torch.inference_mode():
                ids = torch.tensor([self.prompt_ids], dtype=torch.long, device=dec.device)  # [1, prompt]
                logits = self._forward(cache, 0, input_ids=ids, logits_to_keep=1)  # [1, 1, vocab]
                first = self.chooser.choose(logits[0, -1:], self.prompt_ids, position=0)[0]
                past_len = len(self.prompt_ids)
                new = self._trim_step_tokens([first])
                yield from self._emit(new, cursor)
                branch = self._jacobi_branch()
                proposer = None if self.drafter is not None else proposer_for(cfg, dec.drafts)
                beams = None if self.drafter is not None else mjsd_for(cfg, dec.drafts)
                while not stats.finish_reason:
                    if self.should_stop is not None and self.should_stop():
                        stats.finish_reason = "cancelled"
                        break
                    root = self.output[-1]
                    tree = self._draft() if beams is None else self._beams(beams)
                    if proposer is not None:
                        self._model_draft(proposer, tree)
                    if branch is not None:
                        branch.draft(tree, root, cfg.max_new_tokens - len(self.output) - 1, cfg.decoding_length)
                    inputs = build_tree_inputs(tree, root, past_len, dec.dtype, dec.device)
                    q = len(tree) + 1  # the tree's rows come first; the branch's (if any) after them
                    if branch is not None:
                        inputs = branch.extend(inputs, tree.parents, past_len)
                    logits = self._forward(
                        cache,
                        past_len,
                        input_ids=inputs.input_ids,
                        position_ids=inputs.position_ids,
                        attention_mask=inputs.attention_mask,
                    )  # logits: [1, q (+ L branch tokens), vocab]
                    predicted = self.chooser.choose(
                        logits[0, :q], self.prompt_ids + self.output, tree.parents, tree.tokens, len(self.output)
                    )  # [q]: the choice after every node
                    if beams is None:
                        path = accept_longest(tree.tokens, tree.parents, predicted)
                    else:  # lossy: joint likelihood (mjsd.py)
                        path = beams.accept(logits[0, :q], tree)
                    compact_cache(cache, past_len, path)  # the branch's entries go too: never on a path
                    if branch is not None:
                        branch.harvest(logits[0, branch.last_row(q)].argmax(dim=-1).tolist())  # [W] guesses
                    past_len += len(path)
                    stats.forward_steps += 1
                    stats.draft_tokens += len(tree)
                    if self.observer is not None:
                        self.observer.on_step(tree, tuple(path[1:]))
                    new = [tree.tokens[i - 1] for i in path[1:]] + [predicted[path[-1]]]
                    new = self._trim_step_tokens(new)
                    stats.accepted_per_step.append(len(new))
                    yield from self._emit(new, cursor)
        finally:
            trie.remove_owner(owner)
            if cursor is not None:
                cursor.close()
            self.done = True
            stats.new_tokens = len(self.output)

    def _emit(self, new: list[int], cursor: OutputCursor | None) -> Iterator[list[int]]:
        self.output.extend(new)
        if cursor is not None:
            cursor.feed(new)
        if self.stats.finish_reason:
            self.done = True
        if new:
            yield new

    def _jacobi_branch(self) -> JacobiBranch | None:
        """The request's lookahead branch: mode jacobi, or hierarchical with ``jacobi_window`` > 0."""
        if self.drafter is not None:  # tests' drafters stand alone
            return None
        return branch_for(self.config, self.prompt_ids + self.output, self.decoder.eos)

    def _model_draft(self, proposer: DraftModelProposer, tree: DraftTree) -> None:
        """The draft model's tree merged below the trie's, within the decoding length, where the trie is weak."""
        cfg = self.config
        if not trie_is_weak(tree, cfg.decoding_length, proposer.depth):
            return
        room = cfg.max_new_tokens - len(self.output) - 1
        extra = proposer.propose(self.prompt_ids + self.output, cfg.decoding_length - len(tree), room,
                                 self.decoder.eos)
        merge_into(tree, extra)

    def _beams(self, beams: MjsdProposer) -> DraftTree:
        """Mode mjsd's tree: the draft's beams (no trie), within the decoding length."""
        cfg = self.config
        room = cfg.max_new_tokens - len(self.output) - 1
        return beams.propose(self.prompt_ids + self.output, cfg.decoding_length, room, self.decoder.eos)

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
            self.trie, context, cfg, budget=cfg.decoding_length, max_depth=room, banned=self.decoder.eos
        )
