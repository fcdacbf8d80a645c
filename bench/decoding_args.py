"""Decoding benchmark: greedy vs transformers' prompt lookup vs lookahead modes, side by side.

    lookahead-rag-bench decoding [--corpus C.jsonl --questions Q.jsonl] --limit 40 \\
        --modes greedy,prompt-lookup,none,llma,parallel,hierarchical --max-new-tokens 128 --json out.json

Without --corpus/--questions it reads the small bundled set (bench/data, bench/dataset.py): a smoke
test; quote figures measured on a named dataset.

Every question runs through every mode in turn in one process (machine noise is shared). Scenarios:
cold (default: each question's trie holds only its prompt and its own output), --accumulate
(outputs stay), --warm Q2.jsonl (answer Q2 first and insert the outputs), --repeat (two passes,
the second reported). ``jacobi`` drafts from the Jacobi lookahead window's n-gram pool alone, and
``hierarchical+jacobi`` merges that pool with the trie's drafts (``--jacobi W,N,G`` sets the window,
n-gram size and guesses of both). ``draft-model`` merges the trie's tree with a self-draft's token tree
(the model's first quarter of layers, its norm and LM head); ``assisted`` is transformers'
``generate(assistant_model=)`` with that same self-draft (drafting ``draft_depth`` tokens a step). ``mjsd``
is lossy (beam search on the self-draft, joint-likelihood acceptance): with it in the run every row adds
``differ_frac`` and ``mean_logprob``, the target's mean log-likelihood per answer token (bench/quality.py).
``greedy``, ``prompt-lookup`` and ``assisted``
run the stock model with transformers' generate; the lookahead modes (``none`` = one token per step)
run lookahead_core's loop on one KernelSet timed at start-up. ``greedy`` and ``none`` always run: the
faster is the greedy baseline.

Sampling (``--temperature T [--top-p P --top-k K --seed S]``, T > 0): ``greedy`` gives way to
``reference`` (lookahead_core.sampling.generate_sampled, plain sampling on the stock model, one token
per forward), the baseline of ``speedup_vs_reference`` and ``exact_match_vs_reference``; every
question uses the same seed S; ``prompt-lookup`` is transformers' sampling (torch.manual_seed(S)
before each question), which is not expected to match the reference token for token.

``lookahead-rag-bench decoding``'s command line (the benchmark itself: bench/decoding.py).
"""

from __future__ import annotations

import argparse

from lookahead_rag.bench.common import MODEL_HELP, add_placement_args, parse_workload, workload_parser

DEFAULT_MODES = "greedy,prompt-lookup,none,llma,parallel,hierarchical"
DEFAULT_LIMIT = 40  # benchmarked questions: the bundled set holds 40 + 4 for --calibrate
DEFAULT_CALIBRATE = 4
DEFAULT_MAX_NEW_TOKENS = 128
DEFAULT_WARM_LIMIT = 100
DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_JACOBI = "4,3,2"  # W,N,G of the jacobi and hierarchical+jacobi modes


def jacobi_shape(text: str) -> tuple[int, int, int]:
    """``W,N,G`` -> (window, ngram, guesses), checked like DecodingConfig checks them."""
    try:
        w, n, g = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--jacobi wants W,N,G (three integers), got {text!r}") from None
    if w < 1 or n < 2 or g < 1:
        raise argparse.ArgumentTypeError(f"--jacobi wants W >= 1, N >= 2, G >= 1, got {text!r}")
    return w, n, g


def parse_args(argv: list[str], doc: str | None = None) -> argparse.Namespace:
    """The parsed flags; ``args.corpus`` / ``args.questions`` are the dataset's files (default: bundled)."""
    p = workload_parser("lookahead-rag-bench decoding", __doc__ if doc is None else doc)
    p.add_argument("--limit", type=int, default=DEFAULT_LIMIT, help="first N answerable questions")
    p.add_argument("--modes", default=DEFAULT_MODES, help="comma-separated modes")
    p.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    p.add_argument("--model", default=DEFAULT_MODEL, help=MODEL_HELP)
    add_placement_args(p)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    p.add_argument("--decoding-length", default="auto",
                   help="draft tokens per forward, or 'auto': the library default as a cap under --engine "
                        "scheduler (budgets adapt per step), calibrated on --calibrate questions under decoder")
    p.add_argument("--branch-length", type=int, default=0, help="trie branch length (0 = library default)")
    p.add_argument("--calibrate", type=int, default=DEFAULT_CALIBRATE,
                   help="with --decoding-length auto: answerable questions AFTER the benchmarked ones used "
                        "to measure acceptance vs tree size (never the benchmarked questions themselves)")
    p.add_argument("--accumulate", action="store_true", help="outputs of earlier questions stay in the trie")
    p.add_argument("--warm", default=None, help="JSONL of questions answered first (implies --accumulate)")
    p.add_argument("--warm-limit", type=int, default=DEFAULT_WARM_LIMIT, help="first N answerable questions of --warm")
    p.add_argument("--warm-skip", type=int, default=0,
                   help="skip the first N answerable --warm questions (e.g. the benchmarked ones)")
    p.add_argument("--repeat", action="store_true", help="ask every question twice, report the second pass")
    p.add_argument("--profile", action="store_true",
                   help="time every engine step's phases per lookahead mode (reported pass): a table, the JSON's "
                        "'profile' and a stacked-bar PNG next to it (*_profile.png)")
    p.add_argument("--retrieve", type=int, default=0,
                   help="K: prompts hold the top-K retrieved chunks of the corpus instead of doc_id's paragraph")
    p.add_argument("--via-grpc", action="store_true",
                   help="also answer the questions through the three services, in-process and over loopback gRPC")
    p.add_argument("--engine", choices=("scheduler", "decoder"), default="scheduler",
                   help="the one engine, driven by its own thread (scheduler: as the service runs it) or from "
                        "the caller's thread at one request (decoder: LookaheadDecoder)")
    p.add_argument("--jacobi", type=jacobi_shape, default=jacobi_shape(DEFAULT_JACOBI), metavar="W,N,G",
                   help=f"Jacobi window, n-gram size and guesses of jacobi / hierarchical+jacobi ({DEFAULT_JACOBI})")
    args = parse_workload(p, argv, "sampling seed, the same for every question (with --temperature > 0)")
    return args



def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv or [])
    from lookahead_rag.bench.decoding import bench_decoding  # torch: loads once the arguments are parsed (--help light)

    return bench_decoding(args)
