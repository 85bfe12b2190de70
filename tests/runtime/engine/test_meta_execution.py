"""A llama graph run tensor-parallel on a meta device of N numpy members gives the single-device
logits (issue #20): the weights split as llama_meta_device_get_split_state splits them, the graph
cut at its PARTIAL nodes, an AllReduce after each attention output and FFN down projection.

The reference is the runner on the CPU; the meta run re-executes the very graph the runner built,
with the inputs it was given. Sums over members change the float order, so the check is the
brief's: the same top-1 token everywhere and max |delta| <= 1e-3 x max |logit|.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from planner.llama.flags import parse_llama_flags
from planner.synth.tiny_models import Dims, write_tiny
from runtime.engine.runner import ModelRunner
from runtime.engine.tensor_split import LlamaTensorSplit
from runtime.ggml import build as B
from runtime.ggml.allreduce import reduce_schedule
from runtime.ggml.backend import make_virtual
from runtime.ggml.graph import GGMLType, Graph, Op
from runtime.ggml.meta import SplitAxis
from runtime.ggml.meta_device import MetaBackend, MetaDevice

PROMPT = [1, 5, 9, 33, 7, 100, 42]
# 6 query heads in 3 KV groups: 2 and 4 members cannot share them evenly (the head-count rounding);
# n_ff 384 is three of the FFN's 128-element slices
DIMS = {"default": Dims(), "odd-heads": Dims(n_embd=64, n_head=6, n_head_kv=3, head_dim=16, n_ff=384)}
# MoE: experts' FFN of two 128-slices, so two members both contribute to the expert sum (and, in
# gpt-oss, to its PARTIAL ffn_down_exps.bias, which each contributor holds a share of)
MOE = {"qwen3moe": Dims(n_ff_exp=256), "gpt-oss": Dims(n_ff_exp=256)}


class Captured:
    """The graph and inputs of the runner's last compute (a spy on Scheduler.compute)."""

    def __init__(self, runner: ModelRunner) -> None:
        self.graph: Graph | None = None
        self.inputs: dict[Any, Any] = {}
        inner = runner.sched.compute

        def spy(graph, inputs=None):
            self.graph, self.inputs = graph, dict(inputs or {})
            return inner(graph, inputs)

        runner.sched.compute = spy  # type: ignore[method-assign]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("meta")
    out = {name: write_tiny(d / f"llama-{name}.gguf", "llama", dims) for name, dims in DIMS.items()}
    out.update({arch: write_tiny(d / f"{arch}.gguf", arch, dims) for arch, dims in MOE.items()})
    return out


def _meta_logits(runner: ModelRunner, cap: Captured, n: int) -> tuple[np.ndarray, MetaBackend]:
    assert cap.graph is not None
    members = [make_virtual(f"GPU{j}", 1 << 30) for j in range(n)]
    meta = MetaBackend(MetaDevice(members), LlamaTensorSplit(runner.hp, runner.weights, n))
    run = meta.run(cap.graph.nodes, cap.inputs)
    logits = cap.graph.nodes[-1]
    assert logits.name == "result_output"
    # two reduces per layer (attention output, FFN down), each of the [n_embd, n_tokens] f32 residual
    n_tokens = logits.ne[1]
    assert len(run.reduces) == 2 * runner.hp.n_layer
    per_reduce = sum(s.bytes_moved for s in reduce_schedule(n, runner.hp.n_embd * n_tokens * 4))
    assert run.reduced_bytes == 2 * runner.hp.n_layer * per_reduce
    # the logits come out split over the vocabulary (output.weight by rows)
    assert meta.slices is not None and meta.slices.resolver.state(logits).axis is SplitAxis.AXIS_0
    return meta.gather(logits).reshape(n_tokens, runner.hp.n_vocab), meta


def _close(got: np.ndarray, ref: np.ndarray) -> None:
    assert np.array_equal(got.argmax(-1), ref.argmax(-1))
    assert np.abs(got - ref).max() <= 1e-3 * np.abs(ref).max()


@pytest.mark.parametrize("dims", list(DIMS))
@pytest.mark.parametrize("n", [2, 3, 4])
def test_meta_logits_equal_single_device(models: dict[str, Path], dims: str, n: int) -> None:
    runner = ModelRunner.load(str(models[dims]), parse_llama_flags(["-c", "256", "-ngl", "0"]))
    cap = Captured(runner)
    ref = runner.decode(PROMPT, all_logits=True)
    got, _ = _meta_logits(runner, cap, n)
    _close(got, ref)
    # one more token over the cache the prompt filled: the single-token graph (T = 1 reshapes)
    ref1 = runner.decode([int(ref[-1].argmax())], all_logits=True)
    got1, _ = _meta_logits(runner, cap, n)
    _close(got1, ref1)


