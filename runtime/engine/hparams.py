"""Hyper-parameters a graph builder needs, read from GGUF metadata as the pinned llama.cpp reads them.

Per-architecture facts live in `ARCHS` (keyed by GGUF architecture name); per-layer facts
(heads, SWA layers, window) come from planner.model.arch so the runtime and the estimate agree on
which layers slide. Sources: src/models/{llama,qwen2,qwen3,qwen3moe,gemma2,gemma3,openai-moe}.cpp and
llama_model_rope_type in src/llama-model.cpp (pinned build, DESIGN.md). The llama-like dense
architectures (mistral3, internlm2, ernie4_5, seed_oss, smollm3, granite, arcee, apertus, olmo2,
exaone4, hunyuan-dense, glm4: src/models/<arch>.cpp) differ from llama only by the facts in the
"dense" block of ArchSpec: unroped layers, post-only or sandwich norms, where the Q/K norms sit,
an FFN without a gate tensor, granite's scales and mistral3's attention temperature.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

from gguf import MODEL_TENSOR, Keys

from planner.core.errors import GGUFError
from planner.gguf.keys import LLM_KV_ATTENTION_VALUE_SCALE
from planner.gguf.reader import ModelFile
from planner.model.arch import AttnKind, LayerFacts, ModelFacts, model_facts
from planner.model.tensors import tensor_name


class RopeMode(enum.IntEnum):
    """ggml rope modes: NORM rotates adjacent pairs, NEOX rotates (i, i + n_dims/2)."""

    NORM = 0
    NEOX = 2
    IMROPE = 40   # fused: qwen3vl's interleaved multi-section RoPE (GGML_ROPE_TYPE_IMROPE, ggml_rope_multi)


class FfnKind(enum.Enum):
    SWIGLU = "swiglu"   # silu(gate) * up (LLM_FFN_SILU, LLM_FFN_PAR)
    GEGLU = "geglu"     # gelu(gate) * up (LLM_FFN_GELU, LLM_FFN_PAR)
    MOE = "moe"         # router, top-k experts (build_moe_ffn; MoeSpec says which kind)
    # dense
    RELU_SQR = "relu_sqr"          # relu(up)^2, no gate (LLM_FFN_RELU_SQR, LLM_FFN_SEQ: arcee)
    XIELU = "xielu"                # xielu(up), no gate (apertus.cpp: ggml_xielu)
    SWIGLU_FUSED = "swiglu_fused"  # one ffn_up of 2 * n_ff, ggml_swiglu over its halves (LLM_FFN_SWIGLU: glm4, phi3)
    # fused
    GELU = "gelu"       # starcoder2: up (+ bias), gelu, down (+ bias), no gate (LLM_FFN_GELU, LLM_FFN_SEQ)


class MoeGating(enum.Enum):
    """llama_expert_gating_func_type: how router logits become expert weights."""

    SOFTMAX = "softmax"                 # softmax over all experts, then top-k
    SOFTMAX_WEIGHT = "softmax_weight"   # top-k of the logits, softmax over the k chosen (gpt-oss)
    SIGMOID = "sigmoid"                 # sigmoid of each logit (glm4moe, dots1, minimax-m2)


# expert_gating_func as a file writes it (llama-hparams.h llama_expert_gating_func_type; 0: the architecture's own)
GATING_FUNCS: dict[int, MoeGating] = {1: MoeGating.SOFTMAX, 2: MoeGating.SIGMOID, 3: MoeGating.SOFTMAX_WEIGHT}


class SharedExpert(enum.Enum):
    """How a layer's shared expert (ffn_{up,gate,down}_shexp, build_ffn's SwiGLU) joins the routed ones."""

    NONE = "none"
    ADDED = "added"                  # routed + shared (deepseek, dots1, ernie4_5-moe, glm4moe)
    SIGMOID_GATED = "sigmoid_gated"  # qwen2moe: shared * sigmoid(ffn_gate_inp_shexp . x), written silu(g) / g


@dataclass(frozen=True)
class MoeSpec:
    gating: MoeGating = MoeGating.SOFTMAX
    norm_w: bool = True          # weights divided by their sum (qwen3moe passes norm_w = true)
    glu: str = "SWIGLU"          # the experts' GLU: ggml_swiglu_split, SWIGLU_OAI (LLM_FFN_SWIGLU_OAI_MOE), REGLU
    # moe: what each architecture's load_arch_hparams reads and its graph passes to build_moe_ffn
    gating_key: bool = False     # expert_gating_func read from the file (0 or absent: `gating`)
    norm_w_key: bool = False     # expert_weights_norm read from the file (absent: false) instead of `norm_w`
    scale_key: bool = False      # expert_weights_scale read from the file (a scale node unless 0 or 1)
    dense_lead: bool = False     # leading_dense_block_count layers with a dense FFN first
    layer_step: bool = False     # ernie4_5-moe: experts only where (il + 1) % interleave_moe_layer_step == 0
    shared: SharedExpert = SharedExpert.NONE   # used in the layers whose file has ffn_up_shexp
    gate_optional: bool = False  # ernie4_5-moe loads ffn_gate_exps as not required: silu(up) without it
    router_on_input: bool = False   # smallthinker: router logits from the layer's input, before its norm
    # moe26: hy_v3
    moe_where_router: bool = False  # experts in the blocks whose file has ffn_gate_inp, a dense FFN elsewhere
    probs_b_bare: bool = False      # the selection bias named blk.N.exp_probs_b (tn without "bias": hy-v3.cpp)
    # moe3
    groups: bool = False         # bailingmoe2: expert_group_count > 1 selects the experts within the best groups


@dataclass(frozen=True)
class ArchSpec:
    rope: RopeMode
    ffn: FfnKind
    qk_norm: bool = False        # RMS-normed Q and K per head before RoPE (qwen3, gemma3)
    post_norms: bool = False     # gemma3: norms after attention and after the FFN
    embd_scale: bool = False     # gemma3: embeddings scaled by sqrt(n_embd)
    q_prescale: bool = False     # gemma3: Q scaled before attention, attention scale 1
    attn_bias: bool = False      # qwen2: Q/K/V biases
    attn_softcap: bool = False   # gemma2: attention logits soft-capped (hparams.attn_soft_cap)
    final_softcap: float = 0.0   # final logit soft-capping when the file has no key (gemma2: 30)
    swa_rope_from_base: bool = False   # gemma2, gpt-oss: SWA layers' rope base/scale default to the base's
    big_model_layers: int = 0    # gemma2/3 27B (46/62 layers): Q pre-scaled by 1/sqrt(n_embd / n_head)
    ffn_norm: MODEL_TENSOR = MODEL_TENSOR.FFN_NORM   # gpt-oss norms the FFN input with post_attention_norm
    # openai-moe.cpp: the trunk's last hidden state is a graph output (res->t_h_nextn, never freed) and
    # the output rows are picked after the trunk, not inside its last layer
    trunk_is_output: bool = False
    moe: MoeSpec = MoeSpec()
    # --- dense: the llama-like dense architectures (src/models/<arch>.cpp) ---
    nope_every: int = 0             # smollm3, afmoe: layer il has no RoPE where (il + 1) % nope_every == 0
    nope_full_attn: bool = False    # exaone4: with SWA layers, the full-attention layers have no RoPE
    pre_norms: bool = True          # olmo2, exaone4: no norm before attention or FFN (post norms only)
    ffn_post_norm_layer: bool = False   # glm4 builds the FFN's post norm with il (pinned); gemma with -1
    qk_norm_full: bool = False      # olmo2: Q and K RMS-normed over the whole projection, then split in heads
    qk_norm_after_rope: bool = False    # hunyuan-dense: K, then Q, normed after RoPE
    attn_out_bias: bool = True      # False: build_attn gets no attn_output bias (ernie4_5, olmo2, exaone4, glm4)
    scales_from_file: bool = False  # granite: embedding, residual, attention and logit scales (GGUF keys)
    attn_temp: bool = False         # mistral3: Q times a per-token temperature when the file has the key
    # fused: LayerNorm, fused projections, parallel blocks, NoPE layers, logit scale, M-RoPE
    # (runtime/engine/fused.py builds the architectures that set any of these)
    layer_norm: bool = False       # build_norm(LLM_NORM): ggml_norm, then the weight and bias the file has
    parallel: bool = False         # command-r, cohere2: attention and FFN read the same normed input
    rope_swa_only: bool = False    # cohere2: only sliding-window layers are roped; the global ones are NoPE
    logit_scale: bool = False      # command-r, cohere2: logits scaled by {arch}.logit_scale
    clamp_kqv: bool = False        # olmo: Q, K and V clamped to +-{arch}.attention.clamp_kqv when the key is set
    residual_first: bool = False   # phi3: a layer's output is ggml_add(residual, ffn_out), sources in that order
    mrope: bool = False            # qwen3vl: ggml_rope_multi over rope.dimension_sections, 4 positions a token,
                                   # and deepstack inputs when {arch}.n_deepstack_layers is set
    # stablelm: a layer without ffn_norm is a parallel residual (StableLM 2 12B: the FFN reads the attention's
    # normed input), and Q and K are both normed before either is roped
    ffn_norm_optional: bool = False
    # moe: attention facts of the mixture-of-experts architectures
    qk_norm_optional: bool = False   # glm4moe: Q/K norms where the file has them (GLM-4.5 355B), none in Air
    nope_every_from_first: int = 0     # smallthinker: with sliding-window layers, layers 0, n, 2n... unroped
    # moe26: step35, mimo2, hy_v3
    # hy-v3.cpp: the output norm runs over every token and is a graph output (res->t_h_nextn, never freed);
    # the output rows are picked after it, none inside the last layer
    norm_is_output: bool = False
    # mimo2.cpp: K and V heads of their own widths (attention.key_length / value_length); the output
    # projection scaled by attention.value_scale where the file sets it (not 1)
    v_head_own: bool = False
    value_scale_key: bool = False
    # step35.cpp: heads and rotated dims per block, SwiGLU clamps per block (runtime/engine/step35.py)
    per_block_heads: bool = False
    # embed: the BERT-family encoders (runtime/engine/bert.py)
    learned_pos: bool = False    # bert: position_embd rows added to the input instead of RoPE
    alibi_max_bias: float = 0.0  # jina-bert-v2: ALiBi instead of positions (load_arch_hparams sets f_max_alibi_bias 8)
    # moe3
    fused_qkv: bool = False        # bailingmoe2: one attn_qkv matmul viewed as Q, K and V (fused.py builds it)


ARCHS: dict[str, ArchSpec] = {
    "llama": ArchSpec(RopeMode.NORM, FfnKind.SWIGLU),
    "qwen2": ArchSpec(RopeMode.NEOX, FfnKind.SWIGLU, attn_bias=True),
    "qwen3": ArchSpec(RopeMode.NEOX, FfnKind.SWIGLU, qk_norm=True),
    "qwen3moe": ArchSpec(RopeMode.NEOX, FfnKind.MOE, qk_norm=True),
    "gemma2": ArchSpec(RopeMode.NEOX, FfnKind.GEGLU, post_norms=True, embd_scale=True, q_prescale=True,
                       attn_softcap=True, final_softcap=30.0, swa_rope_from_base=True, big_model_layers=46),
    "gemma3": ArchSpec(RopeMode.NEOX, FfnKind.GEGLU, qk_norm=True, post_norms=True, embd_scale=True,
                       q_prescale=True, big_model_layers=62),
    # openai-moe.cpp passes the attention sinks and biases it loads; the builder uses what the file has
    "gpt-oss": ArchSpec(RopeMode.NEOX, FfnKind.MOE, swa_rope_from_base=True, ffn_norm=MODEL_TENSOR.ATTN_POST_NORM,
                        trunk_is_output=True,
                        moe=MoeSpec(MoeGating.SOFTMAX_WEIGHT, norm_w=False, glu="SWIGLU_OAI")),
    # granite-hybrid.cpp's attention layers and dense FFN; runtime/engine/granitehybrid.py adds the rest
    "granitehybrid": ArchSpec(RopeMode.NORM, FfnKind.SWIGLU),
    # lfm2.cpp's attention layers (Q/K norms, NEOX RoPE) and dense FFN; runtime/engine/lfm2.py adds the rest
    "lfm2": ArchSpec(RopeMode.NEOX, FfnKind.SWIGLU, qk_norm=True),
    # qwen3next.cpp's gated attention (Q/K norms, NEOX RoPE) and experts; runtime/engine/qwen3next.py builds it
    "qwen3next": ArchSpec(RopeMode.NEOX, FfnKind.MOE, qk_norm=True),
    # dense
    "mistral3": ArchSpec(RopeMode.NORM, FfnKind.SWIGLU, attn_temp=True),
    "internlm2": ArchSpec(RopeMode.NORM, FfnKind.SWIGLU),
    "ernie4_5": ArchSpec(RopeMode.NORM, FfnKind.SWIGLU, attn_out_bias=False),
    # seed-oss.cpp norms the FFN input with attn_post_norm (the file has no ffn_norm)
    "seed_oss": ArchSpec(RopeMode.NEOX, FfnKind.SWIGLU, ffn_norm=MODEL_TENSOR.ATTN_POST_NORM),
    "smollm3": ArchSpec(RopeMode.NORM, FfnKind.SWIGLU, nope_every=4),
    "granite": ArchSpec(RopeMode.NORM, FfnKind.SWIGLU, scales_from_file=True),
    "arcee": ArchSpec(RopeMode.NORM, FfnKind.RELU_SQR),
    "apertus": ArchSpec(RopeMode.NEOX, FfnKind.XIELU, qk_norm=True),
    "olmo2": ArchSpec(RopeMode.NEOX, FfnKind.SWIGLU, qk_norm=True, qk_norm_full=True, post_norms=True,
                      pre_norms=False, attn_out_bias=False, swa_rope_from_base=True),
    "exaone4": ArchSpec(RopeMode.NEOX, FfnKind.SWIGLU, qk_norm=True, post_norms=True, pre_norms=False,
                        attn_out_bias=False, swa_rope_from_base=True, nope_full_attn=True),
    "hunyuan-dense": ArchSpec(RopeMode.NEOX, FfnKind.SWIGLU, qk_norm=True, qk_norm_after_rope=True),
    "glm4": ArchSpec(RopeMode.NORM, FfnKind.SWIGLU_FUSED, post_norms=True, ffn_post_norm_layer=True,
                     attn_out_bias=False),
    # fused: runtime/engine/fused.py builds these (src/models/<arch>.cpp)
    # phi3.cpp: Q scaled by 1/sqrt(head_dim) after RoPE, attention scale 1
    "phi3": ArchSpec(RopeMode.NEOX, FfnKind.SWIGLU_FUSED, q_prescale=True, residual_first=True),
    # command-r.cpp: LayerNorm, attention and FFN in parallel on one normed input, logits scaled
    "command-r": ArchSpec(RopeMode.NORM, FfnKind.SWIGLU, layer_norm=True, parallel=True, logit_scale=True),
    # cohere2.cpp: command-r's layer with sliding-window layers roped and the global ones NoPE
    "cohere2": ArchSpec(RopeMode.NORM, FfnKind.SWIGLU, layer_norm=True, parallel=True, logit_scale=True,
                        rope_swa_only=True, swa_rope_from_base=True),
    # stablelm.cpp: LayerNorm with biases, partial RoPE (rope.dimension_count), optional Q/K/V biases
    "stablelm": ArchSpec(RopeMode.NEOX, FfnKind.SWIGLU, layer_norm=True, ffn_norm_optional=True),
    # starcoder2.cpp: LayerNorm with biases, biases on every projection, a GELU FFN without gate
    "starcoder2": ArchSpec(RopeMode.NEOX, FfnKind.GELU, layer_norm=True),
    # olmo.cpp: LayerNorm without weights, Q/K/V clamped when attention.clamp_kqv is set
    "olmo": ArchSpec(RopeMode.NORM, FfnKind.SWIGLU, layer_norm=True, clamp_kqv=True),
    # qwen3vl.cpp: qwen3's layer with interleaved multi-section RoPE and deepstack inputs
    "qwen3vl": ArchSpec(RopeMode.IMROPE, FfnKind.SWIGLU, qk_norm=True, mrope=True),
    # moe: the mixture-of-experts decoders of src/models/<arch>.cpp that differ from qwen3moe only by facts
    "qwen2moe": ArchSpec(RopeMode.NEOX, FfnKind.MOE, attn_bias=True,
                         moe=MoeSpec(norm_w=False, shared=SharedExpert.SIGMOID_GATED)),
    "olmoe": ArchSpec(RopeMode.NEOX, FfnKind.MOE, qk_norm_full=True, moe=MoeSpec(norm_w=False)),
    "ernie4_5-moe": ArchSpec(RopeMode.NORM, FfnKind.MOE,
                             moe=MoeSpec(dense_lead=True, layer_step=True, shared=SharedExpert.ADDED,
                                         gate_optional=True)),
    # glm4-moe.cpp: sigmoid gating unless the file says otherwise; its MTP block is not part of the trunk
    "glm4moe": ArchSpec(RopeMode.NEOX, FfnKind.MOE, attn_bias=True, ffn_norm=MODEL_TENSOR.ATTN_POST_NORM,
                        qk_norm_optional=True,
                        moe=MoeSpec(MoeGating.SIGMOID, norm_w=False, gating_key=True, norm_w_key=True,
                                    scale_key=True, dense_lead=True, shared=SharedExpert.ADDED)),
    "deepseek": ArchSpec(RopeMode.NORM, FfnKind.MOE,
                         moe=MoeSpec(norm_w=False, scale_key=True, dense_lead=True, shared=SharedExpert.ADDED)),
    "dots1": ArchSpec(RopeMode.NEOX, FfnKind.MOE, qk_norm=True,
                      moe=MoeSpec(gating_key=True, norm_w_key=True, scale_key=True, dense_lead=True,
                                  shared=SharedExpert.ADDED)),
    "hunyuan-moe": ArchSpec(RopeMode.NEOX, FfnKind.MOE, qk_norm=True, qk_norm_after_rope=True,
                            moe=MoeSpec(shared=SharedExpert.ADDED)),
    # exaone-moe.cpp: experts where the layer has ffn_gate_inp (leading_dense_block_count dense first)
    "exaone-moe": ArchSpec(RopeMode.NEOX, FfnKind.MOE, qk_norm=True, nope_full_attn=True,
                           moe=MoeSpec(gating_key=True, norm_w_key=True, scale_key=True, dense_lead=True,
                                       shared=SharedExpert.ADDED)),
    # smallthinker.cpp: ReLU-gated experts routed from the layer input (the file's gating)
    "smallthinker": ArchSpec(RopeMode.NEOX, FfnKind.MOE, nope_every_from_first=4,
                             moe=MoeSpec(glu="REGLU", gating_key=True, router_on_input=True)),
    # afmoe.cpp: the layer itself is runtime/engine/afmoe.py (gated attention output, post norms)
    "afmoe": ArchSpec(RopeMode.NEOX, FfnKind.MOE, qk_norm=True, embd_scale=True, swa_rope_from_base=True,
                      nope_every=4,
                      moe=MoeSpec(MoeGating.SIGMOID, norm_w=False, gating_key=True, norm_w_key=True, scale_key=True,
                                  dense_lead=True, shared=SharedExpert.ADDED)),
    # phi3.cpp (phimoe's graph): runtime/engine/phimoe.py adds the norm and output biases
    "phimoe": ArchSpec(RopeMode.NEOX, FfnKind.MOE, attn_bias=True, q_prescale=True),
    "minimax-m2": ArchSpec(RopeMode.NEOX, FfnKind.MOE, qk_norm_full=True,
                           moe=MoeSpec(MoeGating.SIGMOID, gating_key=True)),
    # glm5: minimax-m3.cpp, per-head Q/K norms, clamped-SwiGLU experts (and dense FFNs: runtime/engine/msa.py,
    # which builds its MiniMax Sparse Attention)
    "minimax-m3": ArchSpec(RopeMode.NEOX, FfnKind.MOE, qk_norm=True,
                           moe=MoeSpec(MoeGating.SIGMOID, glu="SWIGLU_OAI", gating_key=True, norm_w_key=True,
                                       scale_key=True, dense_lead=True, shared=SharedExpert.ADDED)),
    # moe26: hy-v3.cpp: per-head Q/K norms, the file's sigmoid routing with a selection bias, a shared expert,
    # dense blocks where the file has no router; its MTP block is not part of the trunk
    "hy_v3": ArchSpec(RopeMode.NEOX, FfnKind.MOE, qk_norm=True, norm_is_output=True,
                      moe=MoeSpec(MoeGating.SIGMOID, norm_w=False, gating_key=True, norm_w_key=True, scale_key=True,
                                  shared=SharedExpert.ADDED, moe_where_router=True, probs_b_bare=True)),
    # moe26: mimo2.cpp: iSWA with sinks where the file has them, K and V heads of their own widths, the output
    # projection scaled by the file's value scale, sigmoid routing (normalised) with the selection bias, dense
    # blocks where the file has no router; its MTP blocks are not part of the trunk; runtime/engine/mimo2.py
    # adds the fused attn_qkv of the files that have one
    "mimo2": ArchSpec(RopeMode.NEOX, FfnKind.MOE, v_head_own=True, value_scale_key=True,
                      moe=MoeSpec(MoeGating.SIGMOID, norm_w=True, moe_where_router=True)),
    # moe26: step35.cpp: the file's sigmoid routing with the selection bias and a shared expert, dense blocks
    # where the file has no router; heads, RoPE, the head-wise gate and the SwiGLU clamps per block are
    # runtime/engine/step35.py's
    "step35": ArchSpec(RopeMode.NEOX, FfnKind.MOE, trunk_is_output=True, per_block_heads=True,
                       moe=MoeSpec(MoeGating.SIGMOID, norm_w=False, gating_key=True, norm_w_key=True, scale_key=True,
                                   shared=SharedExpert.ADDED, moe_where_router=True)),
    # mla: llama4.cpp's attention (chunked layers rope from the base's frequencies) and FFNs;
    # runtime/engine/llama4.py builds its NoPE layers, Q/K L2 norms and experts
    "llama4": ArchSpec(RopeMode.NORM, FfnKind.SWIGLU, swa_rope_from_base=True),
    # --- moe3: qwen3vlmoe.cpp is qwen3moe's layer with qwen3vl's M-RoPE and deepstack inputs (fused.py builds it)
    "qwen3vlmoe": ArchSpec(RopeMode.IMROPE, FfnKind.MOE, qk_norm=True, mrope=True),
    # granite-moe.cpp (granite.cpp's graph): granite's four scales, softmax experts (ffn_gate_exps optional),
    # a shared expert added where the file has one
    "granitemoe": ArchSpec(RopeMode.NORM, FfnKind.MOE, scales_from_file=True,
                           moe=MoeSpec(shared=SharedExpert.ADDED, gate_optional=True)),
    # cohere2moe.cpp: cohere2's parallel layer over experts (the file's gating, sigmoid by default; leading dense
    # layers roped); runtime/engine/cohere2moe.py adds the halved shared-expert sum and the output-row pick
    "cohere2moe": ArchSpec(RopeMode.NORM, FfnKind.MOE, parallel=True, logit_scale=True, rope_swa_only=True,
                           swa_rope_from_base=True,
                           moe=MoeSpec(MoeGating.SIGMOID, norm_w=False, gating_key=True, norm_w_key=True,
                                       scale_key=True, dense_lead=True, shared=SharedExpert.ADDED)),
    # bailingmoe2.cpp: fused QKV, per-head Q/K norms, partial NEOX RoPE; the file's gating, norm, scale and
    # expert groups, leading dense layers, a shared expert added
    "bailingmoe2": ArchSpec(RopeMode.NEOX, FfnKind.MOE, qk_norm=True, fused_qkv=True,
                            moe=MoeSpec(gating_key=True, norm_w_key=True, scale_key=True, dense_lead=True,
                                        shared=SharedExpert.ADDED, groups=True)),
    # --- hybrid helper: qwen35*.cpp (runtime/engine/qwen35.py: interleaved M-RoPE, split beta/alpha)
    "qwen35": ArchSpec(RopeMode.NEOX, FfnKind.SWIGLU, qk_norm=True),
    "qwen35moe": ArchSpec(RopeMode.NEOX, FfnKind.MOE, qk_norm=True),
    # nemotron-h.cpp (runtime/engine/nemotronh.py: Mamba-2, RoPE-less attention and relu^2 FFN blocks)
    "nemotron_h": ArchSpec(RopeMode.NORM, FfnKind.SWIGLU),
    "nemotron_h_moe": ArchSpec(RopeMode.NORM, FfnKind.MOE),
    # lfm2.cpp's graph with lfm2moe.cpp's sigmoid-routed experts (runtime/engine/lfm2.py)
    "lfm2moe": ArchSpec(RopeMode.NEOX, FfnKind.SWIGLU, qk_norm=True),
    # mamba.cpp's graph for Mamba-1 or Mamba-2 blocks alone (runtime/engine/mamba.py)
    "mamba": ArchSpec(RopeMode.NORM, FfnKind.SWIGLU),
    "mamba2": ArchSpec(RopeMode.NORM, FfnKind.SWIGLU),
    # falcon-h1.cpp: attention and Mamba-2 in every block (runtime/engine/falconh1.py)
    "falcon-h1": ArchSpec(RopeMode.NORM, FfnKind.SWIGLU),
    # jamba.cpp: Mamba-1, RoPE-less attention, SwiGLU FFN or softmax experts without norm_w
    # (runtime/engine/jamba.py)
    "jamba": ArchSpec(RopeMode.NORM, FfnKind.MOE, moe=MoeSpec(MoeGating.SOFTMAX, norm_w=False)),
    # the Gemma family (helper gemma4)
    # gemma4: gemma4.cpp's Q/K norms, post-norms, scaled embeddings and GELU FFN; runtime/engine/gemma4.py builds
    # it (two head geometries, shared KV, per-layer embeddings)
    "gemma4": ArchSpec(RopeMode.NEOX, FfnKind.GEGLU, qk_norm=True, post_norms=True, embd_scale=True),
    # gemma3n: gemma4's attention with AltUp streams and LAuReL; runtime/engine/gemma3n.py builds it
    "gemma3n": ArchSpec(RopeMode.NEOX, FfnKind.GEGLU, qk_norm=True, post_norms=True, embd_scale=True),
    # gemma (Gemma 1): llama's layer with scaled embeddings, Q pre-scaled by 1/sqrt(head_dim), GELU FFN (gemma.cpp)
    "gemma": ArchSpec(RopeMode.NEOX, FfnKind.GEGLU, embd_scale=True, q_prescale=True),
    # gemma-embedding: gemma3's layer without a cache and without logits; runtime/engine/gemma_embedding.py
    "gemma-embedding": ArchSpec(RopeMode.NEOX, FfnKind.GEGLU, qk_norm=True, post_norms=True, embd_scale=True,
                                q_prescale=True),
}

# the BERT-family encoders (helper embed): bert.cpp's post-norm blocks with LayerNorm and biases, without a cache;
# runtime/engine/bert.py builds them
ARCHS.update({
    "bert": ArchSpec(RopeMode.NEOX, FfnKind.GELU, layer_norm=True, learned_pos=True),
    "nomic-bert": ArchSpec(RopeMode.NEOX, FfnKind.SWIGLU, layer_norm=True),
    "jina-bert-v3": ArchSpec(RopeMode.NEOX, FfnKind.GELU, layer_norm=True),
    # jina-bert-v2.cpp: bert.cpp's graph without positions (ALiBi), GeGLU over one ffn_up of 2 * n_ff
    "jina-bert-v2": ArchSpec(RopeMode.NORM, FfnKind.GEGLU, layer_norm=True, alibi_max_bias=8.0),
    # modern-bert.cpp: pre-norm blocks, a GeGLU over ffn_up's halves, sliding windows in two blocks of three
    "modern-bert": ArchSpec(RopeMode.NEOX, FfnKind.GEGLU, layer_norm=True),
})

# llama-hparams.h: rope_freq_base_train_swa defaults to 10000 (gemma3 reads an override key)
DEFAULT_FREQ_BASE_SWA = 10000.0
# llama-hparams.h: f_attn_logit_softcapping's default
DEFAULT_ATTN_SOFTCAP = 50.0


@dataclass(frozen=True)
class MoeRouting:
    """One model's expert routing: the gating, weight normalisation and scale build_moe_ffn gets, and
    which trunk layers run the experts (the others a dense FFN)."""

    gating: MoeGating
    norm_w: bool
    w_scale: float               # 0 or 1: no scale node
    moe_layers: tuple[bool, ...]
    # moe3: expert groups (expert_group_count, expert_group_used_count; 0: none)
    n_groups: int = 0
    n_group_used: int = 0


@dataclass(frozen=True)
class HParams:
    arch: str
    spec: ArchSpec
    n_layer: int
    n_embd: int
    n_vocab: int
    n_ctx_train: int
    n_head: int
    n_head_kv: tuple[int, ...]
    head_dim: int
    n_rot: int
    eps: float
    freq_base: float
    freq_base_swa: float
    freq_scale: float
    freq_scale_swa: float
    swa: tuple[bool, ...]
    n_swa: int
    kq_scale: float            # scale inside attention (1.0 when Q is pre-scaled)
    q_scale: float             # gemma3's pre-scale of Q, 1.0 elsewhere
    softcap: float             # final logit soft-capping, 0 when off
    attn_softcap: float = 0.0  # attention logit soft-capping (gemma2), 0 when off
    ext_factor: float = 0.0    # YaRN's extrapolation mix (1 with YaRN scaling: the runtime sizes it only)
    n_ctx_orig: int = 0        # YaRN's original context
    n_expert: int = 0
    n_expert_used: int = 0
    # dense
    embd_scale_f: float = 0.0      # granite's f_embedding_scale (0: none)
    residual_scale: float = 0.0    # granite's f_residual_scale (0: none)
    logit_scale: float = 0.0       # granite's f_logit_scale: logits divided by it (0: none)
    attn_temp_scale: float = 0.0   # mistral3's f_attn_temp_scale (0: no temperature input)
    xielu: tuple[tuple[float, float, float, float], ...] = ()   # apertus: (alpha_n, alpha_p, beta, eps) per layer
    # moe: build_moe_ffn's arguments as this file's loader resolves them
    routing: MoeRouting | None = None
    # moe26: V's head width where it differs from K's (0: head_dim), mimo2's attention output scale (0: none)
    head_dim_v: int = 0
    attn_value_scale: float = 0.0
    # step35: heads per block, the sliding-window blocks' rotated dims, the SwiGLU clamps per block
    n_heads: tuple[int, ...] = ()
    n_rot_swa: int = 0
    swiglu_clamp_exp: tuple[float, ...] = ()
    swiglu_clamp_shexp: tuple[float, ...] = ()

    @property
    def hd_v(self) -> int:
        return self.head_dim_v or self.head_dim

    def n_embd_v_gqa(self, il: int) -> int:
        return self.hd_v * self.n_head_kv[il]

    def n_embd_gqa(self, il: int) -> int:
        return self.head_dim * self.n_head_kv[il]


def _get(model: ModelFile, template: str, default: float) -> float:
    """A numeric `{arch}` key (a gguf-py `Keys` template); `default` only when the key is absent."""
    return float(model.metadata.get(template.format(arch=model.architecture), default))


def read_hparams(model: ModelFile, facts: ModelFacts | None = None) -> HParams:
    """HParams for an architecture with a graph builder; GGUFError for any other. `facts`: the
    model's facts when the caller has them already (a ModelContext does)."""
    arch = model.architecture
    spec = ARCHS.get(arch)
    if spec is None:
        raise GGUFError(model.path, f"the runtime has no graph builder for architecture {arch!r} "
                                    f"(it has: {', '.join(ARCHS)})")
    facts = facts or model_facts(model)
    trunk = [lf for lf in facts.layers if not lf.nextn]
    heads = _head_layers(trunk)
    head_dim = heads[0].head_dim_k
    head_dim_v = _one_head_size(model, spec, heads)
    rope = _rope(model, spec, head_dim, facts.n_ctx_train)
    _check_heads(model, facts, trunk, heads)
    q_scale, kq_scale = _attention_scales(spec, facts, trunk, head_dim)
    dense: dict[str, Any] = dict(_dense_scales(model, spec))   # spread among fields of other types
    kq_scale = dense.pop("kq_scale", kq_scale)
    window = max((lf.window for lf in trunk), default=0)
    return HParams(
        arch=arch, spec=spec, n_layer=facts.n_layer, n_embd=facts.n_embd, n_vocab=facts.n_vocab,
        n_ctx_train=facts.n_ctx_train, n_head=heads[0].n_head,
        n_head_kv=tuple(lf.n_head_kv for lf in trunk), head_dim=head_dim,
        eps=_get(model, Keys.Attention.LAYERNORM_RMS_EPS, 1e-5),
        swa=tuple(lf.kind is AttnKind.SWA for lf in trunk), n_swa=window,
        kq_scale=kq_scale, q_scale=q_scale,
        softcap=_get(model, Keys.LLM.FINAL_LOGIT_SOFTCAPPING, spec.final_softcap),
        attn_softcap=_get(model, Keys.LLM.ATTN_LOGIT_SOFTCAPPING, DEFAULT_ATTN_SOFTCAP) if spec.attn_softcap else 0.0,
        n_expert=facts.n_expert, n_expert_used=facts.n_expert_used,
        xielu=_xielu(model, spec, facts.n_layer), **dense, **rope,
        routing=read_routing(model, spec, facts.n_layer) if spec.ffn is FfnKind.MOE else None,
        head_dim_v=head_dim_v if head_dim_v != head_dim else 0, attn_value_scale=_value_scale(model, spec),
        **(_per_block(model, trunk, rope["n_rot"]) if spec.per_block_heads else {}),
    )


