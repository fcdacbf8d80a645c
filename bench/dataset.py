"""The benchmarks' question set: the small bundled one (package data in bench/data) or your own files.

The bundled set is smoke-size: the first 44 answerable questions of SQuAD v2.0's development set
about "Normans" and the 17 paragraphs they were written about (CC BY-SA 4.0, bench/data/LICENSE).
It is read through importlib.resources, so it works from an installed package too. The first 40
questions are the benchmarked ones at the default ``--limit 40``; the other 4 are left for
``--calibrate``. Figures worth quoting come from a named dataset (``--corpus`` / ``--questions``).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

PACKAGE = "lookahead_rag.bench"  # the package that ships the data folder
DATA_DIR = "data"
CORPUS_FILE = "corpus.jsonl"  # {"id", "title", "text"}, one paragraph a line
QUESTIONS_FILE = "questions.jsonl"  # {"id", "question", "doc_id", "answers", "answerable"}
BUNDLED_NAME = "bundled (bench/data: 44 SQuAD v2.0 dev questions on 'Normans', 17 paragraphs)"

Source = Path | Traversable  # a JSONL file: one of yours, or the bundled package data


@dataclass(frozen=True)
class Dataset:
    """The corpus and question files a benchmark reads, and the name its JSON records."""

    corpus: Source
    questions: Source
    name: str


def bundled_file(name: str) -> Traversable:
    """A file of the bundled set (``CORPUS_FILE`` or ``QUESTIONS_FILE``)."""
    return resources.files(PACKAGE) / DATA_DIR / name


def bundled() -> Dataset:
    """The bundled smoke-size set."""
    return Dataset(bundled_file(CORPUS_FILE), bundled_file(QUESTIONS_FILE), BUNDLED_NAME)


def add_dataset_args(p: argparse.ArgumentParser) -> None:
    """--corpus and --questions: your own JSONL files, both or neither (default: the bundled set)."""
    p.add_argument("--corpus", default=None,
                   help="JSONL {id,title,text}, with --questions (default: the bundled set, bench/data)")
    p.add_argument("--questions", default=None,
                   help="JSONL {id,question,doc_id[,answerable]}, with --corpus (default: the bundled set)")


def dataset_from_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> Dataset:
    """The dataset the flags name; sets ``args.corpus`` / ``args.questions`` to its files."""
    if (args.corpus is None) != (args.questions is None):
        p.error("--corpus and --questions go together (neither: the bundled set)")
    if args.corpus is None:
        ds = bundled()
    else:
        ds = Dataset(Path(args.corpus), Path(args.questions), f"{args.corpus} + {args.questions}")
    args.corpus, args.questions = ds.corpus, ds.questions
    return ds
