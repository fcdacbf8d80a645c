"""``lookahead-rag kernels build``: compile every C++ kernel the engine may use, once per machine.

    lookahead-rag kernels build      # one line per kernel: compiled, already built, not for this CPU, or failed

``make setup`` runs it, so the engine's first start loads the kernels instead of compiling them. A kernel that
cannot be built (no compiler, no ninja) is not offered: the engine serves with the stock kernels. Exit 1
when a kernel this CPU could run failed to build.
"""

from __future__ import annotations

import argparse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lookahead-rag kernels", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = p.add_subparsers(dest="action", required=True)
    sub.add_parser("build", help="compile every kernel the engine may use (those already built are loaded)")
    return p


def main(argv: list[str] | None = None) -> int:
    parser().parse_args(argv)
    from lookahead_core.forward.prebuild import build_all  # imports torch: only once the command runs

    return 1 if build_all() else 0
