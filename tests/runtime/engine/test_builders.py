"""Graph builders on tiny real-weight models: llama.cpp's node counts, the math against an
independent float64 forward pass, and split runs equal to single-device runs.

Node counts come from llama.cpp (llama-fit-params -v on these very files, `graph: nodes = N`;
tests/peer/test_validate_peer.py re-checks them live). The reference forward is written here
from the architectures' definitions (RMSNorm, RoPE, GQA attention, SwiGLU / GeGLU, top-k
routing, gemma2's soft-capping, gpt-oss's sinks, biases and clamped SwiGLU), not from the runtime.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from planner.llama.flags import parse_llama_flags
from planner.synth.tiny_models import Dims, write_tiny
from runtime.engine.runner import ModelRunner
from tests.support.reference import float64_weights, rms_norm

ARCHS = ("llama", "qwen2", "qwen3", "qwen3moe", "gemma2", "gemma3", "gpt-oss")
# llama-fit-params -v -c 256 [-fa off] on write_tiny(arch, DIMS[arch]) files: "graph: nodes = N"
LLAMA_CPP_NODES = {"llama": (68, 78), "qwen2": (74, 84), "qwen3": (76, 86), "qwen3moe": (108, 118), "gemma3": (87, 97),
                   "gemma2": (82, 98), "gpt-oss": (109, 119)}
# qwen2's Q projection is n_embd wide in llama.cpp (src/models/qwen2.cpp): 2 heads of 32
DIMS = {"qwen2": Dims(n_head=2, n_head_kv=1)}
TOKENS = [1, 5, 9, 200, 3, 7, 11, 13, 17, 19, 23, 29]   # 12 tokens: past gemma3's window of 8
RPC2 = ["--rpc", "127.0.0.1:50001,127.0.0.1:50002"]
RPC3 = ["--rpc", "127.0.0.1:50001,127.0.0.1:50002,127.0.0.1:50003"]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("tiny")
    out = {a: write_tiny(d / f"{a}.gguf", a, DIMS.get(a, Dims())) for a in ARCHS}
    out.update({f"{a}-f32": write_tiny(d / f"{a}-f32.gguf", a, DIMS.get(a, Dims()), all_f32=True) for a in ARCHS})
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_node_counts_equal_llama_cpp(arch: str, models: dict[str, Path]) -> None:
    fa = ModelRunner.load(str(models[arch]), parse_llama_flags(["-c", "256"])).reserve_report
    no_fa = ModelRunner.load(str(models[arch]), parse_llama_flags(["-c", "256", "-fa", "off"])).reserve_report
    assert fa is not None and no_fa is not None
    assert (fa.n_nodes_pp, fa.n_nodes_tg) == (LLAMA_CPP_NODES[arch][0],) * 2
    assert (no_fa.n_nodes_pp, no_fa.n_nodes_tg) == (LLAMA_CPP_NODES[arch][1],) * 2


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("flags", [RPC2 + ["-ngl", "2", "-ts", "1,1"], RPC3 + ["-ts", "1,1,1"],
                                   RPC2 + ["-nkvo", "-fa", "off"], RPC2 + ["-ot", r"blk\.0\.ffn_.*=CPU"]],
                         ids=["ngl2-ts11", "three-devices", "nkvo-fa-off", "ot-ffn0-cpu"])
def test_split_run_equals_single_device(arch: str, flags: list[str], models: dict[str, Path]) -> None:
    fa_off = ["-fa", "off"] if "off" in flags else []
    single = ModelRunner.load(str(models[arch]), parse_llama_flags(["-c", "256", "-ngl", "0", *fa_off]))
    split = ModelRunner.load(str(models[arch]), parse_llama_flags(["-c", "256", *flags]))
    ref = np.concatenate([single.decode(TOKENS, True), single.decode([42], True)])
    got = np.concatenate([split.decode(TOKENS, True), split.decode([42], True)])
    assert split.steps[0].measurement.n_splits > 1
    assert np.array_equal(got, ref)


# --- an independent float64 forward pass ------------------------------------------------------

def _rope(x: np.ndarray, pos: np.ndarray, base: float, neox: bool) -> np.ndarray:
    """x (T, H, D): rotate pairs (2i, 2i+1), or (i, i + D/2) for NEOX, by pos * base^(-2i/D)."""
    d = x.shape[-1]
    theta = pos[:, None, None] * base ** (-np.arange(0, d, 2) / d)[None, None, :]
    a, b = (x[..., : d // 2], x[..., d // 2:]) if neox else (x[..., 0::2], x[..., 1::2])
    ra, rb = a * np.cos(theta) - b * np.sin(theta), a * np.sin(theta) + b * np.cos(theta)
    out = np.empty_like(x)
    if neox:
        out[..., : d // 2], out[..., d // 2:] = ra, rb
    else:
        out[..., 0::2], out[..., 1::2] = ra, rb
    return out


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, window: int, softcap: float = 0.0,
               sinks: np.ndarray | None = None) -> np.ndarray:
    """Causal GQA attention; softcap: scores -> cap * tanh(scores / cap); sinks: one extra logit per
    head that takes a share of the softmax and attends to nothing."""
    t, h, hd = q.shape
    k, v = np.repeat(k, h // k.shape[1], axis=1), np.repeat(v, h // v.shape[1], axis=1)
    s = np.einsum("thd,shd->hts", q, k) * scale
    if softcap:
        s = softcap * np.tanh(s / softcap)
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    visible = (j <= i) & ((i - j < window) if window else True)
    s = np.where(visible[None], s, -np.inf)
    top = s.max(-1, keepdims=True)
    if sinks is not None:
        top = np.maximum(top, sinks[:, None, None])
    p = np.exp(s - top)
    total = p.sum(-1, keepdims=True) + (np.exp(sinks[:, None, None] - top) if sinks is not None else 0.0)
    return np.einsum("hts,shd->thd", p / total, v).reshape(t, h * hd)


def _moe(x: np.ndarray, w: dict[str, np.ndarray], p: str, k: int) -> np.ndarray:
    logits = x @ w[p + "ffn_gate_inp.weight"].T
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        top = np.argsort(-probs[t], kind="stable")[:k]
        weights = probs[t, top] / probs[t, top].sum()
        for e, g in zip(top, weights, strict=True):
            gate = w[p + "ffn_gate_exps.weight"][e] @ x[t]
            up = w[p + "ffn_up_exps.weight"][e] @ x[t]
            out[t] += g * (w[p + "ffn_down_exps.weight"][e] @ (gate / (1 + np.exp(-gate)) * up))
    return out


def _moe_oai(x: np.ndarray, w: dict[str, np.ndarray], p: str, k: int) -> np.ndarray:
    """gpt-oss: biased router, softmax over the k largest logits, biased experts, clamped SwiGLU
    x * sigmoid(1.702 x) * (y + 1) with the gate capped at 7 and the up clamped to [-7, 7]."""
    logits = x @ w[p + "ffn_gate_inp.weight"].T + w[p + "ffn_gate_inp.bias"]
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        top = np.argsort(-logits[t], kind="stable")[:k]
        weights = np.exp(logits[t, top] - logits[t, top].max())
        weights /= weights.sum()
        for e, g in zip(top, weights, strict=True):
            gate = np.minimum(w[p + "ffn_gate_exps.weight"][e] @ x[t] + w[p + "ffn_gate_exps.bias"][e], 7.0)
            up = np.clip(w[p + "ffn_up_exps.weight"][e] @ x[t] + w[p + "ffn_up_exps.bias"][e], -7.0, 7.0)
            act = gate / (1 + np.exp(-1.702 * gate)) * (up + 1)
            out[t] += g * (w[p + "ffn_down_exps.weight"][e] @ act + w[p + "ffn_down_exps.bias"][e])
    return out


def reference_logits(arch: str, path: Path, tokens: list[int], d: Dims | None = None) -> np.ndarray:
    d = d or DIMS.get(arch, Dims())
    w = float64_weights(path)
    gemma, qk_norm = arch in ("gemma2", "gemma3"), arch in ("qwen3", "qwen3moe", "gemma3")
    oss = arch == "gpt-oss"
    softcap = 50.0 if arch == "gemma2" else 0.0   # llama-hparams.h's default: the tiny file sets none
    x = w["token_embd.weight"][tokens] * (np.sqrt(d.n_embd) if gemma else 1.0)
    pos = np.arange(len(tokens), dtype=np.float64)
    for il in range(d.n_layer):
        p = f"blk.{il}."
        # gemma3's default pattern: every sixth layer is global; gemma2's and gpt-oss's: every other one
        swa = (arch == "gemma3" and il % 6 < 5) or (arch in ("gemma2", "gpt-oss") and il % 2 == 0)
        h = rms_norm(x, w[p + "attn_norm.weight"])
        q = (h @ w[p + "attn_q.weight"].T).reshape(len(tokens), d.n_head, d.head_dim)
        k = (h @ w[p + "attn_k.weight"].T).reshape(len(tokens), d.n_head_kv, d.head_dim)
        v = (h @ w[p + "attn_v.weight"].T).reshape(len(tokens), d.n_head_kv, d.head_dim)
        if arch in ("qwen2", "gpt-oss"):
            q = q + w[p + "attn_q.bias"].reshape(d.n_head, d.head_dim)
            k = k + w[p + "attn_k.bias"].reshape(d.n_head_kv, d.head_dim)
            v = v + w[p + "attn_v.bias"].reshape(d.n_head_kv, d.head_dim)
        if qk_norm:
            q, k = rms_norm(q, w[p + "attn_q_norm.weight"]), rms_norm(k, w[p + "attn_k_norm.weight"])
        q, k = (_rope(t, pos, 10000.0, neox=arch != "llama") for t in (q, k))
        a = _attention(q, k, v, 1 / np.sqrt(d.head_dim), d.window if swa else 0, softcap,
                       w.get(p + "attn_sinks.weight")) @ w[p + "attn_output.weight"].T
        if oss:
            a = a + w[p + "attn_output.bias"]
        if gemma:
            a = rms_norm(a, w[p + "post_attention_norm.weight"])
        x = x + a
        h = rms_norm(x, w[p + ("post_attention_norm.weight" if oss else "ffn_norm.weight")])
        if arch == "qwen3moe":
            f = _moe(h, w, p, d.n_expert_used)
        elif oss:
            f = _moe_oai(h, w, p, d.n_expert_used)
        else:
            gate, up = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
            act = _gelu(gate) if gemma else gate / (1 + np.exp(-gate))
            f = (act * up) @ w[p + "ffn_down.weight"].T
        if gemma:
            f = rms_norm(f, w[p + "post_ffw_norm.weight"])
        x = x + f
    out = w.get("output.weight", w["token_embd.weight"])
    logits = rms_norm(x, w["output_norm.weight"]) @ out.T
    return 30.0 * np.tanh(logits / 30.0) if arch == "gemma2" else logits   # gemma2's final soft-capping


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("fa", ["on", "off"])
def test_logits_match_an_independent_forward_pass(arch: str, fa: str, models: dict[str, Path]) -> None:
    """f32 weights; the only roundings left are the f16 KV cache and flash attention's f16 work."""
    runner = ModelRunner.load(str(models[f"{arch}-f32"]), parse_llama_flags(["-c", "256", "-fa", fa]))
    got = runner.decode(TOKENS, all_logits=True)
    ref = reference_logits(arch, models[f"{arch}-f32"], TOKENS)
    assert np.abs(got - ref).max() <= 2e-2 * np.abs(ref).max()
    assert (got.argmax(-1) == ref.argmax(-1)).mean() >= 0.9


