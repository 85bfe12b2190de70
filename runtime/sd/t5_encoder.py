"""The T5 encoder (T5-XXL v1.1, FLUX.1's and SD3's second text encoder) as stable-diffusion.cpp builds it.

Sources (stable-diffusion.cpp 97d2990, src/model/te/t5.hpp): T5Runner::build_graph (token ids and the
relative-position buckets [n_token, n_token] i32 are inputs; no attention mask for FLUX.1), T5::forward
(the `shared` Embedding's GET_ROWS, the stack, the final T5LayerNorm), T5Block (self-attention, then the
gated-GELU feed-forward, each added in place to its input), T5LayerNorm (RMS_NORM, then a MUL by the weight,
a new tensor), T5Attention (q/k/v without bias, K scaled by sqrt(d_head) in place, the first block's
relative_attention_bias rows permuted to [n_token, n_token, n_head] and reused by every block as the
attention mask; ggml_ext_attention_ext without flash attention), T5DenseGatedActDense (GELU of wi_0 in
place, multiplied in place by wi_1, wo a Linear scaled by 1/32 around its matmul). T5-XXL: 24 blocks,
width 4096, 64 heads, feed-forward 10240, 32 buckets; FLUX.1's prompts are 256-token chunks. UMT5 (T5Config
with is_umt5: relative_attention false) gives every block its own bias; Wan's conditioner (T5CLIPEmbedder
with use_mask) passes a [n_token] mask, repeated to each bias and added.
"""
from __future__ import annotations

from dataclasses import dataclass

from runtime.ggml import build as g
from runtime.ggml import image_ops as im
from runtime.ggml.graph import GGMLType, Tensor
from runtime.sd.sd_blocks import Blocks, ext_scale

RMS_EPS = 1e-6                 # T5LayerNorm
WO_SCALE = 1.0 / 32.0          # T5DenseGatedActDense: wo's Linear scale
N_BUCKETS = 32                 # relative_attention_num_buckets


def chunked_tokens(prompt_tokens: int, chunk_len: int) -> int:
    """The T5 context a conditioner that cuts the prompt into `chunk_len`-token chunks hands on (FLUX.1's
    FluxCLIPEmbedder: 256): the prompt and its EOS padded to one chunk while they fit, else chunks of
    chunk_len - 1 prompt tokens, each with its EOS and padded to chunk_len (src/tokenizers/tokenizer.cpp
    Tokenizer::pad_tokens: T5 adds an EOS, no BOS). Each chunk is encoded alone by the same graph."""
    return max(1, -(-prompt_tokens // (chunk_len - 1))) * chunk_len


@dataclass(frozen=True)
class T5Config:
    num_layers: int = 24
    model_dim: int = 4096
    inner_dim: int = 4096
    ff_dim: int = 10240
    num_heads: int = 64
    vocab_size: int = 32128
    relative_attention: bool = True   # only block 0 owns a relative-position bias (T5); false: every block (UMT5)


T5_XXL = T5Config()
# UMT5-XXL (Wan's text encoder): T5-XXL's shape, a 256384-token vocabulary, a bias in every block
UMT5_XXL = T5Config(vocab_size=256384, relative_attention=False)


def _embedding(b: Blocks, weight: Tensor, ids: Tensor) -> Tensor:
    """Embedding::forward: ids [n_token, N] flattened to [n_token*N, 1, 1], GET_ROWS, reshaped [dim, n_token, N]."""
    n = ids.ne[1]
    flat = im.reshape(ids, (ids.ne[0] * ids.ne[1],))
    rows = g.get_rows(weight, im.reshape(flat, (flat.ne[0], 1, flat.ne[1])))
    return im.reshape(rows, (rows.ne[0], rows.ne[1] // n, n))


def _layer_norm(b: Blocks, x: Tensor) -> Tensor:
    return g.mul(g.rms_norm(x, RMS_EPS), b.param((x.ne[0],)))


def _linear(b: Blocks, x: Tensor, n_out: int, scale: float = 1.0) -> Tensor:
    """Linear without bias; a `scale` other than 1 wraps the matmul in two SCALE nodes (ggml_ext_linear)."""
    if scale != 1.0:
        x = ext_scale(x, scale)
    y = b.linear(x, n_out, bias=False)
    return ext_scale(y, 1.0 / scale) if scale != 1.0 else y


def _attention(b: Blocks, x: Tensor, cfg: T5Config, bias: Tensor | None, buckets: Tensor,
               mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    q = _linear(b, x, cfg.inner_dim)
    k = _linear(b, x, cfg.inner_dim)
    v = _linear(b, x, cfg.inner_dim)
    if bias is None or not cfg.relative_attention:   # T5: block 0's bias, kept for the others; UMT5: each block's
        rows = _embedding(b, b.param((cfg.num_heads, N_BUCKETS), GGMLType.F16), buckets)
        bias = g.cont(g.permute(rows, (2, 0, 1, 3)))
    attn_mask = bias if mask is None else g.add(im.repeat(mask, bias.ne), bias)
    d_head = cfg.inner_dim // cfg.num_heads
    k = im.scale_inplace(k, float(d_head) ** 0.5)
    out = b.attention(q, k, v, cfg.num_heads, attn_mask, flash_attn=False)
    return _linear(b, out, cfg.model_dim), bias


def t5_encoder(b: Blocks, input_ids: Tensor, buckets: Tensor, cfg: T5Config = T5_XXL,
               mask: Tensor | None = None) -> Tensor:
    """`mask`: the chunk's [n_token] attention mask (Wan's UMT5), repeated to the bias and added in each block."""
    x = _embedding(b, b.param((cfg.model_dim, cfg.vocab_size), GGMLType.F16), input_ids)
    bias: Tensor | None = None
    for _ in range(cfg.num_layers):
        out, bias = _attention(b, _layer_norm(b, x), cfg, bias, buckets, mask)
        x = im.add_inplace(out, x)
        h = _layer_norm(b, x)
        gelu = im.unary_inplace(im.cont_if_needed(_linear(b, h, cfg.ff_dim)), "GELU")
        h = im.mul_inplace(gelu, _linear(b, h, cfg.ff_dim))
        x = im.add_inplace(_linear(b, h, cfg.model_dim, WO_SCALE), x)
    return _layer_norm(b, x)
