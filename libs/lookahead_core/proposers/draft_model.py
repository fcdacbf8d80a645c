"""Token trees from a draft model (SpecInfer, paper 002): top-k expansion per depth, the draft's own KV.

The draft is any causal LM with the target's vocabulary, or by default a self-draft: the target's own
first L decoder layers, its final norm and its LM head (``early_exit``), which needs no extra weights.

Each step (``DraftModelProposer.draft``, where the trie is weak; ``propose`` builds the tree):

1. **sync**: the draft's cache is rolled back to the longest prefix it shares with the accepted context
   (``rollback_cache``) and the context's missing tokens are fed, so its cache always follows the
   accepted path;
2. **expand**: at each depth the draft's ``top_k`` next tokens become children of the chain's tip; the
   top-1 child is fed to the draft and becomes the next tip (``depth`` levels, ``budget`` nodes at most).

Worked example (top_k=2, depth=2): the draft predicts (a, b) after the context and (c, d) after a: the
tree is a, b under the root and c, d under a. The target verifies it like any draft, so output stays
exactly plain greedy whatever the draft proposes.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from transformers import DynamicCache, PreTrainedModel

from ..drafting.draft import DraftTree
from ..kv.draft_kv import rollback_cache
from .base import Ask, Proposer

SELF_DRAFT_FRACTION = 4  # the self-draft exits after 1/4 of the target's layers unless told otherwise


HOOK_TABLES = ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs",
               "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called")  # torch.nn.Module's


def _shallow(module: torch.nn.Module) -> torch.nn.Module:
    """A copy sharing every parameter and submodule, with its own submodule table (so replacing one
    of its submodules leaves the original untouched) and no forward hooks (the original's hooks, such
    as a benchmark's forward counter, must not fire for the draft's calls)."""
    clone = copy.copy(module)
    clone._modules = module._modules.copy()
    for table in HOOK_TABLES:
        if hasattr(module, table):
            setattr(clone, table, type(getattr(module, table))())
    return clone


def early_exit(model: PreTrainedModel, layers: int) -> PreTrainedModel:
    """The target cut after its first ``layers`` decoder layers, keeping its final norm and LM head.

    Weights are shared, not copied; the target is not changed. Works for decoder-only models laid out as
    ``model.model.layers`` + ``model.model.norm`` + ``model.lm_head`` (llama, qwen2, mistral, ...).
    """
    inner = getattr(model, "model", None)
    blocks = getattr(inner, "layers", None)
    if inner is None or not isinstance(blocks, torch.nn.ModuleList) or not hasattr(inner, "norm"):
        raise ValueError(f"{type(model).__name__}: no model.layers / model.norm to exit early from")
    if not 1 <= layers <= len(blocks):
        raise ValueError(f"early exit after {layers} layers: the model has {len(blocks)}")
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = list(config.layer_types)[:layers]
    draft_inner = _shallow(inner)
    draft_inner.layers = torch.nn.ModuleList(list(blocks)[:layers])
    draft_inner.config = config
    draft = _shallow(model)
    draft.model = draft_inner
    draft.config = config
    draft.generation_config = copy.deepcopy(model.generation_config)  # generate(assistant_model=) edits it
    return draft  # type: ignore[return-value]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class DraftModelProposer(Proposer):
    """One request's draft model state: its KV cache and the tokens the cache holds."""

    def __init__(self, draft: PreTrainedModel, top_k: int, depth: int) -> None:
        if top_k < 1 or depth < 1:
            raise ValueError(f"draft trees need top_k >= 1 and depth >= 1, got {top_k}, {depth}")
        self.model = draft  # the draft model (the target's early exit, or a given one)
        self.top_k = top_k
        self.depth = depth
        self.device = next(draft.parameters()).device
        self.cache = DynamicCache()
        self.seen: list[int] = []  # the tokens whose KV the cache holds, in order
        self.forwards = 0  # draft forwards run (sync and expansion)

    def _feed(self, ids: Sequence[int]) -> torch.Tensor:
        """Run the draft on ``ids`` after what the cache holds; the next-token logits after the last one."""
        x = torch.tensor([list(ids)], dtype=torch.long, device=self.device)  # [1, n]
        with torch.inference_mode():
            out = self.model(input_ids=x, cache=self.cache, use_cache=True, logits_to_keep=1)
        self.seen += list(ids)
        self.forwards += 1
        return out.logits[0, -1]  # [vocab]

    def sync(self, context: Sequence[int]) -> torch.Tensor:
        """Roll the cache back to what it shares with ``context`` and feed the rest: logits after context."""
        if not context:
            raise ValueError("the draft model needs a non-empty context")
        keep = min(common_prefix(self.seen, context), len(context) - 1)  # the last token is always fed
        rollback_cache(self.cache, keep)
        del self.seen[keep:]
        return self._feed(context[keep:])

    def propose(self, context: Sequence[int], budget: int, max_depth: int,
                banned: frozenset[int] = frozenset()) -> DraftTree:
        """This step's token tree below the last context token (``budget`` nodes, ``max_depth`` deep)."""
        tree = DraftTree()
        depth = min(self.depth, max_depth)
        if budget <= 0 or depth <= 0:
            return tree
        logits = self.sync(context)  # [vocab]
        parent = 0
        for level in range(depth):
            top = [t for t in logits.topk(self.top_k + len(banned)).indices.tolist() if t not in banned][: self.top_k]
            tip = None
            for token in top:
                if len(tree) >= budget:
                    break
                node = tree.add(parent, token, merge=True, prob=1.0)
                tip = node if tip is None else tip
            if tip is None or level == depth - 1 or len(tree) >= budget:
                break
            logits = self._feed([tree.tokens[tip - 1]])
            parent = tip
        return tree

    def draft(self, tree: DraftTree, ask: Ask) -> None:
        """The draft's tree merged below what is there, within the budget, only where the trie is weak."""
        if trie_is_weak(tree, ask.budget, self.depth):
            tree.merge(self.propose(ask.context, ask.budget - len(tree), ask.room, ask.banned))


