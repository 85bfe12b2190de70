"""Files for tests of step35, mimo2 and hy_v3: tiny layouts and shape-faithful ones of real models, laid
out as the pinned llama.cpp's load_arch_tensors creates each architecture's tensors
(src/models/{step35,mimo2,hy-v3}.cpp).

hy_v3 is `shapes_moe.moe_layout`'s decoder (per-head Q/K norms, sigmoid routing with the selection bias, a
shared expert, leading dense blocks found by their lack of a router). The `*_spec` functions give real models'
widths, heads, vocabularies and Q4_K_M-like tensor types (published config.json of each model).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from gguf import Keys

from planner.gguf.keys import LLM_KV_ATTENTION_VALUE_SCALE
from planner.synth.gguf_factory import ModelSpec, Q, T, _common, _embeddings, tname
from planner.synth.shapes_moe import Q4KM, TINY, MoeLayout, moe_layout, with_tokenizer

SIGMOID = 2   # expert_gating_func (llama-hparams.h LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID)


# --- hy_v3 (src/models/hy-v3.cpp) ---------------------------------------------------------------------
def tiny_hy_v3() -> ModelSpec:
    """Three blocks, block 0 dense, Q/K norms per head, sigmoid routing with the selection bias, normalised
    and scaled weights, a shared expert, one MTP block after the trunk."""
    lay = replace(TINY, qk_norm="head", n_dense_lead=1, n_ff_shexp=TINY.n_ff_exp, probs_bias=True, n_nextn=1)
    keys = {Keys.LLM.EXPERT_WEIGHTS_SCALE: 2.5, Keys.LLM.EXPERT_WEIGHTS_NORM: True}
    spec = moe_layout("hy_v3", lay, keys)
    # hy-v3.cpp reads no leading_dense_block_count: a block without ffn_gate_inp is dense
    del spec.metadata[Keys.LLM.LEADING_DENSE_BLOCK_COUNT]
    return with_tokenizer(_bare_probs_bias(spec), 1000, 4096, 10000.0)


def _bare_probs_bias(spec: ModelSpec) -> ModelSpec:
    """hy-v3.cpp creates the selection bias as tn(FFN_EXP_PROBS_B, i): blk.N.exp_probs_b, no ".bias"."""
    spec.tensors[:] = [(name.removesuffix(".bias") if name.endswith(".exp_probs_b.bias") else name, q, shape)
                       for name, q, shape in spec.tensors]
    return spec



# --- iSWA decoders with per-layer heads (src/models/{mimo2,step35}.cpp) ------------------------------------
@dataclass(frozen=True)
class IswaLayout:
    """A decoder whose blocks differ by attention kind: `swa[il]` per block (MTP blocks included), KV heads
    `n_head_kv` / `n_head_kv_swa`, K and V heads of their own widths; block 0..n_dense_lead-1 and the MTP
    blocks dense, the others routed experts with the selection bias."""

    swa: tuple[bool, ...] = (False, True, True, True, True)
    n_nextn: int = 1
    n_embd: int = 256
    n_head: int = 4
    n_head_swa: int = 4
    n_head_kv: int = 1
    n_head_kv_swa: int = 2
    head_dim_k: int = 64
    head_dim_v: int = 32
    n_rot: int = 32
    window: int = 128
    n_ff: int = 512
    n_expert: int = 4
    n_expert_used: int = 2
    n_ff_exp: int = 64
    n_ff_shexp: int = 0
    n_vocab: int = 1000
    n_dense_lead: int = 1
    sinks_swa: bool = False        # mimo2: attn_sinks {n_head} in the sliding-window blocks
    qk_norm: bool = False          # step35: attn_q_norm / attn_k_norm {head_dim} in every block
    head_gate: bool = False        # step35: attn_gate {n_embd, n_head} (a sigmoid gate per head)
    nextn_head: bool = False       # step35: each MTP block's own output head and its norm (shared_head)
    fused_qkv: bool = False        # mimo2 (MiMo-V2.5 checkpoints): one attn_qkv {n_embd, q + k + v} a block
    gate_type: Q = Q.F32
    mat_type: Q = Q.Q8_0
    v_type: Q = Q.Q8_0
    exp_type: Q = Q.Q8_0
    down_type: Q = Q.Q8_0
    embd_type: Q = Q.Q8_0
    out_type: Q = Q.Q8_0

    @property
    def n_layer(self) -> int:
        return len(self.swa) - self.n_nextn


def _iswa_attention(spec: ModelSpec, lay: IswaLayout, i: int) -> None:
    heads = lay.n_head_swa if lay.swa[i] else lay.n_head
    kv = lay.n_head_kv_swa if lay.swa[i] else lay.n_head_kv
    q = heads * lay.head_dim_k
    if lay.fused_qkv:
        spec.add(T.ATTN_QKV, lay.mat_type, (lay.n_embd, q + kv * (lay.head_dim_k + lay.head_dim_v)), i)
    else:
        spec.add(T.ATTN_Q, lay.mat_type, (lay.n_embd, q), i)
        spec.add(T.ATTN_K, lay.mat_type, (lay.n_embd, kv * lay.head_dim_k), i)
        spec.add(T.ATTN_V, lay.v_type, (lay.n_embd, kv * lay.head_dim_v), i)
    spec.add(T.ATTN_OUT, lay.mat_type, (heads * lay.head_dim_v, lay.n_embd), i)
    spec.add(T.ATTN_NORM, Q.F32, (lay.n_embd,), i)
    if lay.qk_norm:
        spec.add(T.ATTN_Q_NORM, Q.F32, (lay.head_dim_k,), i)
        spec.add(T.ATTN_K_NORM, Q.F32, (lay.head_dim_k,), i)
    if lay.head_gate:
        spec.add(T.ATTN_GATE, lay.gate_type, (lay.n_embd, heads), i)
    if lay.sinks_swa and lay.swa[i]:
        spec.add(T.ATTN_SINKS, Q.F32, (heads,), i)
    spec.add(T.FFN_NORM, Q.F32, (lay.n_embd,), i)


def _iswa_ffn(spec: ModelSpec, lay: IswaLayout, i: int) -> None:
    e, n = lay.n_embd, lay.n_expert
    if i < lay.n_dense_lead or i >= lay.n_layer:
        spec.add(T.FFN_GATE, lay.mat_type, (e, lay.n_ff), i)
        spec.add(T.FFN_DOWN, lay.down_type, (lay.n_ff, e), i)
        spec.add(T.FFN_UP, lay.mat_type, (e, lay.n_ff), i)
        return
    spec.add(T.FFN_GATE_INP, Q.F32, (e, n), i)
    spec.add(T.FFN_GATE_EXP, lay.exp_type, (e, lay.n_ff_exp, n), i)
    spec.add(T.FFN_DOWN_EXP, lay.down_type, (lay.n_ff_exp, e, n), i)
    spec.add(T.FFN_UP_EXP, lay.exp_type, (e, lay.n_ff_exp, n), i)
    spec.add(T.FFN_EXP_PROBS_B, Q.F32, (n,), i, "bias")
    if lay.n_ff_shexp:
        spec.add(T.FFN_GATE_SHEXP, lay.mat_type, (e, lay.n_ff_shexp), i)
        spec.add(T.FFN_UP_SHEXP, lay.mat_type, (e, lay.n_ff_shexp), i)
        spec.add(T.FFN_DOWN_SHEXP, lay.down_type, (lay.n_ff_shexp, e), i)


def iswa_layout(arch: str, lay: IswaLayout) -> ModelSpec:
    spec = ModelSpec(arch)
    _common(spec, len(lay.swa), lay.n_embd, lay.n_vocab)
    spec.metadata.update({
        Keys.Attention.HEAD_COUNT: [lay.n_head_swa if w else lay.n_head for w in lay.swa],
        Keys.Attention.HEAD_COUNT_KV: [lay.n_head_kv_swa if w else lay.n_head_kv for w in lay.swa],
        Keys.Attention.KEY_LENGTH: lay.head_dim_k, Keys.Attention.VALUE_LENGTH: lay.head_dim_v,
        Keys.Rope.DIMENSION_COUNT: lay.n_rot,
        Keys.Attention.SLIDING_WINDOW: lay.window, Keys.Attention.SLIDING_WINDOW_PATTERN: list(lay.swa),
        Keys.LLM.FEED_FORWARD_LENGTH: lay.n_ff, Keys.LLM.EXPERT_FEED_FORWARD_LENGTH: lay.n_ff_exp,
        Keys.LLM.EXPERT_COUNT: lay.n_expert, Keys.LLM.EXPERT_USED_COUNT: lay.n_expert_used,
    })
    if lay.n_nextn:
        spec.metadata[Keys.LLM.NEXTN_PREDICT_LAYERS] = lay.n_nextn
    if lay.n_ff_shexp:
        spec.metadata[Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH] = lay.n_ff_shexp
    _embeddings(spec, lay.n_embd, lay.n_vocab, lay.embd_type, lay.out_type)
    for i in range(len(lay.swa)):
        _iswa_attention(spec, lay, i)
        _iswa_ffn(spec, lay, i)
        if i >= lay.n_layer:
            spec.add(T.NEXTN_EH_PROJ, lay.mat_type, (2 * lay.n_embd, lay.n_embd), i)
            spec.add(T.NEXTN_ENORM, Q.F32, (lay.n_embd,), i)
            spec.add(T.NEXTN_HNORM, Q.F32, (lay.n_embd,), i)
            if lay.nextn_head:
                spec.add(T.NEXTN_SHARED_HEAD_HEAD, lay.out_type, (lay.n_embd, lay.n_vocab), i)
                spec.add(T.NEXTN_SHARED_HEAD_NORM, Q.F32, (lay.n_embd,), i)
    return spec


# --- mimo2 (src/models/mimo2.cpp) -----------------------------------------------------------------------
def tiny_mimo2(fused_qkv: bool = False) -> ModelSpec:
    """Four blocks (block 0 full attention, then three sliding-window ones with sinks) and one MTP block
    (sliding-window, dense); K heads of 64, V heads of 32, 32 dims roped; value scale 0.707. `fused_qkv`: one
    attn_qkv a block, as MiMo-V2.5's checkpoints convert."""
    spec = iswa_layout("mimo2", IswaLayout(sinks_swa=True, fused_qkv=fused_qkv))
    spec.metadata[LLM_KV_ATTENTION_VALUE_SCALE] = 0.707
    spec.metadata[Keys.Rope.FREQ_BASE_SWA] = 10000.0
    return with_tokenizer(spec, 1000, 4096, 5000000.0)


