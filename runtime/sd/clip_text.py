"""CLIP text encoders (CLIPTextModel: OpenAI ViT-L/14, OpenCLIP ViT-H/14 and ViT-bigG/14) as
stable-diffusion.cpp builds them for one 77-token chunk.

Sources (stable-diffusion.cpp 97d2990): src/model/te/clip.hpp CLIPTextModelRunner::build_graph (the token
ids and a causal mask [n_token, n_token] f32 are inputs set from the host), CLIPEmbeddings (token rows by
GET_ROWS, plus the position embedding), CLIPEncoder (layers up to n_layer - clip_skip), CLIPLayer
(pre-norm attention and MLP with residual adds), CLIPMLP (quick GELU for ViT-L, GELU for the OpenCLIP
widths 1024 and 1280, in place), the final LayerNorm where the model keeps it; src/core/ggml_extend.hpp
MultiheadAttention (separate q/k/v projections with bias; it calls ggml_ext_attention_ext without flash
attention, so --fa leaves the text encoders' graphs unchanged). src/conditioning/conditioner.hpp
FrozenCLIPEmbedderWithCustomWords: SD 1.x runs ViT-L with the final norm and clip_skip 1 (every layer).
"""
from __future__ import annotations

from dataclasses import dataclass

from runtime.ggml import build as g
from runtime.ggml import image_ops as im
from runtime.ggml.graph import GGMLType, Tensor
from runtime.sd.sd_blocks import Blocks

N_TOKEN = 77    # CLIPTextModel::n_token (max_position_embeddings): one chunk of the prompt


@dataclass(frozen=True)
class ClipTextConfig:
    hidden_size: int
    intermediate_size: int
    n_head: int
    n_layer: int
    with_final_ln: bool = True

    @property
    def use_gelu(self) -> bool:
        """CLIPMLP: plain GELU for the OpenCLIP widths, quick GELU for OpenAI's ViT-L."""
        return self.hidden_size in (1024, 1280)


CLIP_L = ClipTextConfig(768, 3072, 12, 12)         # OPENAI_CLIP_VIT_L_14, SD 1.x's encoder


def clip_layer(b: Blocks, x: Tensor, cfg: ClipTextConfig, mask: Tensor | None) -> Tensor:
    h = b.layer_norm(x)
    q, k, v = (b.linear(h, cfg.hidden_size) for _ in range(3))
    x = g.add(x, b.linear(b.attention(q, k, v, cfg.n_head, mask, flash_attn=False), cfg.hidden_size))
    h = b.linear(b.layer_norm(x), cfg.intermediate_size)
    h = im.unary_inplace(im.cont_if_needed(h), "GELU" if cfg.use_gelu else "GELU_QUICK")
    return g.add(x, b.linear(h, cfg.hidden_size))


def text_model(b: Blocks, input_ids: Tensor, mask: Tensor, cfg: ClipTextConfig = CLIP_L, clip_skip: int = 1) -> Tensor:
    """CLIPTextModel::forward for input_ids [n_token] (one chunk), returning the hidden states (no pooling)."""
    n_token = input_ids.ne[0]
    tokens = b.param((cfg.hidden_size, 49408), GGMLType.F16)
    positions = b.param((cfg.hidden_size, n_token))
    x = g.get_rows(tokens, im.reshape(input_ids, (n_token, 1, input_ids.ne[1])))
    x = g.add(im.reshape(x, (x.ne[0], x.ne[1], x.ne[3])), positions)
    last = cfg.n_layer - clip_skip if clip_skip > 0 else cfg.n_layer - 1
    for _ in range(last + 1):
        x = clip_layer(b, x, cfg, mask)
    return b.layer_norm(x) if cfg.with_final_ln else x