def _head_layers(trunk: list[LayerFacts]) -> list[LayerFacts]:
    """The layers whose heads the model's head counts and sizes come from: the attending ones, where
    there are any. Recurrent layers (granitehybrid's Mamba-2 layers) have no heads, FFN-only blocks
    (nemotron_h's) neither."""
    attending = [lf for lf in trunk if lf.kind not in (AttnKind.RECURRENT, AttnKind.NONE)]
    return attending or trunk


def _one_head_size(model: ModelFile, spec: ArchSpec, heads: list[LayerFacts]) -> int:
    """V's head size (K's unless ArchSpec.v_head_own), refusing a model whose layers differ in K's or V's."""
    head_dim = heads[0].head_dim_k
    head_dim_v = heads[0].head_dim_v if spec.v_head_own else head_dim
    if any(lf.head_dim_v != head_dim_v or lf.head_dim_k != head_dim for lf in heads):
        raise GGUFError(model.path, "the runtime's builders need one head size for K and V in every layer")
    return head_dim_v


def _rope(model: ModelFile, spec: ArchSpec, head_dim: int, n_ctx_train: int) -> dict[str, Any]:
    """The HParams fields of RoPE: rotated dims, bases and scales (linear and YaRN scaling; any other
    scaling type is refused)."""
    arch = model.architecture
    scale_type = str(model.metadata.get(Keys.Rope.SCALING_TYPE.format(arch=arch), "none") or "none")
    freq_scale = 1.0
    if scale_type in ("linear", "yarn"):
        freq_scale = 1.0 / (_get(model, Keys.Rope.SCALING_FACTOR, 1.0) or 1.0)
    elif scale_type not in ("none", ""):
        raise GGUFError(model.path, f"rope scaling {scale_type!r} is not implemented in the runtime")
    freq_base = _get(model, Keys.Rope.FREQ_BASE, 10000.0) or 10000.0
    base_swa = freq_base if spec.swa_rope_from_base else DEFAULT_FREQ_BASE_SWA
    return dict(
        n_rot=int(_get(model, Keys.Rope.DIMENSION_COUNT, head_dim) or head_dim),
        freq_base=freq_base, freq_base_swa=_get(model, Keys.Rope.FREQ_BASE_SWA, base_swa) or base_swa,
        freq_scale=freq_scale, freq_scale_swa=freq_scale if spec.swa_rope_from_base else 1.0,
        ext_factor=1.0 if scale_type == "yarn" else 0.0,
        n_ctx_orig=int(_get(model, Keys.Rope.SCALING_ORIG_CTX_LEN, n_ctx_train)),
    )


