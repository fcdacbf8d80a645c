"""Out-of-vocabulary ids and failing requests never hurt the other requests of a shared forward.

Tenant A's drafts carry ids the model cannot embed (planted in its trie, or in a drafter's tree), or
its step fails outright; tenant B streams in the same forwards and must get exactly greedy. Tiny
random llama model, no EOS, one intra-op thread.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator, Sequence

import pytest
from lookahead_core.config import DecodingConfig
from lookahead_core.drafting.draft import Drafter, DraftTree
from lookahead_core.engine.request import ServeRequest
from lookahead_core.engine.scheduler import SchedulerConfig, StepScheduler

from tests.core import helpers as h
from tests.core.conftest import one_thread  # noqa: F401 (a fixture of the core tests)

pytestmark = pytest.mark.usefixtures("one_thread")

N = 16  # tokens each answer takes
BAD = h.TINY_VOCAB + 7  # an id past the embedding's rows


def request(prompt: Sequence[int], client: h.Client, tenant: str, drafter: Drafter | None = None) -> ServeRequest:
    config = DecodingConfig(max_new_tokens=N, decoding_length=6)
    return ServeRequest(prompt, config, tenant=tenant, on_tokens=client.on_tokens, on_done=client.on_done,
                        drafter=drafter)


def bad_drafter(_context: list[int], budget: int, _depth: int) -> DraftTree:
    """A tree whose second node is out of the vocabulary, with a good-looking child below it."""
    tree = DraftTree()
    first = tree.add(0, 5)
    bad = tree.add(first, BAD)
    tree.add(bad, 6)
    tree.add(0, 7)
    return tree.prefix(budget)


def raising_drafter(_context: list[int], _budget: int, _depth: int) -> DraftTree:
    raise RuntimeError("this tenant's drafter is broken")


@pytest.fixture
def setup() -> Iterator[tuple]:
    model = h.tiny_model("llama")
    rng = random.Random(17)
    prompts = [h.random_prompt(rng) for _ in range(3)]
    config = SchedulerConfig(calibrate=False, adaptive=False, max_running=4)
    sched = StepScheduler(model, h.StubTokenizer(), config).start()  # type: ignore[arg-type]
    yield model, prompts, sched
    sched.close()


def test_planted_trie_ids_are_never_drafted(setup) -> None:
    # tenant A's trie holds, after every point of its answer, out-of-vocabulary ids (as a poisoned
    # draft cache would put them): its drafts skip them, and A and B both get exactly greedy
    model, prompts, sched = setup
    with h.eos_as(model, None):
        truth = h.greedy(model, prompts[0], N)
        clients = [h.Client(), h.Client()]
        a = request(prompts[0], clients[0], "a")
        for i in range(N):
            a.trie.insert_output([*truth[max(0, i - 2) : i + 1], BAD, BAD + 1], count=50)
        b = request(prompts[1], clients[1], "b")
        h.run_all(sched, [a, b], clients)
        assert clients[0].error is None and clients[1].error is None
        assert a.output == truth
        assert b.output == h.greedy(model, prompts[1], N)
        assert max(b.stats.batch_sizes) == 2  # they shared forwards


def beside_neighbours(setup: tuple, prompt: Sequence[int], drafter: Drafter | None = None) -> tuple:
    """Tenant A's request between B and C in the same forwards: B and C must end exactly greedy;
    returns A's (client, request)."""
    model, prompts, sched = setup
    with h.eos_as(model, None):
        clients = [h.Client(), h.Client(), h.Client()]
        reqs = [request(prompts[1], clients[0], "b"), request(prompt, clients[1], "a", drafter),
                request(prompts[2], clients[2], "c")]
        h.run_all(sched, reqs, clients)
        for i, prompt_of_neighbour in ((0, prompts[1]), (2, prompts[2])):
            assert clients[i].error is None
            assert reqs[i].output == h.greedy(model, prompt_of_neighbour, N)
    assert sched.state().running == 0
    return clients[1], reqs[1]


def test_out_of_vocab_tree_is_clipped(setup) -> None:
    # a drafter's tree with a bad node: the node and its subtree are dropped before packing
    model, prompts, _ = setup
    client, a = beside_neighbours(setup, prompts[0], bad_drafter)
    assert client.error is None
    with h.eos_as(model, None):
        assert a.output == h.greedy(model, prompts[0], N)


def test_a_failing_forward_fails_only_its_culprit(setup) -> None:
    # with the engine's vocabulary gate off, A's bad id fails the shared forward: the engine steps the
    # requests apart and fails A alone
    _, prompts, sched = setup
    sched.limits = dataclasses.replace(sched.limits, vocab_size=None)
    client, _ = beside_neighbours(setup, prompts[0], bad_drafter)
    assert isinstance(client.error, IndexError)


def test_a_raising_drafter_fails_only_its_request(setup) -> None:
    # a request whose drafting raises while the step is planned fails alone
    client, _ = beside_neighbours(setup, setup[1][0], raising_drafter)
    assert isinstance(client.error, RuntimeError)


def test_out_of_vocab_prompt_fails_at_admission(setup) -> None:
    # a prompt id the model cannot embed is refused when the request is admitted, never packed
    client, a = beside_neighbours(setup, [*setup[1][0], BAD])
    assert isinstance(client.error, ValueError) and "vocabulary" in str(client.error)
    assert a.output == []


def test_request_trie_is_filled_once(setup) -> None:
    # a caller may fill the trie on its own thread first: the engine does not insert the prompt again
    model, prompts, sched = setup
    with h.eos_as(model, None):
        client = h.Client()
        req = request(prompts[0], client, "a")
        req.fill_trie()
        assert req.trie.node_count > req.trie.output_node_count  # the prompt's branches are in
        h.run_all(sched, [req], [client])
        assert req.output == h.greedy(model, prompts[0], N)
    # one removal took every prompt branch out: they were inserted once, not again at admission
    assert req.trie.node_count == req.trie.output_node_count