# --- shape-faithful files (published config.json; Q4_K_M-like types) ------------------------------------
def hy3_preview_spec() -> ModelSpec:
    """Hy3-preview (tencent/Hy3-preview): 80 blocks 4096 wide and its MTP block (block_count 81), 64 heads
    (8 KV) of 128 with per-head Q/K norms, block 0 dense (13312), then 192 experts of 1536 (8 used, sigmoid with
    the selection bias, normalised, scaled 2.826) and one shared expert of 1536, vocabulary 120832, context
    262144, rope theta 11158840."""
    lay = replace(Q4KM, n_layer=80, n_embd=4096, n_head=64, n_head_kv=8, head_dim=128, n_ff=13312, n_expert=192,
                  n_expert_used=8, n_ff_exp=1536, n_ff_shexp=1536, n_vocab=120832, n_dense_lead=1,
                  qk_norm="head", probs_bias=True, down_type=Q.Q6_K, n_nextn=1)
    keys = {Keys.LLM.EXPERT_WEIGHTS_SCALE: 2.826, Keys.LLM.EXPERT_WEIGHTS_NORM: True,
            Keys.LLM.EXPERT_GATING_FUNC: SIGMOID}
    spec = moe_layout("hy_v3", lay, keys)
    del spec.metadata[Keys.LLM.LEADING_DENSE_BLOCK_COUNT]
    return with_tokenizer(_bare_probs_bias(_moe_mtp_block(spec, lay)), 120832, 262144, 11158840.0)


