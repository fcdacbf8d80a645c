"""The step scheduler: batched requests equal batch-1 greedy, whatever joins, leaves or drafts.

Every answer of a batched run must be ``model.generate(do_sample=False)`` of its own prompt, token
for token, on tiny random llama and qwen2 models: mixed prompt lengths and modes, requests joining
while others decode, chunked prefill, cancelled neighbours, adversarial drafts next door, prefix-
cache hits, both kernels. Queue, deadlines, cancels and fair share are checked without timing.
"""

from __future__ import annotations

import random
import threading

import pytest
from lookahead_core import PathRecorder
from lookahead_core.config import DraftMode
from lookahead_core.engine.admission import QueueFull
from lookahead_core.engine.request import Phase, RequestExpired
from lookahead_core.engine.scheduler import SchedulerConfig, StepScheduler
from lookahead_core.forward.kernels import KernelSet
from lookahead_core.forward.ragged import RAGGED_ATTENTION
from lookahead_core.kv.kvstore import KVShape

from tests.core.helpers import (
    FAMILIES,
    WAIT_S,
    Client,
    StubTokenizer,
    eos_as,
    greedy,
    oracle_drafter,
    random_prompt,
    run_all,
    tiny_model,
)
from tests.core.serve_requests import adversarial_drafters, serve_request

pytestmark = pytest.mark.usefixtures("one_thread")


def assert_idle(sched: StepScheduler) -> None:
    state = sched.state()
    assert (state.waiting, state.running, state.kv_bytes) == (0, 0, 0)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("adaptive", [False, True])
def test_mixed_batch_equals_greedy(family: str, adaptive: bool, scheduler_of) -> None:
    # 8 requests of different lengths and modes, in one batch: each equals its own greedy run
    model = tiny_model(family)
    rng = random.Random(7)
    sched = scheduler_of(model, SchedulerConfig(calibrate=adaptive, adaptive=adaptive, max_running=8,
                                                calibration_counts=(1, 8, 32), calibration_repeats=1))
    modes = [DraftMode.HIERARCHICAL, DraftMode.PARALLEL, DraftMode.LLMA, DraftMode.NONE]
    prompts = [random_prompt(rng) for _ in range(8)]
    with eos_as(model, None):
        clients = [Client() for _ in prompts]
        reqs = [serve_request(p, c, mode=modes[i % 4], max_new_tokens=12 + 3 * i)
                for i, (p, c) in enumerate(zip(prompts, clients, strict=True))]
        run_all(sched, reqs, clients)
        for p, r, c in zip(prompts, reqs, clients, strict=True):
            assert c.error is None
            assert c.streamed == r.output == greedy(model, p, r.config.max_new_tokens)
    assert_idle(sched)


@pytest.mark.parametrize("family", FAMILIES)
def test_joining_leaving_and_chunked_prefill(family: str, scheduler_of) -> None:
    # a small prefill chunk splits prompts over several forwards while others decode; a queue of 6 behind
    # 3 running slots makes requests join as others finish
    model = tiny_model(family)
    rng = random.Random(11)
    sched = scheduler_of(model, SchedulerConfig(calibrate=False, max_running=3, prefill_chunk=7,
                                                max_tokens_per_forward=40))
    prompts = [random_prompt(rng) for _ in range(9)]
    with eos_as(model, None):
        clients = [Client() for _ in prompts]
        reqs = [serve_request(p, c, max_new_tokens=5 + 4 * (i % 4))
                for i, (p, c) in enumerate(zip(prompts, clients, strict=True))]
        run_all(sched, reqs, clients)
        for p, r in zip(prompts, reqs, strict=True):
            assert r.output == greedy(model, p, r.config.max_new_tokens)
        assert max(max(r.stats.batch_sizes) for r in reqs) > 1  # they really shared forwards
    assert_idle(sched)


@pytest.mark.parametrize("family", FAMILIES)
def test_adversarial_neighbour_never_changes_tokens(family: str, scheduler_of) -> None:
    # one request drafts only wrong tokens, one forks (non-contiguous accepted KV), one is oracle-fed:
    # every output is its own greedy run
    model = tiny_model(family)
    rng = random.Random(3)
    prompts = [random_prompt(rng) for _ in range(3)]
    n = 20
    with eos_as(model, None):
        truths = [greedy(model, p, n) for p in prompts]
        drafters = adversarial_drafters(prompts, truths)
        sched = scheduler_of(model, SchedulerConfig(calibrate=False, adaptive=False))
        clients = [Client() for _ in prompts]
        reqs = [serve_request(p, c, max_new_tokens=n, decoding_length=8, drafter=d)
                for p, c, d in zip(prompts, clients, drafters, strict=True)]
        run_all(sched, reqs, clients)
        assert [r.output for r in reqs] == truths
        assert reqs[2].stats.forward_steps < n // 2  # the oracle's drafts were accepted
    assert_idle(sched)


