"""The deepseek2 MLA builder (runtime/engine/deepseek2.py) on tiny real-weight files: llama.cpp's node
counts and op order, the K-only cache, admission by the reserve, and the logits against an
independent float64 forward pass written here from the MLA definition (latent KV, decoupled RoPE,
shared plus routed experts), not from the runtime.

Node counts and op sequences come from llama.cpp: `GGML_SCHED_DEBUG=2 llama-fit-params -v -c 256
[-fa off]` on these very files (`graph: nodes = N` and the node list of the prompt reserve).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import Keys

from planner.core.errors import BadInput
from planner.llama.context import model_context
from planner.llama.flags import parse_llama_flags
from planner.llama.settings import resolve_settings
from planner.synth.gguf_factory import ModelSpec, add_tokenizer, deepseek2_lite_layout, deepseek2_spec
from planner.synth.tiny_models import write_random
from runtime.engine.deepseek2 import MlaHParams
from runtime.engine.reserve import supported
from runtime.engine.runner import ModelRunner
from runtime.ggml.debug import op_desc
from runtime.ggml.graph import VIEW_OPS
from tests.support.reference import float64_weights, rms_norm

TOKENS = [1, 5, 9, 200, 3, 7, 11, 13, 17, 19]
RPC2 = ["--rpc", "127.0.0.1:50001,127.0.0.1:50002"]


def _specs() -> dict[str, ModelSpec]:
    lora = deepseek2_spec(n_vocab=512)   # 3 layers, the first dense; q_lora 128, kv_lora 128, rope 32
    lite = deepseek2_lite_layout(
        deepseek2_spec(n_layer=26, n_embd=128, n_head=2, q_lora_rank=64, kv_lora_rank=64, qk_nope=32, qk_rope=32,
                       v_head_dim=32, n_ff=256, n_ff_exp=32, n_vocab=512),
        n_embd=128, n_head=2, head_k=64)
    # V3-style routing on the same layout: sigmoid gating, normalised and scaled weights
    v3 = deepseek2_spec(n_vocab=512)
    v3.metadata.update({Keys.LLM.EXPERT_GATING_FUNC: 2, Keys.LLM.EXPERT_WEIGHTS_NORM: True,
                        Keys.LLM.EXPERT_WEIGHTS_SCALE: 2.5})
    for spec in (lora, lite, v3):
        add_tokenizer(spec, 512, n_merges=1)
    return {"lora": lora, "lite": lite, "v3": v3}


def _write(path: Path, spec: ModelSpec, all_f32: bool, seed: int = 0) -> Path:
    """The spec's layout with random weights (normal, 0.5 / sqrt(fan-in); norms near 1)."""
    return write_random(path, spec, all_f32, seed)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("deepseek2")
    out = {}
    for name, spec in _specs().items():
        out[name] = _write(d / f"{name}.gguf", spec, all_f32=False)
        out[f"{name}-f32"] = _write(d / f"{name}-f32.gguf", spec, all_f32=True)
    return out


# llama-fit-params -v -c 256 [-fa off]: "graph: nodes = N" (the prompt and the token graph agree)
LLAMA_CPP_NODES = {"lora": (175, 181), "lite": (1523, 1575), "v3": (187, 193)}
# ... and "CPU compute buffer size = X MiB" (printed %.2f)
LLAMA_CPP_COMPUTE_MIB = {"lora": ("2.50", "3.75"), "lite": ("1.32", "1.63"), "v3": ("2.50", "3.75")}
# The non-view nodes of layer 1 (routed plus shared experts) in the prompt reserve, by position
# from the layer's first node, from the GGML_SCHED_DEBUG=2 node list of the "lora" file.
LAYER1_FA = ("0:RMS_NORM 1:MUL 2:MUL_MAT 3:RMS_NORM 4:MUL 5:MUL_MAT 9:MUL_MAT 12:ROPE 13:CONCAT 14:MUL_MAT "
             "16:RMS_NORM 17:MUL 20:ROPE 21:CONCAT 23:SET_ROWS 30:FLASH_ATTN_EXT 32:MUL_MAT 34:CONT 36:MUL_MAT "
             "37:ADD 38:RMS_NORM 39:MUL 40:MUL_MAT 41:SOFT_MAX 43:ADD 44:ARGSORT 46:GET_ROWS 48:MUL_MAT_ID "
             "49:MUL_MAT_ID 50:SWIGLU 51:MUL_MAT_ID 52:MUL 55:ADD 56:MUL_MAT 57:MUL_MAT 58:SWIGLU 59:MUL_MAT "
             "60:ADD 61:ADD")