def _moe_mtp_block(spec: ModelSpec, lay: MoeLayout) -> ModelSpec:
    """The MTP block as Hy3's checkpoint has it: a MoE block like the trunk's (router, selection bias,
    experts, shared expert) and its final norm as nextn.shared_head_norm (conversion/hunyuan.py)."""
    mtp = lay.n_layer
    dense = {tname(k, mtp) for k in (T.FFN_GATE, T.FFN_DOWN, T.FFN_UP)}
    spec.tensors[:] = [t for t in spec.tensors if t[0] not in dense]
    e, n = lay.n_embd, lay.n_expert
    spec.add(T.FFN_GATE_INP, Q.F32, (e, n), mtp)
    spec.add(T.FFN_EXP_PROBS_B, Q.F32, (n,), mtp, "bias")
    spec.add(T.FFN_GATE_EXP, lay.exp_type, (e, lay.n_ff_exp, n), mtp)
    spec.add(T.FFN_DOWN_EXP, lay.down_type, (lay.n_ff_exp, e, n), mtp)
    spec.add(T.FFN_UP_EXP, lay.exp_type, (e, lay.n_ff_exp, n), mtp)
    spec.add(T.FFN_GATE_SHEXP, lay.mat_type, (e, lay.n_ff_shexp), mtp)
    spec.add(T.FFN_DOWN_SHEXP, lay.down_type, (lay.n_ff_shexp, e), mtp)
    spec.add(T.FFN_UP_SHEXP, lay.mat_type, (e, lay.n_ff_shexp), mtp)
    spec.add(T.NEXTN_SHARED_HEAD_NORM, Q.F32, (e,), mtp)
    return spec


