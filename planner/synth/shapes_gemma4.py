"""Gemma 4 files: the layout llama.cpp's gemma4 loader creates, and the published models' dimensions.

`gemma4_spec` lays out tensors as the pinned llama.cpp's `llama_model_gemma4::load_arch_tensors`
creates them (src/models/gemma4.cpp): Q/K norms on every layer, a post-attention and a post-FFN norm,
a per-layer output scale, one `rope_freqs` table for the full-attention layers (their proportional
RoPE), no K/V projections on the layers that reuse an earlier layer's cache (shared KV), no V
projection where the model's full layers take V from K (`attention_k_eq_v`), per-layer embeddings
(PLE) where `n_embd_per_layer` is set, and the MoE block (a dense FFN next to the experts, a router
with its own scale) where `n_expert` is set. Keys are those convert_hf_to_gguf's Gemma4Model writes
(conversion/gemma.py): per-layer sliding-window flags, head sizes and RoPE dimensions per attention
kind, KV heads per layer, n_ff per layer with a double-wide MLP.

The published shapes (Hugging Face config.json of google/gemma-4-*): E2B (PLE, shared KV, 4:1
sliding:full), 31B (dense, 5:1, K=V full layers), 26B-A4B (the MoE block). Types are the Q4_K_M mix
llama-quantize writes (Q4_K matrices, Q6_K V and FFN-down, Q6_K tied embeddings, f32 routers); only byte sizes
matter here.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gguf import Keys

from planner.synth.gguf_factory import ModelSpec, Q, T, _common, add_tokenizer, gemma3_spec


@dataclass(frozen=True)
class Gemma4Dims:
    n_embd: int
    n_head: int
    swa: tuple[bool, ...]           # one flag per block (layer_types == "sliding_attention")
    n_head_kv_swa: int
    n_head_kv_full: int
    head_swa: int
    head_full: int
    n_ff: int
    n_vocab: int
    window: int
    shared_kv: int = 0              # num_kv_shared_layers: the last blocks reuse earlier caches
    double_wide: bool = False       # use_double_wide_mlp: shared-KV blocks have 2 x n_ff
    n_embd_per_layer: int = 0       # hidden_size_per_layer_input (PLE), 0 for none
    k_eq_v: bool = False            # attention_k_eq_v: full layers have no V projection
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    rot_swa: int = 0                # rope.dimension_count_swa, 0: the whole SWA head
    n_ctx: int = 131072
    softcap: float = 30.0


@dataclass(frozen=True)
class Gemma4Types:
    mat: Q = Q.Q4_K
    v: Q = Q.Q6_K
    down: Q = Q.Q6_K
    embd: Q = Q.Q6_K
    ple: Q = Q.Q6_K
    exp_down: Q = Q.Q6_K            # the experts' down matrices (rows of n_ff_exp)


def gemma4_spec(d: Gemma4Dims, ty: Gemma4Types = Gemma4Types()) -> ModelSpec:
    """A gemma4 file of dimensions `d` and types `ty` (tied embeddings: no `output`)."""
    n_layer = len(d.swa)
    first_shared = n_layer - d.shared_kv
    n_ff = [d.n_ff * 2 if d.double_wide and il >= first_shared else d.n_ff for il in range(n_layer)]
    kv = [d.n_head_kv_swa if s else d.n_head_kv_full for s in d.swa]
    spec = ModelSpec("gemma4")
    _common(spec, n_layer, d.n_embd, d.n_vocab, n_ctx=d.n_ctx)
    spec.metadata.update({
        Keys.Attention.HEAD_COUNT: d.n_head, Keys.Attention.HEAD_COUNT_KV: kv,
        Keys.LLM.FEED_FORWARD_LENGTH: n_ff if d.double_wide else d.n_ff,
        Keys.Attention.KEY_LENGTH: d.head_full, Keys.Attention.VALUE_LENGTH: d.head_full,
        Keys.Attention.KEY_LENGTH_SWA: d.head_swa, Keys.Attention.VALUE_LENGTH_SWA: d.head_swa,
        Keys.Rope.DIMENSION_COUNT: d.head_full, Keys.Rope.DIMENSION_COUNT_SWA: d.rot_swa or d.head_swa,
        Keys.Rope.FREQ_BASE: 1000000.0, Keys.Rope.FREQ_BASE_SWA: 10000.0,
        Keys.Attention.SLIDING_WINDOW: d.window, Keys.Attention.SLIDING_WINDOW_PATTERN: list(d.swa),
        Keys.Attention.SHARED_KV_LAYERS: d.shared_kv, Keys.LLM.EMBD_LENGTH_PER_LAYER_INP: d.n_embd_per_layer,
        Keys.LLM.FINAL_LOGIT_SOFTCAPPING: d.softcap,
    })
    if d.n_expert:
        spec.metadata.update({Keys.LLM.EXPERT_COUNT: d.n_expert, Keys.LLM.EXPERT_USED_COUNT: d.n_expert_used,
                              Keys.LLM.EXPERT_FEED_FORWARD_LENGTH: d.n_ff_exp})
    spec.add(T.TOKEN_EMBD, ty.embd, (d.n_embd, d.n_vocab))
    if d.n_embd_per_layer:
        pl = d.n_embd_per_layer * n_layer
        spec.add(T.PER_LAYER_TOKEN_EMBD, ty.ple, (pl, d.n_vocab))
        spec.add(T.PER_LAYER_MODEL_PROJ, ty.mat, (d.n_embd, pl))
        spec.add(T.PER_LAYER_PROJ_NORM, Q.F32, (d.n_embd_per_layer,))
    spec.add(T.OUTPUT_NORM, Q.F32, (d.n_embd,))
    rope_freqs = False
    for il in range(n_layer):
        _layer(spec, d, ty, il, kv[il], n_ff[il], has_kv=il < first_shared)
        if not d.swa[il] and not rope_freqs:
            spec.add(T.ROPE_FREQS, Q.F32, (d.head_full // 2,))
            rope_freqs = True
    return spec


def _layer(spec: ModelSpec, d: Gemma4Dims, ty: Gemma4Types, il: int, n_kv: int, n_ff: int, has_kv: bool) -> None:
    hd = d.head_swa if d.swa[il] else d.head_full
    spec.add(T.ATTN_NORM, Q.F32, (d.n_embd,), il)
    spec.add(T.ATTN_Q, ty.mat, (d.n_embd, hd * d.n_head), il)
    if has_kv:
        spec.add(T.ATTN_K, ty.mat, (d.n_embd, hd * n_kv), il)
        if d.swa[il] or not d.k_eq_v:
            spec.add(T.ATTN_V, ty.v, (d.n_embd, hd * n_kv), il)
        spec.add(T.ATTN_K_NORM, Q.F32, (hd,), il)
    spec.add(T.ATTN_OUT, ty.mat, (hd * d.n_head, d.n_embd), il)
    spec.add(T.ATTN_Q_NORM, Q.F32, (hd,), il)
    spec.add(T.ATTN_POST_NORM, Q.F32, (d.n_embd,), il)
    spec.add(T.LAYER_OUT_SCALE, Q.F32, (1,), il)
    spec.add(T.FFN_NORM, Q.F32, (d.n_embd,), il)
    spec.add(T.FFN_GATE, ty.mat, (d.n_embd, n_ff), il)
    spec.add(T.FFN_UP, ty.mat, (d.n_embd, n_ff), il)
    spec.add(T.FFN_DOWN, ty.down, (n_ff, d.n_embd), il)
    spec.add(T.FFN_POST_NORM, Q.F32, (d.n_embd,), il)
    if d.n_expert:
        spec.add(T.FFN_GATE_INP, Q.F32, (d.n_embd, d.n_expert), il)   # llama-quantize leaves routers f32
        spec.add(T.FFN_GATE_INP, Q.F32, (d.n_embd,), il, "scale")
        spec.add(T.FFN_PRE_NORM_2, Q.F32, (d.n_embd,), il)
        spec.add(T.FFN_POST_NORM_1, Q.F32, (d.n_embd,), il)
        spec.add(T.FFN_POST_NORM_2, Q.F32, (d.n_embd,), il)
        spec.add(T.FFN_GATE_UP_EXP, ty.mat, (d.n_embd, 2 * d.n_ff_exp, d.n_expert), il)
        spec.add(T.FFN_DOWN_EXP, ty.exp_down, (d.n_ff_exp, d.n_embd, d.n_expert), il)
        spec.add(T.FFN_DOWN_EXP, Q.F32, (d.n_expert,), il, "scale")
    if d.n_embd_per_layer:
        spec.add(T.PER_LAYER_INP_GATE, ty.mat, (d.n_embd, d.n_embd_per_layer), il)
        spec.add(T.PER_LAYER_PROJ, ty.mat, (d.n_embd_per_layer, d.n_embd), il)
        spec.add(T.PER_LAYER_POST_NORM, Q.F32, (d.n_embd,), il)


def pattern(n_layer: int, every: int) -> tuple[bool, ...]:
    """Sliding layers with a full one every `every` blocks (layer_types of the published configs)."""
    return tuple((il + 1) % every != 0 for il in range(n_layer))


def tokenized(spec: ModelSpec, n_vocab: int) -> ModelSpec:
    add_tokenizer(spec, n_vocab, n_merges=1)
    spec.metadata[Keys.Tokenizer.PRE] = "default"
    return spec


def gemma4_e2b() -> ModelSpec:
    """google/gemma-4-E2B: 35 layers (4 sliding : 1 full), 1536 wide, 8 heads / 1 KV of 256 (full: 512),
    window 512, the last 20 layers reuse earlier caches and have a double-wide MLP (6144 -> 12288),
    per-layer embeddings of 256, 262144 vocab, 128k context."""
    d = Gemma4Dims(n_embd=1536, n_head=8, swa=pattern(35, 5), n_head_kv_swa=1, n_head_kv_full=1, head_swa=256,
                   head_full=512, n_ff=6144, n_vocab=262144, window=512, shared_kv=20, double_wide=True,
                   n_embd_per_layer=256)
    return tokenized(gemma4_spec(d), 262144)


def gemma4_31b() -> ModelSpec:
    """google/gemma-4-31B: 60 layers (5 sliding : 1 full), 5376 wide, 32 heads; sliding layers 16 KV heads
    of 256, full layers 4 KV heads of 512 with V taken from K; window 1024, n_ff 21504, 262144 vocab,
    256k context."""
    d = Gemma4Dims(n_embd=5376, n_head=32, swa=pattern(60, 6), n_head_kv_swa=16, n_head_kv_full=4, head_swa=256,
                   head_full=512, n_ff=21504, n_vocab=262144, window=1024, k_eq_v=True, n_ctx=262144)
    return tokenized(gemma4_spec(d), 262144)


def gemma4_26b_a4b() -> ModelSpec:
    """google/gemma-4-26B-A4B: 30 layers (5 sliding : 1 full), 2816 wide, 16 heads; sliding layers 8 KV heads
    of 256, full layers 2 KV heads of 512 with V taken from K; window 1024; every layer a dense GELU FFN of 2112
    beside 128 experts (8 used) of 704; 262144 vocab, 256k context. Rows of 2112 and 704 are no multiple of 256,
    so llama-quantize's Q6_K falls back to Q8_0 for ffn_down and the experts' down matrices."""
    d = Gemma4Dims(n_embd=2816, n_head=16, swa=pattern(30, 6), n_head_kv_swa=8, n_head_kv_full=2, head_swa=256,
                   head_full=512, n_ff=2112, n_vocab=262144, window=1024, k_eq_v=True, n_expert=128,
                   n_expert_used=8, n_ff_exp=704, n_ctx=262144)
    return tokenized(gemma4_spec(d, Gemma4Types(down=Q.Q8_0, exp_down=Q.Q8_0)), 262144)


def tiny_gemma4(*, swa: Sequence[bool] = (True, True, False, True, False), shared_kv: int = 0,
                n_embd_per_layer: int = 0, k_eq_v: bool = False, double_wide: bool = False,
                heads: tuple[int, int, int, int] = (32, 2, 64, 1), n_expert: int = 0) -> ModelSpec:
    """A few-layer gemma4 file for node-level checks (Q8_0 weights, 512 tokens); `heads`: the sliding
    layers' head size and KV heads, then the full layers'."""
    d = Gemma4Dims(n_embd=128, n_head=4, swa=tuple(swa), n_head_kv_swa=heads[1], n_head_kv_full=heads[3],
                   head_swa=heads[0], head_full=heads[2], n_ff=256, n_vocab=512, window=64, shared_kv=shared_kv,
                   double_wide=double_wide, n_embd_per_layer=n_embd_per_layer, k_eq_v=k_eq_v, n_ctx=4096,
                   n_expert=n_expert, n_expert_used=2 if n_expert else 0, n_ff_exp=64)
    ty = Gemma4Types(mat=Q.Q8_0, v=Q.Q8_0, down=Q.Q8_0, embd=Q.Q8_0, ple=Q.Q8_0, exp_down=Q.Q8_0)
    return tokenized(gemma4_spec(d, ty), 512)


# --- gemma3n (src/models/gemma3n.cpp) -----------------------------------------------------------------
# llama-hparams.h defaults gemma3n's loader never overrides: four AltUp streams, LAuReL rank 64, PLE width 256
GEMMA3N_ALTUP, GEMMA3N_LAUREL_RANK, GEMMA3N_PLE = 4, 64, 256


def gemma3n_spec(*, n_layer: int, n_embd: int, n_head: int, n_head_kv: int, head_dim: int, n_ff: int, n_vocab: int,
                 window: int, shared_kv: int, swa: Sequence[bool] | None = None, ty: Gemma4Types = Gemma4Types(),
                 small: Q = Q.Q8_0) -> ModelSpec:
    """A gemma3n file as llama_model_gemma3n::load_arch_tensors creates it: every block with Q, K and V (shared-KV
    blocks too), Q/K norms, post norms, the per-layer embeddings, AltUp's router and coefficients and LAuReL's
    low-rank pair; tied embeddings; `small` for the matrices whose rows are too short for a K-quant."""
    spec = ModelSpec("gemma3n")
    _common(spec, n_layer, n_embd, n_vocab, n_ctx=32768)
    spec.metadata.update({
        Keys.Attention.HEAD_COUNT: n_head, Keys.Attention.HEAD_COUNT_KV: n_head_kv, Keys.LLM.FEED_FORWARD_LENGTH: n_ff,
        Keys.Attention.KEY_LENGTH: head_dim, Keys.Attention.VALUE_LENGTH: head_dim,
        Keys.Rope.FREQ_BASE: 1000000.0, Keys.Rope.FREQ_BASE_SWA: 10000.0, Keys.Attention.SLIDING_WINDOW: window,
        Keys.LLM.FINAL_LOGIT_SOFTCAPPING: 30.0, Keys.LLM.ALTUP_ACTIVE_IDX: 0,
        Keys.LLM.ALTUP_NUM_INPUTS: GEMMA3N_ALTUP, Keys.LLM.EMBD_LENGTH_PER_LAYER_INP: GEMMA3N_PLE,
        Keys.Attention.SHARED_KV_LAYERS: shared_kv,
        Keys.Attention.SLIDING_WINDOW_PATTERN: list(swa if swa is not None else pattern(n_layer, 5)),
    })
    hd, pl = head_dim, GEMMA3N_PLE
    spec.add(T.TOKEN_EMBD, ty.embd, (n_embd, n_vocab))
    spec.add(T.ALTUP_PROJ, ty.mat, (n_embd, n_embd, GEMMA3N_ALTUP - 1))
    spec.add(T.ALTUP_UNEMBD_PROJ, ty.mat, (n_embd, n_embd, GEMMA3N_ALTUP - 1))
    spec.add(T.PER_LAYER_TOKEN_EMBD, ty.ple, (pl * n_layer, n_vocab))
    spec.add(T.PER_LAYER_MODEL_PROJ, ty.mat, (n_embd, pl * n_layer))
    spec.add(T.PER_LAYER_PROJ_NORM, Q.F32, (pl,))
    spec.add(T.OUTPUT_NORM, Q.F32, (n_embd,))
    for il in range(n_layer):
        spec.add(T.ATTN_NORM, Q.F32, (n_embd,), il)
        spec.add(T.ATTN_Q, ty.mat, (n_embd, hd * n_head), il)
        spec.add(T.ATTN_K, ty.mat, (n_embd, hd * n_head_kv), il)
        spec.add(T.ATTN_V, ty.v, (n_embd, hd * n_head_kv), il)
        spec.add(T.ATTN_OUT, ty.mat, (hd * n_head, n_embd), il)
        spec.add(T.ATTN_Q_NORM, Q.F32, (hd,), il)
        spec.add(T.ATTN_K_NORM, Q.F32, (hd,), il)
        spec.add(T.ATTN_POST_NORM, Q.F32, (n_embd,), il)
        spec.add(T.FFN_NORM, Q.F32, (n_embd,), il)
        spec.add(T.FFN_GATE, ty.mat, (n_embd, n_ff), il)
        spec.add(T.FFN_UP, ty.mat, (n_embd, n_ff), il)
        spec.add(T.FFN_DOWN, ty.down, (n_ff, n_embd), il)
        spec.add(T.FFN_POST_NORM, Q.F32, (n_embd,), il)
        spec.add(T.PER_LAYER_INP_GATE, ty.mat, (n_embd, pl), il)
        spec.add(T.PER_LAYER_PROJ, ty.mat, (pl, n_embd), il)
        spec.add(T.PER_LAYER_POST_NORM, Q.F32, (n_embd,), il)
        spec.add(T.ALTUP_CORRECT_COEF, Q.F32, (GEMMA3N_ALTUP, GEMMA3N_ALTUP), il)
        spec.add(T.ALTUP_CORRECT_SCALE, Q.F32, (n_embd,), il)
        spec.add(T.ALTUP_PREDICT_COEF, Q.F32, (GEMMA3N_ALTUP, GEMMA3N_ALTUP * GEMMA3N_ALTUP), il)
        spec.add(T.ALTUP_ROUTER, small, (n_embd, GEMMA3N_ALTUP), il)
        spec.add(T.ALTUP_ROUTER_NORM, Q.F32, (n_embd,), il)
        spec.add(T.LAUREL_L, ty.mat, (n_embd, GEMMA3N_LAUREL_RANK), il)
        spec.add(T.LAUREL_R, small, (GEMMA3N_LAUREL_RANK, n_embd), il)
        spec.add(T.LAUREL_POST_NORM, Q.F32, (n_embd,), il)
    return spec


def gemma3n_e2b() -> ModelSpec:
    """google/gemma-3n-E2B: 30 layers (4 sliding : 1 full), 2048 wide, 8 heads / 2 KV of 256, window 512, n_ff
    8192, the last 10 layers reuse earlier caches, 262400 tokens (the converter pads both embedding tables to
    the multimodal vocabulary), 32k context."""
    spec = gemma3n_spec(n_layer=30, n_embd=2048, n_head=8, n_head_kv=2, head_dim=256, n_ff=8192, n_vocab=262400,
                        window=512, shared_kv=10)
    return tokenized(spec, 262400)


def tiny_gemma3n(*, n_layer: int = 6, swa: Sequence[bool] | None = None, shared_kv: int = 2,
                 head_dim: int = 64) -> ModelSpec:
    """A few-layer gemma3n file for node-level checks (Q8_0 weights, 512 tokens). The pin's shared-KV start is
    fixed at 20 blocks, so a file of 22 or more blocks is needed for reused caches."""
    ty = Gemma4Types(mat=Q.Q8_0, v=Q.Q8_0, down=Q.Q8_0, embd=Q.Q8_0, ple=Q.Q8_0, exp_down=Q.Q8_0)
    spec = gemma3n_spec(n_layer=n_layer, n_embd=128, n_head=4, n_head_kv=2, head_dim=head_dim, n_ff=256, n_vocab=512,
                        window=64, shared_kv=shared_kv, swa=swa, ty=ty, small=Q.F32)
    return tokenized(spec, 512)


# --- gemma-embedding (src/models/gemma-embedding.cpp): gemma3's tensors under another architecture ----------------
def gemma_embedding_spec(*, n_layer: int, n_embd: int, n_head: int, n_head_kv: int, head_dim: int, n_ff: int,
                         n_vocab: int, window: int, n_ctx: int) -> ModelSpec:
    """A gemma-embedding file: gemma3_spec's layout (llama_model_gemma_embedding::load_arch_tensors creates the
    same tensors, Q8_0 here as the published Q8_0 files have them), no dense projection modules."""
    spec = gemma3_spec(n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim,
                       n_ff=n_ff, n_vocab=n_vocab, window=window)
    spec.arch = "gemma-embedding"
    spec.metadata.update({Keys.LLM.CONTEXT_LENGTH: n_ctx, Keys.Rope.FREQ_BASE: 1000000.0})
    return tokenized(spec, n_vocab)


def embeddinggemma_300m() -> ModelSpec:
    """google/embeddinggemma-300m: 24 layers (5 sliding : 1 full), 768 wide, 3 heads / 1 KV of 256, n_ff 1152,
    window 512, 262144 vocab, 2048 context (the Q8_0 GGUF ggml-org publishes)."""
    return gemma_embedding_spec(n_layer=24, n_embd=768, n_head=3, n_head_kv=1, head_dim=256, n_ff=1152,
                                n_vocab=262144, window=512, n_ctx=2048)


# --- gemma (Gemma 1, src/models/gemma.cpp) -------------------------------------------------------------------
def gemma_spec(*, n_layer: int, n_embd: int, n_head: int, n_head_kv: int, head_dim: int, n_ff: int, n_vocab: int,
               n_ctx: int = 8192, ty: Gemma4Types = Gemma4Types()) -> ModelSpec:
    """A gemma file as llama_model_gemma::load_arch_tensors creates it: llama's layer (no post norms, no Q/K
    norms) with head_dim heads, the output tied to token_embd (always: the loader creates it duplicated)."""
    spec = ModelSpec("gemma")
    _common(spec, n_layer, n_embd, n_vocab, n_ctx=n_ctx)
    spec.metadata.update({
        Keys.Attention.HEAD_COUNT: n_head, Keys.Attention.HEAD_COUNT_KV: n_head_kv, Keys.LLM.FEED_FORWARD_LENGTH: n_ff,
        Keys.Attention.KEY_LENGTH: head_dim, Keys.Attention.VALUE_LENGTH: head_dim,
    })
    spec.add(T.TOKEN_EMBD, ty.embd, (n_embd, n_vocab))
    spec.add(T.OUTPUT_NORM, Q.F32, (n_embd,))
    for il in range(n_layer):
        spec.add(T.ATTN_NORM, Q.F32, (n_embd,), il)
        spec.add(T.ATTN_Q, ty.mat, (n_embd, head_dim * n_head), il)
        spec.add(T.ATTN_K, ty.mat, (n_embd, head_dim * n_head_kv), il)
        spec.add(T.ATTN_V, ty.v, (n_embd, head_dim * n_head_kv), il)
        spec.add(T.ATTN_OUT, ty.mat, (head_dim * n_head, n_embd), il)
        spec.add(T.FFN_NORM, Q.F32, (n_embd,), il)
        spec.add(T.FFN_GATE, ty.mat, (n_embd, n_ff), il)
        spec.add(T.FFN_UP, ty.mat, (n_embd, n_ff), il)
        spec.add(T.FFN_DOWN, ty.down, (n_ff, n_embd), il)
    return tokenized(spec, n_vocab)


def gemma_7b() -> ModelSpec:
    """google/gemma-7b: 28 layers, 3072 wide, 16 heads / 16 KV of 256, n_ff 24576, 256000 vocab, 8k context."""
    return gemma_spec(n_layer=28, n_embd=3072, n_head=16, n_head_kv=16, head_dim=256, n_ff=24576, n_vocab=256000)