LAYER1_NO_FA = ("0:RMS_NORM 1:MUL 2:MUL_MAT 3:RMS_NORM 4:MUL 5:MUL_MAT 9:MUL_MAT 12:ROPE 13:CONCAT 14:MUL_MAT "
                "16:RMS_NORM 17:MUL 20:ROPE 21:CONCAT 23:SET_ROWS 28:CONT 32:MUL_MAT 33:SOFT_MAX 34:MUL_MAT "
                "35:MUL_MAT 37:CONT 38:MUL_MAT 39:ADD 40:RMS_NORM 41:MUL 42:MUL_MAT 43:SOFT_MAX 45:ADD 46:ARGSORT "
                "48:GET_ROWS 50:MUL_MAT_ID 51:MUL_MAT_ID 52:SWIGLU 53:MUL_MAT_ID 54:MUL 57:ADD 58:MUL_MAT "
                "59:MUL_MAT 60:SWIGLU 61:MUL_MAT 62:ADD 63:ADD")


def _runner(path: Path, *flags: str) -> ModelRunner:
    return ModelRunner.load(str(path), parse_llama_flags(["-c", "256", *flags]))


@pytest.mark.parametrize("name", list(LLAMA_CPP_NODES))
def test_node_counts_and_compute_buffer_equal_llama_cpp(name: str, models: dict[str, Path]) -> None:
    fa, no_fa = _runner(models[name]).reserve_report, _runner(models[name], "-fa", "off").reserve_report
    assert fa is not None and no_fa is not None
    assert (fa.n_nodes_pp, fa.n_nodes_tg) == (LLAMA_CPP_NODES[name][0],) * 2
    assert (no_fa.n_nodes_pp, no_fa.n_nodes_tg) == (LLAMA_CPP_NODES[name][1],) * 2
    mib = tuple(f"{r.compute_bytes['CPU'] / 2**20:.2f}" for r in (fa, no_fa))
    assert mib == LLAMA_CPP_COMPUTE_MIB[name]


@pytest.mark.parametrize("fa, expected", [("on", LAYER1_FA), ("off", LAYER1_NO_FA)])
def test_layer_op_order_equals_llama_cpp(fa: str, expected: str, models: dict[str, Path]) -> None:
    runner = _runner(models["lora"], "-fa", fa)
    nodes = runner.sched._graph.nodes   # the last reserved graph: the prompt's
    start = next(i for i, t in enumerate(nodes) if t.name == "l_out-0") + 1
    end = next(i for i, t in enumerate(nodes) if t.name == "l_out-1")
    ops = " ".join(f"{i - start}:{op_desc(t)}" for i, t in enumerate(nodes[start:end + 1], start)
                   if t.op not in VIEW_OPS)
    assert ops == expected


def test_the_cache_holds_k_only(models: dict[str, Path]) -> None:
    """One head of kv_lora_rank + n_rot per cell and no V (llama-kv-cache.cpp: has_v = !is_mla)."""
    runner = _runner(models["lora"], "-fa", "off")
    assert isinstance(runner.hp, MlaHParams)
    cells, layers, width = 256, 3, 128 + 32
    assert runner.kv_bytes == {"CPU": layers * cells * width * 2}