# MiMo-V2-Flash's hybrid_layer_pattern: a full-attention block, then sliding-window ones in groups
MIMO_V2_FLASH_SWA = (False,) + (True,) * 4 + ((False,) + (True,) * 5) * 7 + (False,)


def mimo_v2_flash_spec() -> ModelSpec:
    """MiMo-V2-Flash (XiaomiMiMo/MiMo-V2-Flash): 48 blocks 4096 wide and 3 MTP blocks (block_count 51, sliding-
    window, dense), 64 heads of K 192 / V 128 with 64 dims roped, 4 KV heads in the full-attention blocks and 8
    in the sliding-window ones (window 128, with sinks), block 0 dense (16384), then 256 experts of 2048 (8 used,
    sigmoid with the selection bias), value scale 0.707, vocabulary 152576, context 262144, rope theta 5e6
    (1e4 in the sliding-window blocks)."""
    lay = IswaLayout(swa=MIMO_V2_FLASH_SWA + (True,) * 3, n_nextn=3, n_embd=4096, n_head=64, n_head_swa=64,
                     n_head_kv=4, n_head_kv_swa=8, head_dim_k=192, head_dim_v=128, n_rot=64, window=128,
                     n_ff=16384, n_expert=256, n_expert_used=8, n_ff_exp=2048, n_vocab=152576, sinks_swa=True,
                     mat_type=Q.Q4_K, v_type=Q.Q6_K, exp_type=Q.Q4_K, down_type=Q.Q6_K, embd_type=Q.Q4_K,
                     out_type=Q.Q6_K)
    spec = iswa_layout("mimo2", lay)
    spec.metadata[LLM_KV_ATTENTION_VALUE_SCALE] = 0.707
    spec.metadata[Keys.Rope.FREQ_BASE_SWA] = 10000.0
    return with_tokenizer(spec, 152576, 262144, 5000000.0)