@pytest.mark.parametrize("kernel", ["stock", "packed"])
def test_each_kernel_gives_greedy(kernel: str, scheduler_of) -> None:
    # the measurement may choose either kernel per forward: both must give greedy tokens
    model = tiny_model("llama")
    rng = random.Random(5)
    prompts = [random_prompt(rng) for _ in range(4)]
    sched = scheduler_of(model, kernels=KernelSet(model, RAGGED_ATTENTION, kernels=(kernel,)))
    with eos_as(model, None):
        clients = [Client() for _ in prompts]
        reqs = [serve_request(p, c) for p, c in zip(prompts, clients, strict=True)]
        run_all(sched, reqs, clients)
        assert [r.output for r in reqs] == [greedy(model, p, 24) for p in prompts]
    assert all(r.stats.kernels == {kernel} for r in reqs)


def test_prefix_cache_hit_equals_miss(scheduler_of) -> None:
    # the same prompt twice (exact repeat), then one sharing a long prefix (the cache keeps only its own
    # tokens past it), then one whose hit spans both entries: hits skip prefill, same tokens
    model = tiny_model("qwen2")
    rng = random.Random(9)
    base = random_prompt(rng) + random_prompt(rng)
    other = base[:-5] + random_prompt(rng)[:6]
    spanning = other[:-2] + random_prompt(rng)[:3]
    sched = scheduler_of(model, SchedulerConfig(calibrate=False, prefix_min_tokens=4))
    with eos_as(model, None):
        outs = []
        for prompt in (base, base, other, spanning):
            client = Client()
            req = serve_request(prompt, client)
            run_all(sched, [req], [client])
            assert req.output == greedy(model, prompt, 24)
            outs.append(req)
    assert outs[0].stats.prefix_hit_tokens == 0  # cold
    assert outs[1].stats.prefix_hit_tokens == len(base) - 1  # all but the last token came from the cache
    assert outs[2].stats.prefix_hit_tokens == len(base) - 5  # the shared prefix
    assert outs[3].stats.prefix_hit_tokens == len(other) - 2  # base's tokens, then other's own
    # shared once, each kept token's KV and its id (int64, counted beside it)
    assert sched.prefix_cache.stats().bytes == (len(base) + 6 + 3) * (KVShape.of(model).bytes_per_token + 8)
    assert_idle(sched)


def test_a_prompt_admitted_beside_its_twin_takes_the_twin_prefix() -> None:
    # the same prompt twice in one burst: both are admitted at once, but the second's first chunk runs
    # after the first's prompt is cached (8-token chunks, FIFO), so it loads that prefix instead of
    # prefilling again; both answers are greedy
    model = tiny_model("llama")
    prompt = random_prompt(random.Random(4))[:16]
    assert len(prompt) == 16
    sched = StepScheduler(model, StubTokenizer(), SchedulerConfig(calibrate=False, prefix_min_tokens=4,  # type: ignore[arg-type]
                                                                  prefill_chunk=8)).start(thread=False)
    clients = [Client(), Client()]
    reqs = [serve_request(prompt, c) for c in clients]
    with eos_as(model, None):
        for req in reqs:
            sched.submit(req)
        while sched.step():
            pass
    assert [r.output for r in reqs] == [greedy(model, prompt, 24)] * 2
    assert [r.stats.prefix_hit_tokens for r in reqs] == [0, len(prompt) - 1]
    sched.close()


def test_other_tenant_never_hits(scheduler_of) -> None:
    # the identical prompt under another tenant is prefilled from scratch
    model = tiny_model("llama")
    prompt = random_prompt(random.Random(2))
    sched = scheduler_of(model, SchedulerConfig(calibrate=False, prefix_min_tokens=4))
    hits = []
    for tenant in ("a", "b", "a"):
        client = Client()
        req = serve_request(prompt, client, tenant=tenant)
        run_all(sched, [req], [client])
        hits.append(req.stats.prefix_hit_tokens)
    assert hits == [0, 0, len(prompt) - 1]


def test_cancel_running_and_waiting(scheduler_of) -> None:
    # request 0 is held inside its first step; 1 runs beside it; 2 waits (max_running 2) and is cancelled
    # there; 0 is cancelled while running: both end "cancelled", 1 equals greedy, and the engine is idle
    model = tiny_model("llama")
    rng = random.Random(4)
    prompts = [random_prompt(rng) for _ in range(3)]
    sched = scheduler_of(model, SchedulerConfig(calibrate=False, max_running=2))
    gate = threading.Event()
    clients = [Client(gate=gate), Client(), Client()]
    with eos_as(model, None):
        reqs = [serve_request(p, c, max_new_tokens=16) for p, c in zip(prompts, clients, strict=True)]
        with sched._cv:  # all three queued before the engine's next look: 0 and 1 are admitted in one step
            for r in reqs:
                sched.submit(r)
        assert wait_for(lambda: reqs[2].phase is Phase.WAITING and reqs[0].output)  # step held at request 0
        assert [sched.holds(r) for r in reqs] == [True, True, False]  # running: their KV; waiting: none yet
        sched.cancel(reqs[2])
        assert clients[2].done.is_set()  # a waiting request is freed at once
        assert reqs[2].stats.finish_reason == "cancelled" and reqs[2].stats.forward_steps == 0
        sched.cancel(reqs[0])
        gate.set()
        for c in clients:
            assert c.done.wait(WAIT_S)
        assert reqs[0].stats.finish_reason == "cancelled"
        assert len(reqs[0].output) < 16
        assert reqs[1].output == greedy(model, prompts[1], 16)
    assert not any(sched.holds(r) for r in reqs)  # every running state (and its KV) went with its request
    assert_idle(sched)


