"""The bandwidth floor (``forward/bandwidth.py``) and the step profile's bytes read against it."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from lookahead_core.config import DecodingConfig
from lookahead_core.engine.scheduler import SchedulerConfig
from lookahead_core.forward.bandwidth import kv_bytes_per_entry, latest, read_bandwidth, weight_bytes

from tests.core.helpers import eos_as, greedy, random_prompt, serve_all_greedy, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")


def test_weight_bytes_count_the_head_and_not_an_untied_embedding() -> None:
    model = copy.deepcopy(tiny_model("llama"))
    config = model.config
    embed = config.vocab_size * config.hidden_size * 4
    every = sum(p.numel() * 4 for p in model.parameters())
    tied = model.get_input_embeddings().weight is model.get_output_embeddings().weight
    assert weight_bytes(model) == (every if tied else every - embed)
    model.lm_head.weight = torch.nn.Parameter(model.model.embed_tokens.weight.detach().clone())  # untied
    assert weight_bytes(model) == sum(p.numel() * 4 for p in model.parameters()) - embed
    model.lm_head.weight = model.model.embed_tokens.weight  # tied: read once, as the head
    assert weight_bytes(model) == sum(p.numel() * 4 for p in model.parameters())  # parameters() dedupes ties


def test_kv_bytes_per_entry_is_k_and_v_of_every_layer() -> None:
    config = tiny_model("qwen2").config
    head_dim = config.hidden_size // config.num_attention_heads
    per_layer = 2 * config.num_key_value_heads * head_dim * 4  # K and V, fp32
    assert kv_bytes_per_entry(tiny_model("qwen2")) == config.num_hidden_layers * per_layer


def test_read_bandwidth_is_kept_as_the_latest() -> None:
    measured = read_bandwidth(nbytes=1 << 20, repeats=2)
    assert measured.bytes_per_s > 0 and measured.threads == torch.get_num_threads()
    assert latest() == measured


def test_a_profiled_step_books_its_weight_and_kv_reads(scheduler_of) -> None:
    model = tiny_model("llama")
    sched = scheduler_of(model, SchedulerConfig(calibrate=False, max_running=1))
    prof = sched.start_profile()
    prompt = random_prompt(random.Random(3))
    with eos_as(model, None):
        reqs = serve_all_greedy(sched, model, [prompt], [DecodingConfig(mode="none", max_new_tokens=10)])
    assert reqs[0].output == greedy(model, prompt, 10)  # profiling changes no token
    decode = prof.kinds["decode"]
    assert decode.steps >= 1
    assert decode.read["weights"] == decode.steps * weight_bytes(sched.backend.kernels.runner(1))
    per_entry = kv_bytes_per_entry(model)  # a decode step attends over the prompt and the output so far
    assert decode.steps * len(prompt) * per_entry < decode.read["kv"] <= decode.steps * (len(prompt) + 10) * per_entry
    measured = read_bandwidth(nbytes=1 << 20, repeats=1)
    floor = prof.report()["decode"]["floor"]
    nbytes = (decode.read["weights"] + decode.read["kv"]) / decode.steps
    assert floor["weights_mb"] + floor["kv_mb"] == pytest.approx(nbytes / 1e6)
    assert floor["machine_gb_per_s"] == pytest.approx(measured.gb_per_s)
    assert floor["floor_ms"] == pytest.approx(1000.0 * nbytes / measured.bytes_per_s)
    assert floor["x_floor"] == pytest.approx(floor["forward_ms"] / floor["floor_ms"])


def test_the_untied_head_multiplies_only_the_rows_a_step_keeps(scheduler_of) -> None:
    model = tiny_model("qwen2")  # qwen2: its own (untied) lm_head, the largest matrix of the real model
    assert model.get_output_embeddings().weight is not model.get_input_embeddings().weight
    sched = scheduler_of(model, SchedulerConfig(calibrate=False, max_running=1))
    rows: list[int] = []
    twins = sched.backend.modules()
    heads = {id(twin.get_output_embeddings()): twin.get_output_embeddings() for twin in twins}
    hooks = [head.register_forward_pre_hook(lambda _m, args: rows.append(args[0].shape[1])) for head in heads.values()]
    prompt = random_prompt(random.Random(5))
    try:
        with eos_as(model, None):
            serve_all_greedy(sched, model, [prompt], [DecodingConfig(mode="none", max_new_tokens=6)])
    finally:
        for hook in hooks:
            hook.remove()
    assert rows == [1] * 6  # the prompt's forward: its last row only; then one row a step