def _check_heads(model: ModelFile, facts: ModelFacts, trunk: list[LayerFacts], heads: list[LayerFacts]) -> None:
    """A model with layers has attention heads, unless its blocks are all recurrent (mamba2)."""
    recurrent_only = all(lf.kind is AttnKind.RECURRENT for lf in trunk)
    if facts.n_layer and heads[0].n_head * heads[0].head_dim_k == 0 and not recurrent_only:
        raise GGUFError(model.path, "no attention heads")


def _attention_scales(spec: ArchSpec, facts: ModelFacts, trunk: list[LayerFacts], head_dim: int
                      ) -> tuple[float, float]:
    """(q_scale, kq_scale): 1/sqrt(head_dim) inside attention, or, where ArchSpec.q_prescale (gemma3's
    load_arch_hparams), on Q before it: 1/sqrt(head_dim), 1/sqrt(n_embd/n_head) for the 27B."""
    kq_scale = 1.0 / math.sqrt(head_dim) if head_dim else 1.0
    if not spec.q_prescale:
        return 1.0, kq_scale
    big = facts.n_layer == spec.big_model_layers
    return (1.0 / math.sqrt(facts.n_embd / trunk[0].n_head) if big else kq_scale), 1.0


def _per_block(model: ModelFile, trunk: list[LayerFacts], n_rot: int) -> dict[str, Any]:
    """step35: each block's heads, the sliding-window blocks' rope.dimension_count_swa (load_hparams: the
    unhalved rope.dimension_count when absent) and the SwiGLU clamps (get_key_or_arr, absent: none)."""
    n = len(trunk)
    clamps = {}
    for field, template in (("swiglu_clamp_exp", Keys.LLM.SWIGLU_CLAMP_EXP),
                            ("swiglu_clamp_shexp", Keys.LLM.SWIGLU_CLAMP_SHEXP)):
        v = model.metadata.get(template.format(arch=model.architecture), 0.0)
        clamps[field] = tuple(float(x) for x in v)[:n] if isinstance(v, (list, tuple)) else (float(v),) * n
    return dict(n_heads=tuple(lf.n_head for lf in trunk),
                n_rot_swa=int(_get(model, Keys.Rope.DIMENSION_COUNT_SWA, n_rot) or n_rot), **clamps)


