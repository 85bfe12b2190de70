"""Layer split or tensor split as a decision: the tensor-parallel cost by hand, and the planner choosing
-sm tensor only where it decodes faster (seed 003 §7: not across unequal devices)."""
from __future__ import annotations

from pathlib import Path

import pytest

from planner.hardware.inventory import Backend, DeviceKind, DeviceSpec, HostSpec, Inventory
from planner.llama.context import model_context
from planner.llama.flags import parse_llama_flags
from planner.memory.estimate import estimate
from planner.registry.examples import resolve_model
from planner.search.result import PlanRequest, plan_argv
from planner.search.search import plan
from planner.speed.tensor_throughput import REDUCES_PER_LAYER, reduce_steps
from planner.speed.throughput import LOCAL_SPLIT_LATENCY_S
from planner.synth.shapes_common import write_shape

GIB = 1 << 30
HOST = HostSpec(64 * GIB, 60 * GIB, int(60e9), "test host", int(1e12))


def _gpu(name: str, bandwidth: float, link: float = 25e9) -> DeviceSpec:
    return DeviceSpec(name, DeviceKind.GPU, Backend.CUDA, 24 * GIB, 24 * GIB, int(bandwidth), int(71e12), int(link))


@pytest.fixture(scope="module")
def llama8b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_shape("llama-8b", tmp_path_factory.mktemp("tp"))


def test_reduce_steps_follow_the_butterfly():
    # log2 P exchange steps, + the fold and the copy back when N is not a power of two
    assert [reduce_steps(n) for n in (2, 3, 4, 5, 8)] == [1, 3, 2, 4, 3]


def test_two_equal_cards_split_by_tensor_and_the_cost_is_the_formula(llama8b: Path):
    inv = Inventory((_gpu("CUDA0", 936e9), _gpu("CUDA1", 936e9)), HOST)
    result = plan(str(llama8b), inv, PlanRequest(n_ctx=8192), with_explain=True)
    assert result.flags.split_mode == "tensor"
    assert "-sm" in plan_argv(result) and "tensor" in plan_argv(result)
    assert any("-sm tensor over 2 devices" in line and "chosen" in line for line in result.explain)
    # the printed flags, estimated again: each member within its budget
    est = estimate(str(llama8b), parse_llama_flags(plan_argv(result)[2:]), inv)
    assert [m.name for m in est.meta_members] == ["CUDA0", "CUDA1"]
    for m in est.meta_members:
        assert m.total_bytes <= result.budgets.devices[m.name]
    # by hand: each member streams half of the bytes the stages list; 2 reduces per layer of one
    # exchange step each (row = n_embd f32 over the 25 GB/s link + the hand-off latency); the input row
    # copied to both members once
    p = result.prediction
    n_layer, row = 32, 4096 * 4
    streamed = max(s.seconds_per_token for s in p.stages)
    assert streamed == pytest.approx(sum(s.bytes_per_token for s in p.stages) / 2 / 936e9, rel=1e-6)
    reduces = REDUCES_PER_LAYER * n_layer * (row / 25e9 + LOCAL_SPLIT_LATENCY_S)
    inputs = 2 * row / 25e9 + LOCAL_SPLIT_LATENCY_S
    host = sum(s.seconds_per_token for s in p.stages if s.device == "CPU")
    assert 1 / p.decode_tokens_s == pytest.approx(streamed + reduces + inputs + host, rel=1e-6)


def test_unequal_cards_keep_the_layer_split(llama8b: Path):
    # every layer waits for its slowest member: a 300 GB/s card halves nothing for a 936 GB/s one
    inv = Inventory((_gpu("CUDA0", 936e9), _gpu("CUDA1", 300e9)), HOST)
    result = plan(str(llama8b), inv, PlanRequest(n_ctx=8192), with_explain=True)
    assert result.flags.split_mode == "layer"
    assert any("-sm tensor over 2 devices" in line and "slower to decode" in line for line in result.explain)


def test_a_model_llama_cpp_cannot_run_split_by_tensor_says_why():
    gemma = model_context(resolve_model("example:gemma3-270m"))
    inv = Inventory((_gpu("CUDA0", 936e9), _gpu("CUDA1", 936e9)), HOST)
    result = plan(gemma, inv, PlanRequest(n_ctx=4096), with_explain=True)
    assert result.flags.split_mode == "layer"
    assert any(line.startswith("-sm tensor: not possible") and "ggml-backend-meta.cpp:543" in line
               for line in result.explain)
