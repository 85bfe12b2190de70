"""granitehybrid's graph builder (runtime/engine/granitehybrid.py, runtime/engine/recurrent.py) on tiny
files: the reserve's node counts and CPU compute buffer against llama.cpp's, the recurrent states'
sizes, the state-space kernels against definitions written here, and decode's refusal.

Expected figures come from llama.cpp on these very files (pinned build, llama-fit-params -v:
"graph: nodes = N" and "CPU compute buffer size"; fitplan-dump-nodes printed the same buffer to
4 decimals and listed every node, which matched the runtime's op, shape and strides one for one).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from gguf import MODEL_TENSOR as T
from gguf import Keys

from planner.core.errors import BadInput
from planner.llama.context import model_context
from planner.llama.flags import parse_llama_flags
from planner.llama.settings import resolve_settings
from planner.synth.gguf_factory import ModelSpec, Q, add_tokenizer, granitehybrid_spec, tname
from runtime.engine.probe import flash_attn_mismatches
from runtime.engine.runner import ModelRunner
from runtime.ggml import build as B
from runtime.ggml import ssm
from runtime.ggml.graph import GGMLType, Graph, Tensor
from runtime.ggml.sched import Scheduler

MIB = 2**20
LAYERS = (0, 0, 2, 0)   # head_count_kv: Mamba-2, Mamba-2, attention, Mamba-2


def dense() -> ModelSpec:
    spec = granitehybrid_spec(n_embd=128, n_head=4, head_count_kv=LAYERS, n_ff=256, d_conv=4, d_state=16,
                              n_group=1, n_ssm_head=8, n_vocab=512)
    add_tokenizer(spec, 512, n_merges=1)
    spec.metadata[Keys.Tokenizer.PRE] = "default"
    return spec


def moe() -> ModelSpec:
    """Granite-4.0-H-Tiny-like: 8 experts (2 used) of 64 plus a shared expert of 128, two groups,
    Granite's four multipliers and no RoPE (rope.scaling.finetuned false)."""
    n_embd, n_expert, n_ff_exp, n_ff_shexp = 128, 8, 64, 128
    spec = granitehybrid_spec(n_embd=n_embd, n_head=4, head_count_kv=LAYERS, n_ff=n_ff_exp, d_conv=4, d_state=16,
                              n_group=2, n_ssm_head=8, n_vocab=512)
    add_tokenizer(spec, 512, n_merges=1)
    spec.metadata.update({
        Keys.Tokenizer.PRE: "default", Keys.LLM.EXPERT_COUNT: n_expert, Keys.LLM.EXPERT_USED_COUNT: 2,
        Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH: n_ff_shexp, Keys.LLM.EMBEDDING_SCALE: 12.0,
        Keys.LLM.RESIDUAL_SCALE: 0.22, Keys.LLM.LOGIT_SCALE: 6.0, Keys.Attention.SCALE: 0.0078125,
        Keys.Rope.SCALING_FINETUNED: False,
    })
    spec.tensors = [t for t in spec.tensors if not any(f".ffn_{p}." in t[0] for p in ("gate", "up", "down"))]
    for il in range(len(LAYERS)):
        spec.add(T.FFN_GATE_INP, Q.F32, (n_embd, n_expert), il)
        spec.add(T.FFN_GATE_EXP, Q.Q8_0, (n_embd, n_ff_exp, n_expert), il)
        spec.add(T.FFN_DOWN_EXP, Q.Q8_0, (n_ff_exp, n_embd, n_expert), il)
        spec.add(T.FFN_UP_EXP, Q.Q8_0, (n_embd, n_ff_exp, n_expert), il)
        spec.add(T.FFN_GATE_SHEXP, Q.Q8_0, (n_embd, n_ff_shexp), il)
        spec.add(T.FFN_UP_SHEXP, Q.Q8_0, (n_embd, n_ff_shexp), il)
        spec.add(T.FFN_DOWN_SHEXP, Q.Q8_0, (n_ff_shexp, n_embd), il)
    assert tname(T.FFN_GATE_INP, 0) in {t[0] for t in spec.tensors}
    return spec


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("granitehybrid")
    out = {}
    for name, make in (("dense", dense), ("moe", moe)):
        [out[name]] = make().write(d / f"{name}.gguf")
    return out


