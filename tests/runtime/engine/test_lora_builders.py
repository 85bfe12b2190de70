"""Applied LoRA adapters in the builders of their own matmuls: experts (runtime/engine/moe.py and
deepseek2's MoE), granitehybrid, lfm2, qwen3next and deepseek2 (MlaBuilder).

llama.cpp adds four nodes per applied pair wherever a model multiplies through build_lora_mm
(mul_mat(A, x), mul_mat(B, .), scale, add) or build_lora_mm_id for the experts (mul_mat_id, mul_mat_id,
scale, add: src/llama-graph.cpp, build_moe_ffn's router and up/gate/down experts), and on the token
rows (build_inp_embd). Which weights go through them is read off src/models/<arch>.cpp (and
mamba-base.cpp for granitehybrid's Mamba-2 layers): every projection of these builders, except
deepseek2's attention projections (q_a, q_b, kv_a_mqa, k_b, v_b) and its main graph's lm_head, which
are plain ggml_mul_mat, and the convolution kernels (ssm_conv1d, shortconv.conv: ggml_ssm_conv). A pair
on such a weight adds nothing. Tied models (no output.weight) get no token_embd pair: llama.cpp aborts
on it (tests/peer/test_lora_peer.py). Without adapters the graphs are the same node for node (the rest
of tests/runtime checks them as they were).
"""
from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as Q

from planner.llama.flags import parse_llama_flags
from planner.synth.gguf_factory import (
    ModelSpec,
    deepseek2_spec,
    granitehybrid_spec,
    lfm2_spec,
    qwen3moe_spec,
)
from planner.synth.lora_factory import LoraTensor, write_lora
from planner.synth.qwen3next_factory import qwen3next_spec
from planner.synth.tiny_models import write_random
from runtime.engine.runner import ModelRunner

RANK = 4
NODES_PER_PAIR = 4
# src/models/deepseek2.cpp multiplies these with ggml_mul_mat: adapters do not reach them
DEEPSEEK2_PLAIN = ("attn_q_a", "attn_q_b", "attn_kv_a_mqa", "attn_k_b", "attn_v_b")
# kernels of ggml_ssm_conv (mamba-base.cpp, qwen3next.cpp, lfm2.cpp), never a matmul's weight
CONV_WEIGHTS = ("ssm_conv1d", "shortconv.conv")
TOKEN_EMBD, OUTPUT = "token_embd.weight", "output.weight"
SKIPPED_SUFFIX = "_norm.weight"   # llama-adapter.cpp skips norms


def _pairs(name: str, shape: tuple[int, ...]) -> list[LoraTensor]:
    """A rank-4 F32 pair of the ggml shape llama-adapter.cpp accepts: A [ne0, r, ...], B [r, ne1, ...]
    (an expert stack keeps its third dimension; token_embd's halves are flipped)."""
    ne0, ne1, rest = shape[0], shape[1] if len(shape) > 1 else 1, tuple(shape[2:])
    a: tuple[int, ...]
    b: tuple[int, ...]
    if name == TOKEN_EMBD:
        a, b = (RANK, ne1), (RANK, ne0)
    else:
        a, b = (ne0, RANK, *rest), (RANK, ne1, *rest)
    return [LoraTensor(name + ".lora_a", a, Q.F32), LoraTensor(name + ".lora_b", b, Q.F32)]


def _patched(spec: ModelSpec) -> list[tuple[str, tuple[int, ...]]]:
    """Every matrix of the model (2-D or an expert stack), norms and vectors aside; token_embd only
    when the output is not tied to it."""
    tied = all(n != OUTPUT for n, _q, _s in spec.tensors)
    return [(n, tuple(shape)) for n, _q, shape in spec.tensors
            if n.endswith(".weight") and not n.endswith(SKIPPED_SUFFIX) and len(shape) >= 2 and shape[1] > 1
            and not (tied and n == TOKEN_EMBD)]


SPECS = {
    "qwen3moe": lambda: qwen3moe_spec(n_layer=2, n_embd=128, n_head=4, head_dim=32, n_expert=4, n_ff_exp=64,
                                      n_vocab=256),
    "granitehybrid": lambda: granitehybrid_spec(n_vocab=256),
    "lfm2": lambda: lfm2_spec(n_vocab=256),
    "qwen3next": lambda: qwen3next_spec(n_vocab=256),
    "deepseek2": lambda: deepseek2_spec(n_layer=2, n_embd=128, n_ff=256, n_vocab=256),
}


def _expected(arch: str, name: str) -> bool:
    """Whether llama.cpp's graph applies a pair on this weight."""
    if any(f".{c}." in name for c in CONV_WEIGHTS):
        return False
    if arch == "deepseek2":
        return name != OUTPUT and not any(f".{p}." in name for p in DEEPSEEK2_PLAIN)
    return True


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, tuple[Path, Path, int, list[str]]]:
    """arch -> (model, adapter, applied pairs expected, pairs llama.cpp leaves out)."""
    d = tmp_path_factory.mktemp("lora-builders")
    out = {}
    for arch, make in SPECS.items():
        spec = make()
        bases = _patched(spec)
        tensors = [t for n, s in bases for t in _pairs(n, s)]
        model = write_random(d / f"{arch}.gguf", spec, all_f32=True)
        adapter = write_lora(d / f"{arch}-lora.gguf", arch, tensors, alpha=8.0, seed=5)
        applied = sum(_expected(arch, n) for n, _s in bases)
        out[arch] = (model, adapter, applied, sorted(n for n, _s in bases if not _expected(arch, n)))
    return out


def _runner(model: Path, argv: list[str]) -> ModelRunner:
    return ModelRunner.load(str(model), parse_llama_flags(["-c", "256", "-ub", "64", "-b", "64", *argv]),
                            weights=False)


@pytest.mark.parametrize("arch", list(SPECS))
def test_four_nodes_per_pair_where_llama_cpp_applies_it(models, arch):
    model, adapter, applied, plain = models[arch]
    base = _runner(model, []).reserve_report
    with_lora = _runner(model, ["--lora", str(adapter)])
    report = with_lora.reserve_report
    assert base is not None and report is not None
    assert applied > 0
    assert report.n_nodes_pp - base.n_nodes_pp == NODES_PER_PAIR * applied
    assert report.n_nodes_tg - base.n_nodes_tg == NODES_PER_PAIR * applied
    assert with_lora.adapters.unreached() == plain


def test_experts_pair_is_a_mul_mat_id_of_the_selected_experts(models):
    """build_lora_mm_id: the pair's halves are multiplied by mul_mat_id with the router's choice."""
    model, adapter, _applied, _plain = models["qwen3moe"]
    runner = _runner(model, ["--lora", str(adapter)])
    pp = next(iter(runner._graphs.values())).graph
    ids_of: dict[str, str] = {}
    for n in pp.nodes:
        w, ids = n.src[0], n.src[2] if len(n.src) > 2 else None
        if n.op.value == "MUL_MAT_ID" and w is not None and ids is not None and w.name.endswith((".lora_a", ".lora_b")):
            ids_of[w.name] = ids.name
    assert {"blk.0.ffn_up_exps.weight.lora_a", "blk.0.ffn_up_exps.weight.lora_b",
            "blk.1.ffn_down_exps.weight.lora_b"} <= set(ids_of)
    # ids: the same top-k view the expert product uses
    assert all(name.startswith("ffn_moe_topk-") for name in ids_of.values()), ids_of