def _value_scale(model: ModelFile, spec: ArchSpec) -> float:
    """mimo2.cpp load_arch_hparams: f_attn_value_scale only where the key is set and not 1."""
    if not spec.value_scale_key:
        return 0.0
    v = _get(model, LLM_KV_ATTENTION_VALUE_SCALE, 0.0)
    return 0.0 if v == 1.0 else v


def _dense_scales(model: ModelFile, spec: ArchSpec) -> dict[str, float]:
    """granite's four scales (load_arch_hparams: the logit scale is required, the others optional) and
    mistral3's attention temperature; the attention scale replaces 1/sqrt(head_dim) when set."""
    out: dict[str, float] = {}
    if spec.scales_from_file:
        out.update(embd_scale_f=_get(model, Keys.LLM.EMBEDDING_SCALE, 0.0),
                   residual_scale=_get(model, Keys.LLM.RESIDUAL_SCALE, 0.0),
                   logit_scale=_get(model, Keys.LLM.LOGIT_SCALE, 0.0))
        attn_scale = _get(model, Keys.Attention.SCALE, 0.0)
        if attn_scale:
            out["kq_scale"] = attn_scale
    if spec.attn_temp:
        out["attn_temp_scale"] = _get(model, Keys.Attention.TEMPERATURE_SCALE, 0.0)
    return out