@pytest.mark.parametrize("arch", list(MOE))
@pytest.mark.parametrize("n", [2, 3])
def test_moe_logits_equal_single_device_with_the_reduce_after_the_expert_sum(
        models: dict[str, Path], arch: str, n: int) -> None:
    runner = ModelRunner.load(str(models[arch]), parse_llama_flags(["-c", "256", "-ngl", "0"]))
    cap = Captured(runner)
    ref = runner.decode(PROMPT, all_logits=True)
    got, meta = _meta_logits(runner, cap, n)
    _close(got, ref)
    assert cap.graph is not None and meta.slices is not None
    nodes = cap.graph.nodes
    # the expert down projection is PARTIAL, but the reduce waits for the weighted view-and-add tree
    down = next(t for t in nodes if t.name == "ffn_moe_down-0")
    assert meta.slices.resolver.state(down).axis is SplitAxis.PARTIAL
    assert meta.last_run is not None
    assert [nodes[s.stop - 1].name for s in meta.last_run.cut.subgraphs] == [
        "attn_out-0", "ffn_moe_out-0", "attn_out-1", "ffn_moe_out-1", "result_output"]


def test_members_with_empty_slices_compute_nothing_of_them(models: dict[str, Path]) -> None:
    # default dims over 4 members: 2 KV groups leave two members without attention heads in each
    # layer, and n_ff = 128 (one 128-slice) leaves three without FFN rows
    runner = ModelRunner.load(str(models["default"]), parse_llama_flags(["-c", "256", "-ngl", "0"]))
    cap = Captured(runner)
    ref = runner.decode(PROMPT, all_logits=True)
    got, meta = _meta_logits(runner, cap, 4)
    _close(got, ref)
    assert meta.slices is not None
    resolver = meta.slices.resolver
    ffn_down = runner.weights["blk.0.ffn_down.weight"]
    counts = resolver.state(ffn_down).totals()
    assert sorted(counts) == [0, 0, 0, 128]
    q = resolver.state(runner.weights["blk.0.attn_q.weight"]).totals()
    assert sorted(q) == [0, 0, 64, 64]   # 2 groups of 2 heads x 32


def test_the_meta_device_delegates_to_its_members() -> None:
    members = [make_virtual(f"GPU{j}", (j + 1) << 20) for j in range(3)]
    dev = MetaDevice(members)
    assert dev.name == "Meta(GPU0,GPU1,GPU2)"
    assert dev.memory().total == (1 + 2 + 3) << 20
    # an op is supported only where every member supports it
    picky = MetaDevice([*members, make_virtual("GPU3", 1 << 20, ops=[Op.MUL_MAT])])
    x = B.new_tensor(GGMLType.F32, [8, 4], "x")
    norm = B.rms_norm(x, 1e-5, "n")
    assert dev.supports_op(norm) and not picky.supports_op(norm)


def test_head_counts_that_do_not_divide_round_to_whole_kv_groups_and_rotate(models: dict[str, Path]) -> None:
    # 6 heads of 16 in 3 KV groups of 2 over 2 members: one group's Q is 32 rows, a multiple of
    # Q8_0's block (attn_output's type), so Q's 96 rows cut at 48 -> 32: 32 + 64, K's 48 at 24 -> 16;
    # layer 1 rotates by one member, so the short piece moves to member 1
    runner = ModelRunner.load(str(models["odd-heads"]), parse_llama_flags(["-c", "256", "-ngl", "0"]))
    split = LlamaTensorSplit(runner.hp, runner.weights, 2)
    w = runner.weights
    assert split(w["blk.0.attn_q.weight"]).totals() == (32, 64)
    assert split(w["blk.0.attn_k.weight"]).totals() == (16, 32)
    assert split(w["blk.0.attn_output.weight"]).totals() == (32, 64)
    assert split(w["blk.1.attn_q.weight"]).totals() == (64, 32)
    assert split(w["blk.1.attn_k.weight"]).totals() == (32, 16)
    # FFN in 128-slices: 384 cut at 192 -> 128; the output rows (256) at 128, rotated by n_layer % 2 = 0
    assert split(w["blk.0.ffn_up.weight"]).totals() == (128, 256)
    assert split(w["output.weight"]).totals() == (128, 128)
    assert split(w["blk.0.attn_norm.weight"]).axis is SplitAxis.MIRRORED
    assert split(w["token_embd.weight"]).axis is SplitAxis.MIRRORED