# --- step35 (src/models/step35.cpp) ---------------------------------------------------------------------
def tiny_step35() -> ModelSpec:
    """Four blocks (block 0 full attention with 4 heads, then three sliding-window ones with 6), one MTP block;
    per-head Q/K norms and a sigmoid gate per head, block 0 dense, then sigmoid routing with the selection bias
    and a shared expert."""
    lay = IswaLayout(n_head=4, n_head_swa=6, n_head_kv=2, n_head_kv_swa=2, head_dim_k=64, head_dim_v=64, n_rot=64,
                     n_ff_shexp=64, qk_norm=True, head_gate=True)
    spec = iswa_layout("step35", lay)
    spec.metadata[Keys.LLM.EXPERT_WEIGHTS_NORM] = True
    spec.metadata[Keys.LLM.EXPERT_WEIGHTS_SCALE] = 3.0
    # clamped SwiGLUs: block 2's experts; block 0's dense FFN and block 3's shared expert (build_ffn reads the
    # shared limit of its block whatever FFN it builds)
    spec.metadata[Keys.LLM.SWIGLU_CLAMP_EXP] = [0.0, 0.0, 7.0, 0.0, 0.0]
    spec.metadata[Keys.LLM.SWIGLU_CLAMP_SHEXP] = [7.0, 0.0, 0.0, 7.0, 0.0]
    return with_tokenizer(spec, 1000, 4096, 5000000.0)



# Step-3.5-Flash's layer_types: full attention every fourth block from block 0, sliding-window between
STEP35_FLASH_SWA = tuple(il % 4 != 0 for il in range(45))


def step35_flash_spec() -> ModelSpec:
    """Step-3.5-Flash (stepfun-ai/Step-3.5-Flash): 45 blocks 4096 wide and 3 MTP blocks (block_count 48,
    sliding-window, dense, each with its own output head), 64 heads in the full-attention blocks and 96 in the
    sliding-window ones (window 512), 8 KV heads of 128, per-head Q/K norms and gates, RoPE over 64 dims in the
    full-attention blocks (partial rotary 0.5) and 128 in the others, blocks 0-2 dense (11264), then 288 experts
    of 1280 (8 used, sigmoid with the selection bias, normalised, scaled 3.0) and a shared expert of 1280,
    vocabulary 128896, context 262144, rope theta 5e6 (1e4 in the sliding-window blocks)."""
    lay = IswaLayout(swa=STEP35_FLASH_SWA + (True,) * 3, n_nextn=3, n_embd=4096, n_head=64, n_head_swa=96,
                     n_head_kv=8, n_head_kv_swa=8, head_dim_k=128, head_dim_v=128, n_rot=128, window=512,
                     n_ff=11264, n_expert=288, n_expert_used=8, n_ff_exp=1280, n_ff_shexp=1280, n_vocab=128896,
                     n_dense_lead=3, qk_norm=True, head_gate=True, nextn_head=True, gate_type=Q.Q8_0,
                     mat_type=Q.Q4_K, v_type=Q.Q6_K, exp_type=Q.Q4_K, down_type=Q.Q6_K, embd_type=Q.Q4_K,
                     out_type=Q.Q6_K)
    spec = iswa_layout("step35", lay)
    spec.metadata[Keys.LLM.EXPERT_WEIGHTS_NORM] = True
    spec.metadata[Keys.LLM.EXPERT_WEIGHTS_SCALE] = 3.0
    spec.metadata[Keys.LLM.LEADING_DENSE_BLOCK_COUNT] = 3
    spec.metadata[Keys.Rope.FREQ_BASE_SWA] = 10000.0
    return with_tokenizer(spec, 128896, 262144, 5000000.0)

TINY_SPECS = {
    "hy_v3": tiny_hy_v3,
    "mimo2": tiny_mimo2,
    "mimo2-fused": lambda: tiny_mimo2(fused_qkv=True),
    "step35": tiny_step35,
}