def test_the_reserve_admits_mla_files(models: dict[str, Path]) -> None:
    settings = resolve_settings(model_context(str(models["lora"])), parse_llama_flags(["-c", "256"]), None)
    assert supported(settings)


@pytest.mark.parametrize("name", ["lora", "lite"])
@pytest.mark.parametrize("fa", ["on", "off"])
def test_logits_match_an_independent_forward_pass(name: str, fa: str, models: dict[str, Path]) -> None:
    """f32 weights; the roundings left are the f16 cache and flash attention's f16 work."""
    runner = _runner(models[f"{name}-f32"], "-fa", fa)
    got = runner.decode(TOKENS, all_logits=True)
    ref = reference_logits(models[f"{name}-f32"], _specs()[name], TOKENS)
    assert np.abs(got - ref).max() <= 5e-3 * np.abs(ref).max()   # measured: 6e-4


def test_split_run_equals_single_device(models: dict[str, Path]) -> None:
    single = _runner(models["lora"], "-ngl", "0")
    split = _runner(models["lora"], *RPC2, "-ts", "1,1")
    ref = np.concatenate([single.decode(TOKENS), single.decode([42])])
    got = np.concatenate([split.decode(TOKENS), split.decode([42])])
    assert split.steps[0].measurement.n_splits > 1
    assert np.array_equal(got, ref)


def test_sigmoid_gating_is_sized_not_decoded(models: dict[str, Path]) -> None:
    """The runtime has no SIGMOID kernel: V3-style routing is reserved (node counts above), not run."""
    runner = _runner(models["v3-f32"])
    with pytest.raises(BadInput, match="SIGMOID"):
        runner.decode(TOKENS)


def test_yarn_files_are_sized_not_decoded(models: dict[str, Path], tmp_path: Path) -> None:
    spec = _specs()["lora"]
    spec.metadata.update({Keys.Rope.SCALING_TYPE: "yarn", Keys.Rope.SCALING_FACTOR: 40.0,
                          Keys.Rope.SCALING_ORIG_CTX_LEN: 4096, Keys.Rope.SCALING_YARN_LOG_MUL: 0.0707})
    runner = _runner(_write(tmp_path / "yarn.gguf", spec, all_f32=False))
    assert runner.reserve_report is not None and runner.reserve_report.n_nodes_pp == LLAMA_CPP_NODES["lora"][0]
    with pytest.raises(BadInput, match="YaRN"):
        runner.decode(TOKENS)


# --- an independent float64 forward pass ------------------------------------------------------

def _rope(x: np.ndarray, pos: np.ndarray, base: float = 10000.0) -> np.ndarray:
    """x (T, H, D): adjacent pairs (2i, 2i+1) rotated by pos * base^(-2i/D) (deepseek2 uses NORM RoPE)."""
    d = x.shape[-1]
    theta = pos[:, None, None] * base ** (-np.arange(0, d, 2) / d)[None, None, :]
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = a * np.cos(theta) - b * np.sin(theta), a * np.sin(theta) + b * np.cos(theta)
    return out


def _swiglu_ffn(h: np.ndarray, up: np.ndarray, gate: np.ndarray, down: np.ndarray) -> np.ndarray:
    g = h @ gate.T
    return (g / (1 + np.exp(-g)) * (h @ up.T)) @ down.T