# llama-fit-params -v on these files: "graph: nodes = N" and "CPU compute buffer size = X MiB" (2 decimals)
LLAMA_CPP_RESERVE = {
    ("dense", "-c 256"): (210, 2.11),
    ("moe", "-c 256"): (302, 2.01),
    ("dense", "-c 256 -fa off"): (215, 2.36),
    ("moe", "-c 256 -fa off"): (307, 2.26),
    ("dense", "-c 256 -np 2"): (212, 2.13),
    ("moe", "-c 256 -np 2"): (304, 2.01),
    ("dense", "-c 512 -np 3 -ub 64"): (212, 0.55),
    ("moe", "-c 512 -np 3 -ub 64"): (304, 0.57),
}


@pytest.mark.parametrize("name, flags", list(LLAMA_CPP_RESERVE), ids=[f"{m} {f}" for m, f in LLAMA_CPP_RESERVE])
def test_reserve_nodes_and_compute_buffer_equal_llama_cpp(name: str, flags: str, models: dict[str, Path]) -> None:
    runner = ModelRunner.load(str(models[name]), parse_llama_flags(flags.split()), weights=False)
    report = runner.reserve_report
    assert report is not None
    n_nodes, compute_mib = LLAMA_CPP_RESERVE[name, flags]
    assert (report.n_nodes_pp, report.n_nodes_tg) == (n_nodes, n_nodes)
    assert round(report.compute_bytes["CPU"] / MIB, 2) == compute_mib


def test_recurrent_states_have_llama_cpp_sizes(models: dict[str, Path]) -> None:
    """r: (d_conv - 1) * (d_inner + 2 * n_group * d_state) = 3 * (256 + 32); s: d_state * d_inner = 16 * 256;
    one row per sequence; the attention layer has none (llama-fit-params: "RS buffer size = 0.11 MiB"
    at -np 2, i.e. 3 layers x (864 + 4096) x 4 bytes x 2)."""
    runner = ModelRunner.load(str(models["dense"]), parse_llama_flags(["-c", "256", "-np", "2"]), weights=False)
    assert sorted(runner.states.r) == [0, 1, 3]
    assert all(runner.states.r[il].ne[:2] == (864, 2) and runner.states.s[il].ne[:2] == (4096, 2) for il in (0, 1, 3))
    assert round(sum(t.nbytes() for il in (0, 1, 3) for t in runner.states.tensors(il)) / MIB, 2) == 0.11


def test_next_layers_state_gathers_precede_the_attention_output(models: dict[str, Path]) -> None:
    """fitplan-dump-nodes on the dense file: layer 3's conv-state clear and gathers come right after layer
    2's attention core and before its output projection (build_rs expands them while attn_out-2 is not
    yet in the graph), which is why a host attention layer's core follows a device's first recurrent layer."""
    runner = ModelRunner.load(str(models["dense"]), parse_llama_flags(["-c", "256"]), weights=False)
    nodes = runner._graph(next(iter(runner._graphs))).graph.nodes
    names = [n.name for n in nodes]
    fattn, out = names.index("__fattn__-2"), names.index("attn_out-2")
    clear = next(i for i, n in enumerate(nodes) if n.op.value == "SCALE" and n.view_src is runner.states.r[3])
    assert fattn < clear < out


def _rpc_inventory():
    from planner.hardware.inventory import Backend, DeviceKind, DeviceSpec, HostSpec, Inventory

    rpcs = tuple(DeviceSpec(f"RPC{i}", DeviceKind.GPU, Backend.RPC, 1 << 30, 1 << 30, 0, 0, 0) for i in range(2))
    return Inventory(rpcs, HostSpec(1 << 34, 1 << 34, 0, "test"))


# -ngl 2: layer 3 and the output offloaded, so the host attention layer 2 precedes a device's recurrent layer
@pytest.mark.parametrize("flags", ["-ts 1,1", "-ngl 2 -ts 1,1", "-ngl 3 -ts 1,1", "-ngl 1", "-nkvo -ts 1,1",
                                   "-nkvo -ngl 2 -ts 1,1", "-nkvo -ngl 3 -ts 3,1", "-np 2 -ngl 2 -ts 1,1"])
def test_pulled_attention_rule_agrees_with_the_flash_attention_probe(flags: str, models: dict[str, Path]) -> None:
    """planner.llama.settings.pulled_attention (which turns -fa auto off) against the runtime's replay of
    llama.cpp's probe; llama-fit-params logs the same mismatches on the Granite-class shape (-nkvo:
    "layer 5 is assigned to device RPC0 but Flash Attention is assigned to device CPU")."""
    settings = resolve_settings(model_context(str(models["dense"])),
                                parse_llama_flags(["-c", "256", *flags.split()]), _rpc_inventory())
    assert dict(settings.pulled) == flash_attn_mismatches(settings)


