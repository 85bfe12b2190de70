"""CLIP text encoders (CLIPTextModel: OpenAI ViT-L/14, OpenCLIP ViT-H/14 and ViT-bigG/14) as
stable-diffusion.cpp builds them for one 77-token chunk.

Sources (stable-diffusion.cpp 97d2990): src/model/te/clip.hpp CLIPTextModelRunner::build_graph (the token
ids and a causal mask [n_token, n_token] f32 are inputs set from the host), CLIPEmbeddings (token rows by
GET_ROWS, plus the position embedding), CLIPEncoder (layers up to n_layer - clip_skip), CLIPLayer
(pre-norm attention and MLP with residual adds), CLIPMLP (quick GELU for ViT-L, GELU for the OpenCLIP
widths 1024 and 1280, in place), the final LayerNorm where the model keeps it; src/core/ggml_extend.hpp
MultiheadAttention (separate q/k/v projections with bias; it calls ggml_ext_attention_ext without flash
attention, so --fa leaves the text encoders' graphs unchanged). src/conditioning/conditioner.hpp
FrozenCLIPEmbedderWithCustomWords: SD 1.x runs ViT-L with the final norm and clip_skip 1 (every layer), SD 2.x
OpenCLIP-H with the final norm after its 23rd layer (clip_skip 2).
"""
from __future__ import annotations

from dataclasses import dataclass

from runtime.ggml import build as g
from runtime.ggml import image_ops as im
from runtime.ggml.graph import GGMLType, Tensor
from runtime.sd.sd_blocks import Blocks

N_TOKEN = 77    # CLIPTextModel::n_token (max_position_embeddings): one chunk of the prompt
CHUNK_PROMPT_TOKENS = N_TOKEN - 2   # a chunk's prompt tokens beside its BOS and EOS


def context_tokens(prompt_tokens: int) -> int:
    """The text context a CLIP conditioner hands the diffusion model for a prompt of `prompt_tokens` BPE
    tokens: padded to one 77-token chunk while BOS + prompt + EOS fit in it, else split into chunks of 75
    prompt tokens, each with its BOS and EOS and padded to 77 (src/tokenizers/tokenizer.cpp
    Tokenizer::pad_tokens, called with min_length = max_length = n_token and overflow allowed by
    FrozenCLIPEmbedderWithCustomWords::get_learned_condition). Each chunk is encoded alone, by the same
    77-token graph, and the hidden states are concatenated along the tokens (conditioner.hpp
    get_learned_condition_common)."""
    return max(1, -(-prompt_tokens // CHUNK_PROMPT_TOKENS)) * N_TOKEN


@dataclass(frozen=True)
class ClipTextConfig:
    hidden_size: int
    intermediate_size: int
    n_head: int
    n_layer: int
    with_final_ln: bool = True
    proj_in: bool = False      # one fused in_proj (OpenCLIP's attn.in_proj_weight) split by split_qkv
    text_projection: bool = False   # bigG's pooled output goes through text_projection; ViT-L's is the row

    @property
    def use_gelu(self) -> bool:
        """CLIPMLP: plain GELU for the OpenCLIP widths, quick GELU for OpenAI's ViT-L."""
        return self.hidden_size in (1024, 1280)


CLIP_L = ClipTextConfig(768, 3072, 12, 12)         # OPENAI_CLIP_VIT_L_14, SD 1.x's encoder
# SD 2.x's OpenCLIP ViT-H/14 (OPEN_CLIP_VIT_H_14, with the final norm): the released checkpoint's fused
# attn.in_proj_weight, no text_projection (sd.cpp creates one for bigG only); read at clip_skip 2 (SD2_CLIP_SKIP)
SD2_CLIP_H = ClipTextConfig(1024, 4096, 16, 24, proj_in=True)
# conditioner.hpp get_learned_condition_common: without --clip-skip, SD 2.x and SDXL take the penultimate layer
SD2_CLIP_SKIP = 2
# SDXL's pair (FrozenCLIPEmbedderWithCustomWords): CLIP-L and OpenCLIP bigG, both without the final norm
SDXL_CLIP_L = ClipTextConfig(768, 3072, 12, 12, with_final_ln=False)
SDXL_CLIP_G = ClipTextConfig(1280, 5120, 20, 32, with_final_ln=False, proj_in=True, text_projection=True)
# SD3's pair (SD3CLIPEmbedder, with_final_ln false): the released clip_g.safetensors has Hugging Face names,
# separate q / k / v projections (CLIPTextModelRunner looks for self_attn.in_proj to fuse them)
SD3_CLIP_L = SDXL_CLIP_L
SD3_CLIP_G = ClipTextConfig(1280, 5120, 20, 32, with_final_ln=False, text_projection=True)


def split_qkv(qkv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """ggml_extend.hpp split_qkv: [3C, L, N] -> reshape [C, 3, L, N], permuted cont [C, L, N, 3], three views."""
    c = qkv.ne[0] // 3
    t = g.cont(g.permute(im.reshape(qkv, (c, 3, qkv.ne[1], qkv.ne[2])), (0, 3, 1, 2)))
    offset = t.nb[2] * t.ne[2]
    ne = (t.ne[0], t.ne[1], t.ne[2], 1)
    nb = (t.nb[0], t.nb[1], t.nb[2], t.nb[2] * t.ne[2])
    q, k, v = (g.view(t, ne, nb, offset * i) for i in range(3))
    return q, k, v


def clip_layer(b: Blocks, x: Tensor, cfg: ClipTextConfig, mask: Tensor | None) -> Tensor:
    h = b.layer_norm(x)
    if cfg.proj_in:
        q, k, v = split_qkv(b.linear(h, 3 * cfg.hidden_size))
    else:
        q, k, v = (b.linear(h, cfg.hidden_size) for _ in range(3))
    x = g.add(x, b.linear(b.attention(q, k, v, cfg.n_head, mask, flash_attn=False), cfg.hidden_size))
    h = b.linear(b.layer_norm(x), cfg.intermediate_size)
    h = im.unary_inplace(im.cont_if_needed(h), "GELU" if cfg.use_gelu else "GELU_QUICK")
    return g.add(x, b.linear(h, cfg.hidden_size))


def text_model(b: Blocks, input_ids: Tensor, mask: Tensor, cfg: ClipTextConfig = CLIP_L, clip_skip: int = 1,
               pooled: bool = False) -> Tensor:
    """CLIPTextModel::forward for input_ids [n_token] (one chunk): the hidden states, or with `pooled` the
    final-normed state of one token through text_projection (every layer then, whatever clip_skip)."""
    n_token = input_ids.ne[0]
    tokens = b.param((cfg.hidden_size, 49408), GGMLType.F16)
    positions = b.param((cfg.hidden_size, n_token))
    x = g.get_rows(tokens, im.reshape(input_ids, (n_token, 1, input_ids.ne[1])))
    x = g.add(im.reshape(x, (x.ne[0], x.ne[1], x.ne[3])), positions)
    last = cfg.n_layer - clip_skip if clip_skip > 0 and not pooled else cfg.n_layer - 1
    for _ in range(last + 1):
        x = clip_layer(b, x, cfg, mask)
    if pooled or cfg.with_final_ln:
        x = b.layer_norm(x)
    if pooled:
        # ggml_view_1d at the end token's row (its offset does not change any size), text_projection without bias
        row = g.view(x, (cfg.hidden_size,), offset=0)
        return g.mul_mat(b.param((cfg.hidden_size, cfg.hidden_size)), row) if cfg.text_projection else row
    return x
