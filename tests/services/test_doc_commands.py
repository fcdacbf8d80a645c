"""Every command a doc shows exists: each ``lookahead-rag …`` / ``lookahead-rag-bench …`` in a code
block or an inline code span of the docs answers ``--help`` with exit 0 (issue 23 item 13).

A doc naming a command that was renamed or removed (``bench-serve``) fails here. The commands are
run in one fresh interpreter (``--help`` imports no torch: test_cli_help.py).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "deploy").glob("*.md")), ROOT / "bench" / "README.md"]
CLIS = {"lookahead-rag": "lookahead_rag.services.cli", "lookahead-rag-bench": "lookahead_rag.bench.cli"}
FENCE = "```"
WORD = re.compile(r"[a-z][a-z0-9-]*$")  # a (sub)command name; anything else is an argument or a flag
SPAN = re.compile(r"`([^`\n]+)`")
TIMEOUT_S = 300
CHOICES = re.compile(r"\{([a-z0-9,-]+)\}")  # argparse's usage line lists subcommands as {a,b,c}
# run each (module, argv) and print {"<module> <argv>": [exit code, help text]} as JSON
RUNNER = """
import contextlib, io, json, sys
calls = json.loads(sys.argv[1])
out = {}
for module, argv in calls:
    main = __import__(module, fromlist=["main"]).main
    text = io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.redirect_stderr(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    out[" ".join([module, *argv])] = [code or 0, text.getvalue()]
print(json.dumps(out))
"""


def shown_commands(text: str) -> set[tuple[str, tuple[str, ...]]]:
    """(cli, its first one or two command words) of every command line in code blocks and spans."""
    snippets: list[str] = []
    in_block = False
    for line in text.splitlines():
        if line.strip().startswith(FENCE):
            in_block = not in_block
            continue
        snippets += [line] if in_block else SPAN.findall(line)
    found = set()
    for snippet in snippets:
        words = snippet.strip().lstrip("$ ").split()
        if not words or words[0] not in CLIS:
            continue
        names = []
        for word in words[1:3]:
            first = word.split("|")[0]  # "decoding|serve|events": the first alternative stands for the rest
            if not WORD.match(first):
                break
            names.append(first)
        if names:
            found.add((words[0], tuple(names)))
    return found


def test_shown_commands_reads_blocks_and_spans_only() -> None:
    # prose and other tools' commands are not commands of ours; a pipe list counts its first name
    text = ("Run `lookahead-rag keys add --tenant acme`.\n```sh\nlookahead-rag-bench decoding|serve --x\n"
            "kubectl -n lookahead-rag rollout status\n```\nlookahead-rag for real\n")
    assert shown_commands(text) == {("lookahead-rag", ("keys", "add")), ("lookahead-rag-bench", ("decoding",))}


def test_every_command_a_doc_shows_answers_help() -> None:
    shown = set().union(*(shown_commands(p.read_text()) for p in DOCS))
    assert len(shown) >= 10  # the docs show the commands (the reader above finds them)
    calls = []
    for cli, names in sorted(shown):
        calls += [(CLIS[cli], [*names, "--help"]), (CLIS[cli], [names[0], "--help"])]
    out = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(calls)], capture_output=True, text=True,
                         timeout=TIMEOUT_S, check=True, cwd=ROOT)
    codes = json.loads(out.stdout.strip().splitlines()[-1])
    unknown = []
    for cli, names in sorted(shown):
        whole, _ = codes[" ".join([CLIS[cli], *names, "--help"])]
        alone, usage = codes[" ".join([CLIS[cli], names[0], "--help"])]
        subcommands = {c for group in CHOICES.findall(usage) for c in group.split(",")}
        # a second word may be the command's positional argument, unless the command has subcommands
        second_ok = len(names) == 2 and alone == 0 and (not subcommands or names[1] in subcommands)
        if whole != 0 and not second_ok:
            unknown.append(f"{cli} {' '.join(names)}")
    assert unknown == []