def _mla(h: np.ndarray, w: dict[str, np.ndarray], p: str, meta: dict, pos: np.ndarray) -> np.ndarray:
    """Attention over the latent: scores q_nope . (W_uk c) + q_pe . k_pe, values W_uv (softmax . c)."""
    n_head, r, rope = meta["n_head"], meta["kv_lora"], meta["rope"]
    if p + "attn_q.weight" in w:
        q = h @ w[p + "attn_q.weight"].T
    else:
        q = rms_norm(h @ w[p + "attn_q_a.weight"].T, w[p + "attn_q_a_norm.weight"]) @ w[p + "attn_q_b.weight"].T
    t = len(h)
    q = q.reshape(t, n_head, -1)
    q_nope, q_pe = q[..., : -rope], _rope(q[..., -rope:], pos)
    kv = h @ w[p + "attn_kv_a_mqa.weight"].T
    c = rms_norm(kv[:, :r], w[p + "attn_kv_a_norm.weight"])               # (T, r): the cached latent
    k_pe = _rope(kv[:, None, r:], pos)[:, 0]                           # (T, rope), shared by every head
    k_nope = np.einsum("hrn,sr->shn", w[p + "attn_k_b.weight"], c)     # (S, H, nope): W_uk c per head
    s = (np.einsum("thn,shn->hts", q_nope, k_nope) + np.einsum("thd,sd->hts", q_pe, k_pe)) / np.sqrt(q.shape[-1])
    s = np.where(np.tril(np.ones((t, t), bool))[None], s, -np.inf)
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    v = np.einsum("hvr,sr->shv", w[p + "attn_v_b.weight"], c)          # (S, H, v_head): W_uv c per head
    return np.einsum("hts,shv->thv", a, v).reshape(t, -1) @ w[p + "attn_output.weight"].T


def _moe(h: np.ndarray, w: dict[str, np.ndarray], p: str, meta: dict) -> np.ndarray:
    logits = h @ w[p + "ffn_gate_inp.weight"].T
    if meta["sigmoid"]:
        probs = 1 / (1 + np.exp(-logits))
    else:
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
    choice = probs + w[p + "exp_probs_b.bias"]     # the bias picks the experts, the weights stay unbiased
    out = np.zeros_like(h)
    for i in range(len(h)):
        top = np.argsort(-choice[i], kind="stable")[: meta["k"]]
        weights = probs[i, top] / (probs[i, top].sum() if meta["norm"] else 1.0) * meta["scale"]
        for e, g in zip(top, weights, strict=True):
            out[i] += g * _swiglu_ffn(h[i:i + 1], w[p + "ffn_up_exps.weight"][e], w[p + "ffn_gate_exps.weight"][e],
                                      w[p + "ffn_down_exps.weight"][e])[0]
    return out + _swiglu_ffn(h, w[p + "ffn_up_shexp.weight"], w[p + "ffn_gate_shexp.weight"],
                             w[p + "ffn_down_shexp.weight"])


def reference_logits(path: Path, spec: ModelSpec, tokens: list[int],
                     weights: dict[str, np.ndarray] | None = None) -> np.ndarray:
    """`weights`: the file's tensors as float64_weights reads them, where a caller rearranges them first."""
    m = spec.metadata
    meta = {"n_head": m[Keys.Attention.HEAD_COUNT], "kv_lora": m[Keys.Attention.KV_LORA_RANK],
            "rope": m[Keys.Rope.DIMENSION_COUNT], "k": m[Keys.LLM.EXPERT_USED_COUNT],
            "sigmoid": m.get(Keys.LLM.EXPERT_GATING_FUNC) == 2, "norm": bool(m.get(Keys.LLM.EXPERT_WEIGHTS_NORM)),
            "scale": m.get(Keys.LLM.EXPERT_WEIGHTS_SCALE, 1.0)}
    w = weights if weights is not None else float64_weights(path)
    x = w["token_embd.weight"][tokens]
    pos = np.arange(len(tokens), dtype=np.float64)
    for il in range(m[Keys.LLM.BLOCK_COUNT]):
        p = f"blk.{il}."
        x = x + _mla(rms_norm(x, w[p + "attn_norm.weight"]), w, p, meta, pos)
        h = rms_norm(x, w[p + "ffn_norm.weight"])
        if il < m[Keys.LLM.LEADING_DENSE_BLOCK_COUNT]:
            x = x + _swiglu_ffn(h, w[p + "ffn_up.weight"], w[p + "ffn_gate.weight"], w[p + "ffn_down.weight"])
        else:
            x = x + _moe(h, w, p, meta)
    return rms_norm(x, w["output_norm.weight"]) @ w["output.weight"].T