# --- devices that offload: host weights staged into a GPU's compute buffer ------------------------

def _cuda_inventory(n: int):
    from planner.hardware.inventory import Backend, DeviceKind, DeviceSpec, HostSpec, Inventory

    gpus = tuple(DeviceSpec(f"CUDA{i}", DeviceKind.GPU, Backend.CUDA, 1 << 30, 1 << 30, 0, 0, 0) for i in range(n))
    return Inventory(gpus, HostSpec(1 << 34, 1 << 34, 0, "test"))


@pytest.mark.parametrize("arch, flags", [
    ("llama", ["-ngl", "1"]),                               # layer 1 and output on CUDA0, layer 0 on the host
    ("qwen3moe", ["-ot", r"blk\.0\.ffn_.*_exps=CPU"]),     # layer 0's experts in host memory
])
def test_op_offload_stages_host_weights_and_keeps_the_logits(arch: str, flags: list[str],
                                                             models: dict[str, Path]) -> None:
    """A 40-token batch is past CUDA's offload threshold (32): matmuls whose weight is in host
    memory run on CUDA0 with the weight copied in (only the routed experts, for MUL_MAT_ID)."""
    tokens = [(7 * i + 3) % 256 for i in range(40)]
    single = ModelRunner.load(str(models[arch]), parse_llama_flags(["-c", "256", "-ngl", "0"]))
    split = ModelRunner.load(str(models[arch]), parse_llama_flags(["-c", "256", *flags]), _cuda_inventory(2))
    ref, got = single.decode(tokens, True), split.decode(tokens, True)
    copies = split.steps[0].measurement.copies
    assert any(c.dst_backend == "CUDA0" and c.name.startswith("blk.0.") for c in copies)
    if arch == "qwen3moe":
        assert any(c.expert_runs for c in copies)
    assert np.array_equal(got, ref)


def test_sliding_window_cache_wraps_around(models: dict[str, Path]) -> None:
    """gemma3's SWA cache holds pad(window + n_ubatch, 256) = 256 cells here, against 300 tokens
    decoded 16 at a time: past position 256 its cells are reused, and only the window is seen."""
    tokens = [(11 * i + 5) % 256 for i in range(300)]
    runner = ModelRunner.load(str(models["gemma3-f32"]), parse_llama_flags(["-c", "512", "-ub", "16"]))
    assert runner.kv is not None and {t.size for t in runner.kv.tables.values()} == {256}
    got = runner.decode(tokens, all_logits=True)
    ref = reference_logits("gemma3", models["gemma3-f32"], tokens)
    assert np.abs(got - ref).max() <= 2e-2 * np.abs(ref).max()