def test_queue_full_and_waiting_deadline(scheduler_of) -> None:
    # 1 running (held inside its step) + 2 waiting fill the engine: the 4th is refused at once; a waiting
    # request whose deadline passes gets RequestExpired and never runs
    model = tiny_model("llama")
    rng = random.Random(6)
    sched = scheduler_of(model, SchedulerConfig(calibrate=False, max_running=1, max_waiting=2,
                                                max_tokens_per_forward=64, prefill_chunk=64))
    gate = threading.Event()
    clients = [Client(gate=gate), Client(), Client()]
    reqs = [serve_request(random_prompt(rng), clients[0]), serve_request(random_prompt(rng), clients[1], deadline=0.0),
            serve_request(random_prompt(rng), clients[2])]
    sched.submit(reqs[0])
    assert wait_for(lambda: bool(reqs[0].output))  # running, held at its first token
    sched.submit(reqs[1])
    sched.submit(reqs[2])
    with pytest.raises(QueueFull):
        sched.submit(serve_request(random_prompt(rng), Client()))
    gate.set()
    for c in clients:
        assert c.done.wait(WAIT_S)
    assert isinstance(clients[1].error, RequestExpired)
    assert reqs[1].stats.forward_steps == 0 and reqs[1].output == []
    assert clients[0].error is None and clients[2].error is None
    assert_idle(sched)


def test_fair_share_between_tenants(scheduler_of) -> None:
    # "burst" holds one of two slots and queues 5 more; "quiet" queues 1 after them: when the second
    # slot is free, quiet (no running request) starts before any more of burst's
    model = tiny_model("llama")
    rng = random.Random(8)
    sched = scheduler_of(model, SchedulerConfig(calibrate=False, max_running=2))
    gate = threading.Event()
    started: list[str] = []
    clients = []
    reqs = []
    for i, tenant in enumerate(["burst"] * 6 + ["quiet"]):
        client = Client(gate=gate if i == 0 else None)
        req = serve_request(random_prompt(rng), client, tenant=tenant, max_new_tokens=3)
        req.on_tokens = lambda r, ids, c=client: (None if r.stats.forward_steps else started.append(r.tenant),
                                                  c.on_tokens(r, ids))
        clients.append(client)
        reqs.append(req)
    sched.submit(reqs[0])
    assert wait_for(lambda: bool(reqs[0].output))  # running alone, held at its first token
    for req in reqs[1:]:
        sched.submit(req)
    gate.set()
    for c in clients:
        assert c.done.wait(WAIT_S)
    assert started[:2] == ["burst", "quiet"]


def test_stop_string_in_a_batched_step(scheduler_of) -> None:
    # a stop string inside a multi-token step: ids, text and finish reason cut at it (oracle drafts)
    model = tiny_model("llama")
    prompt = random_prompt(random.Random(12))
    with eos_as(model, None):
        truth = greedy(model, prompt, 24)
        stop = StubTokenizer().decode(truth[5:7])
        sched = scheduler_of(model, SchedulerConfig(calibrate=False, adaptive=False))
        client = Client()
        req = serve_request(prompt, client, stop_strings=(stop,), drafter=oracle_drafter(len(prompt), truth))
        run_all(sched, [req], [client])
    assert req.output == truth[:7]
    assert req.stats.finish_reason == "stop"


def test_observer_sees_every_decode_step(scheduler_of) -> None:
    # a StepObserver on a request gets every verified tree's accepted path; oracle chains are accepted whole
    model = tiny_model("llama")
    prompt = random_prompt(random.Random(13))
    with eos_as(model, None):
        truth = greedy(model, prompt, 24)
        sched = scheduler_of(model, SchedulerConfig(calibrate=False, adaptive=False))
        client, recorder = Client(), PathRecorder()
        req = serve_request(prompt, client, drafter=oracle_drafter(len(prompt), truth), observer=recorder)
        run_all(sched, [req], [client])
    assert req.output == truth
    assert len(recorder.paths) == req.stats.forward_steps > 0
    assert all(p == tuple(range(1, len(p) + 1)) for p in recorder.paths)  # the whole chain, node by node
    assert sum(len(p) + 1 for p in recorder.paths) == len(truth) - 1  # + a bonus token each; + the prefill's


def wait_for(cond, timeout: float = WAIT_S) -> bool:
    done = threading.Event()
    deadline = timeout
    step = 0.01
    while deadline > 0:
        if cond():
            return True
        done.wait(step)
        deadline -= step
    return False
