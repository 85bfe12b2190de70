"""Shape-faithful sparse models: published models' dimensions as GGUF headers llama.cpp loads.

Each entry of `SHAPES` holds the dimensions of the published model its builder's docstring names,
laid out with planner/synth/gguf_factory.py's builders (llama.cpp's real tensor names and shapes,
as load_arch_tensors creates them), with a tokenizer block llama.cpp accepts (`tokenized`). The
tensor data is a sparse hole, so llama-fit-params (which never reads weights) loads them in a
second and they cost a few MiB of disk. `write_shape` writes one once into a directory; the
estimate peer tests, the benchmarks and the notebooks plan on them.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from gguf import Keys

from planner.synth.gguf_factory import (
    ModelSpec,
    Q,
    add_tokenizer,
    deepseek2_lite_layout,
    deepseek2_spec,
    gemma2_spec,
    gemma3_spec,
    gptoss_spec,
    granitehybrid_spec,
    lfm2_spec,
    llama_spec,
    qwen3moe_spec,
    qwen_spec,
    write_once,
)
from planner.synth.qwen3next_factory import qwen3next_spec


def tokenized(spec: ModelSpec, n_vocab: int, n_ctx: int) -> ModelSpec:
    """`spec` with a stand-in BPE tokenizer of `n_vocab` tokens, a training context and a RoPE base."""
    add_tokenizer(spec, n_vocab, n_merges=1)
    spec.metadata[Keys.Tokenizer.PRE] = "default"
    spec.metadata[Keys.LLM.CONTEXT_LENGTH] = n_ctx
    spec.metadata[Keys.Rope.FREQ_BASE] = 500000.0
    return spec


def llama_8b() -> ModelSpec:
    """Llama 3 8B class (Q4_K_M-like types): 32 layers, 4096 wide, GQA 32/8, n_ff 14336, 128k vocab."""
    spec = llama_spec(n_layer=32, n_embd=4096, n_head=32, n_head_kv=8, n_ff=14336, n_vocab=128256,
                      attn_type=Q.Q4_K, v_type=Q.Q6_K, ffn_type=Q.Q4_K, down_type=Q.Q6_K, embd_type=Q.Q4_K,
                      out_type=Q.Q6_K)
    return tokenized(spec, 128256, 8192)


def llama_70b() -> ModelSpec:
    """Llama 3 70B class (Q4_K_M-like types): 80 layers, 8192 wide, GQA 64/8, n_ff 28672, and a real-size
    128k tokenizer with 280k merges, so remote reads meet a header of a real size: about 40 GiB of logical
    size, a few MiB on disk. Not in SHAPES (the peer matrix does not load it)."""
    spec = llama_spec(n_layer=80, n_embd=8192, n_head=64, n_head_kv=8, n_ff=28672, n_vocab=128256,
                      attn_type=Q.Q4_K, v_type=Q.Q6_K, ffn_type=Q.Q4_K, down_type=Q.Q6_K, embd_type=Q.Q4_K,
                      out_type=Q.Q6_K)
    add_tokenizer(spec, 128256, n_merges=280147)
    return spec


def mistral_7b() -> ModelSpec:
    """Mistral-7B-v0.3 class (a `llama` file): 32 layers, 4096 wide, GQA 32/8, n_ff 14336, 32768 vocab."""
    spec = llama_spec(n_layer=32, n_embd=4096, n_head=32, n_head_kv=8, n_ff=14336, n_vocab=32768,
                      attn_type=Q.Q4_K, v_type=Q.Q6_K, ffn_type=Q.Q4_K, down_type=Q.Q6_K, embd_type=Q.Q4_K,
                      out_type=Q.Q6_K)
    return tokenized(spec, 32768, 32768)


def qwen2_7b() -> ModelSpec:
    """Qwen2.5-7B class: 28 layers, 3584 wide, GQA 28/4 (head 128), n_ff 18944, Q/K/V biases, 152k vocab."""
    spec = qwen_spec("qwen2", n_layer=28, n_embd=3584, n_head=28, n_head_kv=4, n_ff=18944, n_vocab=152064,
                     qkv_bias=True)
    return tokenized(spec, 152064, 32768)


def qwen3_8b() -> ModelSpec:
    """Qwen3-8B class: 36 layers, 4096 wide, GQA 32/8 (head 128), n_ff 12288, Q/K norms, 151k vocab."""
    spec = qwen_spec("qwen3", n_layer=36, n_embd=4096, n_head=32, n_head_kv=8, n_ff=12288, n_vocab=151936,
                     qk_norm=True)
    return tokenized(spec, 151936, 40960)


def gemma2_9b() -> ModelSpec:
    """Gemma 2 9B class: 42 layers, 3584 wide, 16 heads / 8 KV of 256, n_ff 14336, window 4096, 256k vocab."""
    spec = gemma2_spec(n_layer=42, n_embd=3584, n_head=16, n_head_kv=8, head_dim=256, n_ff=14336, n_vocab=256000,
                       window=4096)
    return tokenized(spec, 256000, 8192)


def gptoss_20b() -> ModelSpec:
    """gpt-oss-20b class: 24 layers, 2880 wide, 64 heads / 8 KV of 64, 32 experts (4 used) of 2880, window
    128, MXFP4 experts, 201k vocab, YaRN x32 over 4096 positions (as the published file declares it)."""
    spec = gptoss_spec(n_layer=24, n_embd=2880, n_head=64, n_head_kv=8, head_dim=64, n_expert=32,
                       n_expert_used=4, n_ff_exp=2880, n_vocab=201088, window=128)
    spec = tokenized(spec, 201088, 131072)
    spec.metadata.update({Keys.Rope.FREQ_BASE: 150000.0, Keys.Rope.SCALING_TYPE: "yarn",
                          Keys.Rope.SCALING_FACTOR: 32.0, Keys.Rope.SCALING_ORIG_CTX_LEN: 4096})
    return spec


def qwen3moe_30b() -> ModelSpec:
    """Qwen3-30B-A3B class: 48 layers, 2048 wide, 128 experts (8 used) of width 768, 151k vocab."""
    spec = qwen3moe_spec(n_layer=48, n_embd=2048, n_head=32, n_head_kv=4, head_dim=128, n_expert=128,
                         n_expert_used=8, n_ff_exp=768, n_vocab=151936)
    return tokenized(spec, 151936, 40960)


def deepseek2_mla() -> ModelSpec:
    """DeepSeek-V2-Lite with MLA: 27 layers (1 dense), 2048 wide, kv_lora 512, 64 experts of 1408.

    V2-Lite has no query LoRA (src/models/deepseek2.cpp: a 27-layer model is "lite" and reads a
    plain attn_q), so the factory's q_a/q_b tensors are swapped for attn_q.
    """
    n_embd, n_head, qk = 2048, 16, 128 + 64
    spec = deepseek2_spec(n_layer=27, n_dense_lead=1, n_embd=n_embd, n_head=n_head, q_lora_rank=1536,
                          kv_lora_rank=512, qk_nope=128, qk_rope=64, v_head_dim=128, n_ff=10944, n_expert=64,
                          n_expert_used=6, n_expert_shared=2, n_ff_exp=1408, n_vocab=102400)
    return tokenized(deepseek2_lite_layout(spec, n_embd, n_head, qk), 102400, 163840)


def granite_hybrid() -> ModelSpec:
    """Granite-4.0-H class hybrid: Mamba-2 layers with one attention layer in every ten, 1536 wide."""
    kv = tuple(4 if i % 10 == 5 else 0 for i in range(40))
    spec = granitehybrid_spec(n_embd=1536, n_head=12, head_count_kv=kv, n_ff=4096, d_conv=4, d_state=128,
                              n_group=1, n_ssm_head=48, n_vocab=100352)
    return tokenized(spec, 100352, 131072)


def lfm2_1p2b() -> ModelSpec:
    """LFM2-1.2B class: 16 layers, 2048 wide, attention (32 heads / 8 KV of 64) at layers 2, 5, 8, 10, 12
    and 14, short convolutions (L_cache 3) elsewhere, n_ff 8192, 65536 vocab, tied embeddings."""
    kv = tuple(8 if i in (2, 5, 8, 10, 12, 14) else 0 for i in range(16))
    spec = lfm2_spec(n_embd=2048, n_head=32, head_count_kv=kv, n_ff=8192, l_cache=3, n_vocab=65536,
                     attn_type=Q.Q4_K, v_type=Q.Q6_K, ffn_type=Q.Q4_K, down_type=Q.Q6_K, embd_type=Q.Q6_K)
    spec = tokenized(spec, 65536, 128000)
    spec.metadata[Keys.Rope.FREQ_BASE] = 1000000.0
    return spec


def qwen3next_80b() -> ModelSpec:
    """Qwen3-Next-80B-A3B class: 48 layers, 2048 wide, Gated DeltaNet (16 key / 32 value heads of 128,
    conv 4) with gated attention (16 heads / 2 KV of 256, a quarter roped) every 4th layer, 512 experts
    (10 used) of 512 plus a shared expert of 512, 151936 vocab."""
    spec = qwen3next_spec(n_layer=48, n_embd=2048, n_head=16, n_head_kv=2, head_dim=256, n_expert=512,
                          n_expert_used=10, n_ff_exp=512, n_ff_shexp=512, d_conv=4, d_state=128, n_k_heads=16,
                          n_v_heads=32, n_vocab=151936, mat_type=Q.Q4_K, exp_type=Q.Q4_K, embd_type=Q.Q4_K,
                          out_type=Q.Q6_K)
    spec = tokenized(spec, 151936, 262144)
    spec.metadata[Keys.Rope.FREQ_BASE] = 10000000.0
    return spec


def gemma3_270m_layout() -> ModelSpec:
    """Gemma 3 270M laid out as the published Q4_K_M file is (gemma-3-270m-q4_k_m.gguf), for a GPU
    machine, where the 241 MiB example cannot travel: 18 layers, 640 wide, 4 heads / 1 KV of 256,
    n_ff 2048, 262144 vocab, token_embd Q8_0 (tied output). Rows of 640 are not a multiple of 256, so
    llama-quantize's Q4_K_M falls back to Q5_0 for attn_q/k/v and ffn_gate/up; attn_output and
    ffn_down (rows of 1024 and 2048) are Q4_K; llama-quantize's use_more_bits layers (0, 1, 4, 7, 10,
    13, 15, 16, 17 of 18) take attn_v Q8_0 and ffn_down Q6_K. Same tensors, types and shapes as the
    published file (checked against it); the tokenizer is a stand-in of the same length."""
    n_layer, n_embd, n_head, head_dim, n_ff, n_vocab = 18, 640, 4, 256, 2048, 262144
    spec = gemma3_spec(n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=1, head_dim=head_dim, n_ff=n_ff,
                       n_vocab=n_vocab, window=512)
    more_bits = {i for i in range(n_layer) if i < n_layer // 8 or i >= 7 * n_layer // 8
                 or (i - n_layer // 8) % 3 == 2}
    types = {"attn_q": Q.Q5_0, "attn_k": Q.Q5_0, "ffn_gate": Q.Q5_0, "ffn_up": Q.Q5_0, "attn_output": Q.Q4_K}
    tensors = []
    for name, qtype, shape in spec.tensors:
        m = re.match(r"blk\.(\d+)\.(\w+)\.weight$", name)
        if m and qtype != Q.F32:
            il, kind = int(m.group(1)), m.group(2)
            qtype = types.get(kind, qtype)
            if kind == "attn_v":
                qtype = Q.Q8_0 if il in more_bits else Q.Q5_0
            elif kind == "ffn_down":
                qtype = Q.Q6_K if il in more_bits else Q.Q4_K
        tensors.append((name, qtype, shape))
    spec.tensors = tensors
    spec = tokenized(spec, n_vocab, 32768)
    spec.metadata[Keys.Rope.FREQ_BASE] = 1000000.0
    return spec


SHAPES: dict[str, Callable[[], ModelSpec]] = {
    "llama-8b": llama_8b,
    "qwen3moe-30b-a3b": qwen3moe_30b,
    "deepseek2-mla": deepseek2_mla,
    "granite-hybrid": granite_hybrid,
    "mistral-7b": mistral_7b,
    "qwen2-7b": qwen2_7b,
    "qwen3-8b": qwen3_8b,
    "gemma2-9b": gemma2_9b,
    "gpt-oss-20b": gptoss_20b,
    "lfm2-1.2b": lfm2_1p2b,
    "qwen3next-80b-a3b": qwen3next_80b,
}


def write_shape(name: str, directory: Path) -> Path:
    """Write one shape's sparse GGUF into `directory` (once) and return its path."""
    return write_once(directory, name, SHAPES[name])


