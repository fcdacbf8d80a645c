"""The ``lookahead-rag-bench`` command: the benchmarks, each in its own module (see bench/README.md)."""

from __future__ import annotations

import sys

from lookahead_rag.services.cli import dispatch

# subcommand -> (module exposing main(argv: list[str]) -> int, one-line help)
PKG = "lookahead_rag.bench"  # where the benchmark modules live
COMMANDS: dict[str, tuple[str, str]] = {
    "decoding": (f"{PKG}.decoding_args", "decoding benchmark: greedy vs prompt-lookup vs lookahead modes"),
    "serve": (f"{PKG}.serve_args", "serving benchmark: closed-loop clients, speculation on vs off vs serial HF"),
    "events": (f"{PKG}.events", "Kafka feedback-loop benchmark: lag, lost and double-applied events"),
    "retrieval": (f"{PKG}.retrieval_args", "retrieval latency: p50/p99 of embedding a question + a flat-index search"),
    "draft-agreement": (f"{PKG}.draft_agreement_args", "early-exit self-draft: top-1 agreement, cost per exit layer"),
    "prompt-order": (f"{PKG}.prompt_order_args",
                     "passage order: prefix-cache hits and SQuAD EM/F1, canonical vs score order"),
    "quality": (f"{PKG}.answer_quality_args", "answer quality end to end: recall@k, gold vs served EM/F1, abstention, "
                "past answers in the prompt / as drafts / not at all"),
    "exactness": (f"{PKG}.exactness_args",
                  "exactness: engine answers vs HF greedy, batched and from the prefix cache, with logit margins"),
    "logprobs": (f"{PKG}.logprobs_args", "logprobs: their cost in the engine (tok/s off vs on), equal to HF greedy's"),
    "replica-requests": (f"{PKG}.replica_requests", "a --replay requests file grounded on each question's document "
                         "(no model run)"),
    "replica-sim": (f"{PKG}.replica_sim_cli",
                    "simulated replicas from measured costs: round robin vs tenant vs bounded-load hashing"),
    "device": (f"{PKG}.device_args", "the engine on a GPU (any device) beside HF generate, prompt lookup and static "
               "batching: step cost by width, one stream, batched; fp32 and bf16 (exact numerics)"),
    "hog": (f"{PKG}.hog_args", "one tenant at its worst (longest prompts, every stream) beside another: the other's "
            "prefix hits and first-token time against it alone"),
    "hostile": (f"{PKG}.hostile_args", "another tenant's answers beside an uploader and a stream holder (issue 51), "
                "against alone"),
    "plot": (f"{PKG}.plot", "redraw a benchmark's PNG from its JSON (no benchmark is run)"),
}


def main(argv: list[str] | None = None) -> int:
    return dispatch("lookahead-rag-bench", COMMANDS, argv)


if __name__ == "__main__":
    sys.exit(main())
