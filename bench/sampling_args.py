"""The benchmarks' sampling flags (--temperature --top-p --top-k --seed) and the comparisons made with them.

Temperature 0 (the default) is greedy and leaves every benchmark as it was. With temperature > 0
the baseline is ``lookahead_core.sampling.generate_sampled`` (plain sampling, one token per forward,
the draw for output position t keyed by (seed, t)), and every question / request uses the same
seed S, so a lossless mode must reproduce the reference's tokens exactly.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from lookahead_core import DecodingConfig


@dataclass(frozen=True)
class Sampling:
    """What the flags asked for; ``enabled`` is False for greedy (temperature 0)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0

    @property
    def enabled(self) -> bool:
        return self.temperature > 0

    def config_kwargs(self) -> dict[str, Any]:
        """DecodingConfig fields (empty when greedy, so greedy configs stay the library default)."""
        if not self.enabled:
            return {}
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "seed": self.seed}

    def hf_kwargs(self) -> dict[str, Any]:
        """transformers ``generate`` arguments; top_k=0 and top_p=1.0 switch those filters off there too."""
        if not self.enabled:
            return {"do_sample": False}
        return {"do_sample": True, "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}

    def record(self) -> dict[str, Any]:
        """The JSON fields: temperature, top_p, top_k, seed."""
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "seed": self.seed}

    def describe(self) -> str:
        if not self.enabled:
            return "greedy"
        top_k = f", top-k {self.top_k}" if self.top_k else ""
        return f"T={self.temperature:g}, top-p {self.top_p:g}{top_k}, seed {self.seed}"


def add_sampling_args(p: argparse.ArgumentParser, seed_help: str) -> None:
    p.add_argument("--temperature", type=float, default=0.0,
                   help="> 0: sample (baseline: the reference sampler, lookahead_core.sampling); 0: greedy")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1.0 = off)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    p.add_argument("--seed", type=int, default=0, help=seed_help)


def sampling_from_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> Sampling:
    """Validated by DecodingConfig's own checks (a bad value is a usage error)."""
    s = Sampling(args.temperature, args.top_p, args.top_k, args.seed)
    try:
        DecodingConfig(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, seed=s.seed)
    except ValueError as exc:
        p.error(str(exc))
    return s


def speedup(baseline_s: float, mode_s: float) -> float | None:
    """baseline wall time / the mode's, rounded; None when the mode took no time."""
    return round(baseline_s / mode_s, 3) if mode_s else None