def test_decode_refuses_recurrent_layers(models: dict[str, Path]) -> None:
    runner = ModelRunner.load(str(models["dense"]), parse_llama_flags(["-c", "256"]), weights=False)
    with pytest.raises(BadInput, match="recurrent"):
        runner.decode([1, 2, 3])


# --- the state-space kernels, against loops written from ggml-cpu's definitions -----------------------

def _run(cpu, out: Tensor, inputs: dict[Tensor, np.ndarray]) -> np.ndarray:
    Scheduler([cpu]).compute(Graph.build(out), inputs=inputs)
    return out.get_data()


def test_ssm_conv_is_a_sliding_dot_product(cpu) -> None:
    rng = np.random.default_rng(1)
    d_conv, d_inner, n_t, n_s = 4, 3, 5, 2
    sx = B.new_input(GGMLType.F32, (d_conv - 1 + n_t, d_inner, n_s), "sx")
    c = B.new_input(GGMLType.F32, (d_conv, d_inner), "c")
    sxv = rng.standard_normal((n_s, d_inner, d_conv - 1 + n_t)).astype(np.float32)
    cv = rng.standard_normal((d_inner, d_conv)).astype(np.float32)
    got = _run(cpu, ssm.ssm_conv(sx, c), {sx: sxv, c: cv})   # (n_s, n_t, d_inner)
    want = np.zeros((n_s, n_t, d_inner))
    for s in range(n_s):
        for t in range(n_t):
            for i in range(d_inner):
                want[s, t, i] = sum(sxv[s, i, t + k] * cv[i, k] for k in range(d_conv))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_ssm_scan_mamba2_recurrence(cpu) -> None:
    """h_t = exp(softplus(dt) A) h_{t-1} + softplus(dt) x_t B_t, y_t = h_t . C_t, per head (its group's B
    and C), starting from the state ids[seq] picks; the result is y then each sequence's last state."""
    rng = np.random.default_rng(2)
    d_state, head_dim, n_head, n_group, n_t, n_s, slots = 3, 2, 4, 2, 3, 2, 3
    f32, new = GGMLType.F32, B.new_input
    s = new(f32, (d_state, head_dim, n_head, slots), "s")
    x = new(f32, (head_dim, n_head, n_t, n_s), "x")
    dt = new(f32, (n_head, n_t, n_s), "dt")
    a = new(f32, (1, n_head), "A")
    b = new(f32, (d_state, n_group, n_t, n_s), "B")
    c = new(f32, (d_state, n_group, n_t, n_s), "C")
    ids = new(GGMLType.I32, (n_s,), "ids")
    vals = {s: rng.standard_normal((slots, n_head, head_dim, d_state)),
            x: rng.standard_normal((n_s, n_t, n_head, head_dim)),
            dt: rng.standard_normal((n_s, n_t, n_head)) * 3, a: -np.abs(rng.standard_normal((n_head, 1))),
            b: rng.standard_normal((n_s, n_t, n_group, d_state)), c: rng.standard_normal((n_s, n_t, n_group, d_state))}
    vals = {k: v.astype(np.float32) for k, v in vals.items()}
    vals[ids] = np.array([2, 0], np.int32)
    got = _run(cpu, ssm.ssm_scan(s, x, dt, a, b, c, ids), vals).reshape(-1)
    y = np.zeros((n_s, n_t, n_head, head_dim))
    last = np.zeros((n_s, n_head, head_dim, d_state))
    for q in range(n_s):
        h = vals[s][vals[ids][q]].astype(np.float64)
        for t in range(n_t):
            for hd in range(n_head):
                sp = math.log1p(math.exp(vals[dt][q, t, hd]))
                g = hd // (n_head // n_group)
                h[hd] = h[hd] * math.exp(sp * vals[a][hd, 0]) + sp * vals[x][q, t, hd][:, None] * vals[b][q, t, g][None]
                y[q, t, hd] = h[hd] @ vals[c][q, t, g]
        last[q] = h
    np.testing.assert_allclose(got, np.concatenate([y.reshape(-1), last.reshape(-1)]), rtol=1e-4, atol=1e-5)