def _xielu(model: ModelFile, spec: ArchSpec, n_layer: int) -> tuple[tuple[float, float, float, float], ...]:
    """apertus' xIELU constants (keys without the architecture prefix, a scalar or one per layer; required)."""
    if spec.ffn is not FfnKind.XIELU:
        return ()
    cols = []
    for k in (Keys.xIELU.ALPHA_N, Keys.xIELU.ALPHA_P, Keys.xIELU.BETA, Keys.xIELU.EPS):
        v = model.metadata.get(k)
        if v is None:
            raise GGUFError(model.path, f"key not found in model: {k}")
        cols.append([float(x) for x in v][:n_layer] if isinstance(v, (list, tuple)) else [float(v)] * n_layer)
    if any(len(c) < n_layer for c in cols):
        raise GGUFError(model.path, f"the xIELU arrays hold fewer values than the model's {n_layer} layers")
    return tuple(zip(*cols, strict=True))


def read_routing(model: ModelFile, spec: ArchSpec, n_layer: int) -> MoeRouting:
    """The keys an architecture's load_arch_hparams reads for build_moe_ffn (MoeSpec says which)."""
    moe, meta, arch = spec.moe, model.metadata, model.architecture
    # llama-model.cpp reads expert_group_count for every architecture; above 1 build_moe_ffn first keeps
    # the best groups (argsort_top_k, sum_rows, fill, set_rows), which the runtime builds where MoeSpec.groups
    groups = int(_get(model, Keys.LLM.EXPERT_GROUP_COUNT, 0))
    group_used = int(_get(model, Keys.LLM.EXPERT_GROUP_USED_COUNT, 0))
    if groups > 1 and not moe.groups:
        raise GGUFError(model.path, f"expert groups (expert_group_count {groups}) are not implemented in the runtime")
    gating = moe.gating
    if moe.gating_key:
        code = int(meta.get(Keys.LLM.EXPERT_GATING_FUNC.format(arch=arch), 0) or 0)
        if code and code not in GATING_FUNCS:
            raise GGUFError(model.path, f"expert_gating_func {code} is not implemented in the runtime")
        gating = GATING_FUNCS.get(code, gating)
    norm_w = bool(meta.get(Keys.LLM.EXPERT_WEIGHTS_NORM.format(arch=arch), False)) if moe.norm_w_key else moe.norm_w
    lead = int(_get(model, Keys.LLM.LEADING_DENSE_BLOCK_COUNT, 0)) if moe.dense_lead else 0
    step = int(_get(model, Keys.LLM.INTERLEAVE_MOE_LAYER_STEP, 0)) if moe.layer_step else 1
    if step <= 0:   # ernie4-5-moe.cpp asserts n_moe_layer_step > 0
        raise GGUFError(model.path, f"{arch}: interleave_moe_layer_step must be > 0")
    moe_layers = tuple(il >= lead and (il + 1) % step == 0 for il in range(n_layer))
    if moe.moe_where_router:
        moe_layers = tuple(model.tensor(tensor_name(MODEL_TENSOR.FFN_GATE_INP, il)) is not None
                           for il in range(n_layer))
    return MoeRouting(gating=gating, norm_w=norm_w,
                      w_scale=_get(model, Keys.LLM.EXPERT_WEIGHTS_SCALE, 0.0) if moe.scale_key else 0.0,
                      moe_layers=moe_layers,
                      n_groups=groups if groups > 1 else 0, n_group_used=group_used if groups > 1 else 0)
