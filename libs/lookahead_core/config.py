"""Decoding configuration (one dataclass; every field documented)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

MJSD_THRESHOLD = 0.1  # mode mjsd: the paper's acceptance threshold (its Appendix D, every model and dataset)
MJSD_BEAMS = 4  # mode mjsd: beams of the draft's beam search (the paper's 8 cost too many draft forwards on a CPU)


class DraftMode(StrEnum):
    """How drafts are built each step."""

    HIERARCHICAL = "hierarchical"  # trie-merged tree of branches (Lookahead)
    PARALLEL = "parallel"  # separate chains, no shared prefixes
    LLMA = "llma"  # the single best-matching span (LLMA)
    JACOBI = "jacobi"  # only the n-gram pool of the Jacobi lookahead window (LMSYS lookahead decoding)
    DRAFT_MODEL = "draft-model"  # the hierarchical trie tree merged with a draft model's token tree (SpecInfer)
    MJSD = "mjsd"  # LOSSY, opt-in by name: a draft model's beams accepted by joint likelihood (MJSD)
    NONE = "none"  # plain greedy: one token per forward


LOSSY_MODES = frozenset({DraftMode.MJSD})  # output may differ from plain decoding: never a default
MAX_TOP_LOGPROBS = 20  # most alternatives a request may ask per token (OpenAI's bound)


def parse_mode(name: str) -> DraftMode:
    """``name`` as a DraftMode; a ValueError listing the modes for any other string."""
    if name not in {m.value for m in DraftMode}:
        raise ValueError(f"unknown mode {name!r} ({', '.join(m.value for m in DraftMode)})")
    return DraftMode(name)


@dataclass(frozen=True)
class TrieConfig:
    """How the token trie is filled and bounded."""

    branch_length: int = 32  # tokens per inserted branch (max trie depth; long copies need depth)
    prompt_weight: float = 100.0  # weight of one prompt/reference occurrence vs one output occurrence
    # Max output-only nodes kept (least-frequent pruned past it). The paper's 16 x decoding length
    # (~128 nodes here) cut repeat-question acceptance from 4.2 to 2.2 tokens/step in our
    # simulation on squad-dev, so the bound is set by memory instead (~300 B a node).
    capacity: int = 65536
    prune_slack: float = 0.1  # prune down to (1 - slack) * capacity so pruning is amortized
    # Max nodes prompts and references may hold (~300 B a node): a prompt's windows past it are not
    # inserted, so one request's huge reference cannot take the memory and minutes of a whole trie.
    # 2^18 holds every window of ~8k distinct tokens (a long RAG prompt and its references).
    max_prompt_nodes: int = 1 << 18


@dataclass(frozen=True)
class DecodingConfig:
    """Knobs of one lookahead decoding run; ``dataclasses.replace`` makes a changed copy (mode may be a string)."""

    mode: DraftMode = DraftMode.HIERARCHICAL  # draft structure
    # Draft tokens verified per forward (root excluded). Default from `lookahead-rag bench
    # --decoding-length auto` on a 2-core CPU (fp32 SmolLM2): a forward of 9 tokens costs ~1.25x
    # one token with packed kernels and acceptance flattens past ~8 nodes (bench/README.md).
    decoding_length: int = 8
    max_decoding_length: int = 32  # hierarchical: grow past decoding_length up to this with confident nodes
    extend_min_prob: float = 0.9  # ... whose trie path probability is at least this
    extend_min_match: int = 4  # ... and only below a context suffix match at least this long
    max_match: int = 8  # longest context suffix tried when matching the trie (multi-stage, long first)
    min_match: int = 1  # shortest suffix tried
    min_fill: float = 0.5  # multi-stage: try a shorter suffix while the tree holds < min_fill * budget
    max_new_tokens: int = 128  # generation limit
    stop_strings: tuple[str, ...] = ()  # generation stops before any of these strings
    trie: TrieConfig = field(default_factory=TrieConfig)  # trie shape and capacity
    insert_output: bool = True  # insert the output into the trie as it grows (self-repetition drafts)
    # Sampling, with transformers' GenerationConfig names and semantics (sampling.py).
    temperature: float = 0.0  # 0: greedy; > 0: sample from the processed distribution
    top_p: float = 1.0  # nucleus: keep the fewest most likely tokens holding this much probability (1: off)
    top_k: int = 0  # keep only the k most likely tokens (0: off)
    min_p: float = 0.0  # drop tokens under min_p x the most likely token's probability (0: off)
    repetition_penalty: float | None = None  # CTRL penalty on tokens already seen (None: the model's, else 1.0)
    seed: int | None = None  # sampling key: the draw for output position t is a function of (seed, t) only
    # Log-probabilities of the emitted tokens (sampling/logprobs.py): raw model distribution, before processing.
    logprobs: bool = False  # report each emitted token's logprob (ServeRequest.logprobs); off: no cost at all
    top_logprobs: int = 0  # ... and its position's most likely alternatives, 0..MAX_TOP_LOGPROBS (needs logprobs)
    # The Jacobi lookahead window (jacobi.py): its tokens ride in the verification forward.
    # W: positions guessed per row; None = what the measured forward cost allows (jacobi.choose_window,
    # 0 on a 2-core CPU), 0 = no window (mode jacobi: at least 1)
    jacobi_window: int | None = None
    jacobi_ngram: int = 3  # N: tokens per n-gram (N - 1 rows in the window)
    jacobi_guesses: int = 2  # G: pool n-grams drafted per step at most (and kept per first token)
    # Mode draft-model (draft_model.py): the draft's token tree, top-k per depth.
    draft_layers: int = 0  # self-draft exit layer (0: a quarter of the target's layers); ignored for a given draft
    draft_top_k: int = 2  # children proposed at each depth
    draft_depth: int = 4  # depths proposed (each one draft forward); mode mjsd: the beams' length
    # Mode mjsd (mjsd.py; lossy): beam search on the draft (draft_layers picks it), joint-likelihood acceptance.
    mjsd_beams: int = MJSD_BEAMS  # beams kept at each depth
    mjsd_threshold: float = MJSD_THRESHOLD  # accept a prefix when P_target / P_draft >= this

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", DraftMode(self.mode))  # accept "hierarchical" etc. as strings
        if self.decoding_length < 0:
            raise ValueError("decoding_length must be >= 0")
        if self.max_new_tokens <= 0:
            raise ValueError("max_new_tokens must be > 0")
        if not 1 <= self.min_match <= self.max_match:
            raise ValueError("need 1 <= min_match <= max_match")
        if self.trie.branch_length < 2:
            raise ValueError("branch_length must be >= 2")
        if not self.temperature >= 0:  # also refuses NaN
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.repetition_penalty is not None and not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.draft_layers < 0 or self.draft_top_k < 1 or self.draft_depth < 1:
            raise ValueError("need draft_layers >= 0, draft_top_k >= 1 and draft_depth >= 1")
        if (self.jacobi_window or 0) < 0 or self.jacobi_ngram < 2 or self.jacobi_guesses < 1:
            raise ValueError("need jacobi_window >= 0, jacobi_ngram >= 2 and jacobi_guesses >= 1")
        if self.mjsd_beams < 1 or not 0 < self.mjsd_threshold <= 1:
            raise ValueError(f"need mjsd_beams >= 1 and 0 < mjsd_threshold <= 1, got {self.mjsd_beams}, "
                             f"{self.mjsd_threshold}")
        if self.mode is DraftMode.MJSD and self.sampling:
            raise ValueError("mode mjsd is greedy only (temperature 0)")
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs must be in 0..{MAX_TOP_LOGPROBS}, got {self.top_logprobs}")
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs")
        if self.seed is not None and not 0 <= self.seed < 2**64:
            raise ValueError(f"seed must be in [0, 2**64), got {self.seed}")

    @property
    def speculative(self) -> bool:
        """Whether drafts are made at all (every mode but none): a request without them needs no draft cache."""
        return self.mode is not DraftMode.NONE

    @property
    def lossy(self) -> bool:
        """Whether the output may differ from plain decoding (mode mjsd): what stats call unverified."""
        return self.mode in LOSSY_MODES

    @property
    def sampling(self) -> bool:
        """Whether tokens are drawn (temperature > 0) rather than taken greedily."""
        return self.temperature > 0