def trie_is_weak(tree: DraftTree, budget: int, depth: int) -> bool:
    """Whether a step should ask the draft model: the trie left room in the budget and none of its chains
    reaches the draft's ``depth`` (a deep trie chain is a copy in progress, which a draft rarely beats).

    Example (depth 4): a trie tree of one 5-token chain -> False; of three 1-token branches with budget
    8 -> True; any tree filling the budget -> False.
    """
    return len(tree) < budget and tree.depth() < depth


def default_exit_layer(model: PreTrainedModel) -> int:
    """The self-draft's default depth: a quarter of the target's layers, at least one."""
    return max(1, int(model.config.num_hidden_layers) // SELF_DRAFT_FRACTION)


class DraftModels:
    """The draft models one engine hands its requests: ``given`` (any causal LM with the target's
    vocabulary), else self-drafts of the target, one per exit layer asked for, built once."""

    def __init__(self, target: PreTrainedModel, given: PreTrainedModel | None = None) -> None:
        if given is not None and given.config.vocab_size != target.config.vocab_size:
            raise ValueError(f"the draft model's vocabulary ({given.config.vocab_size}) is not the target's "
                             f"({target.config.vocab_size})")
        self.target = target
        self.given = given
        self._self_drafts: dict[int, PreTrainedModel] = {}

    def get(self, layers: int = 0) -> PreTrainedModel:
        """The given draft model, or the target's early exit after ``layers`` (0: the default)."""
        if self.given is not None:
            return self.given
        layers = layers or default_exit_layer(self.target)
        if layers not in self._self_drafts:
            self._self_drafts[layers] = early_exit(self.target, layers)
        return self._self_drafts[layers]
