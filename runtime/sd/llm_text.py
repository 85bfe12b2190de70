"""An LLM text encoder (Qwen3, Z-Image's) as stable-diffusion.cpp builds it for one prompt.

Sources (stable-diffusion.cpp 97d2990, src/model/te/llm.hpp): LLMRunner::build_graph (token ids an input; the
positions [n_tokens] i32 and, without a mask from the caller, a causal mask [n_tokens, n_tokens] f32 made in
the compute context), TextModel::forward_embeds (the embedding's GET_ROWS, the blocks up to the requested
output layer — Z-Image asks for layer 35 of 36, the hidden states after block 34, so the last block and the
final norm are not in the graph), TransformerBlock (LLMRMSNorm: RMS_NORM then a MUL by the weight, a new
tensor; attention added in place to the residual, the gated SiLU MLP likewise), Attention (q, k, v Linears
without bias viewed per head, RMSNorm'd q and k, NEOX RoPE, q and k permuted and copied,
ggml_ext_attention_ext with skip_reshape and flash attention off whatever the switch), MLP (silu of
gate_proj in place, multiplied in place by up_proj, down_proj).
"""
from __future__ import annotations

from dataclasses import dataclass

from runtime.ggml import build as g
from runtime.ggml import image_ops as im
from runtime.ggml.graph import GGMLType, Tensor
from runtime.sd.sd_blocks import Blocks

ROPE_NEOX = 2


@dataclass(frozen=True)
class LlmConfig:
    num_layers: int = 36
    hidden_size: int = 2560
    intermediate_size: int = 9728
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 151936
    rms_norm_eps: float = 1e-6


QWEN3_4B = LlmConfig()


def _rms(b: Blocks, x: Tensor, eps: float) -> Tensor:
    return g.mul(g.rms_norm(x, eps), b.param((x.ne[0],)))


def _attention(b: Blocks, x: Tensor, pos: Tensor, mask: Tensor, cfg: LlmConfig) -> Tensor:
    n_token, n = x.ne[1], x.ne[2]
    d = cfg.head_dim
    q = im.reshape(b.linear(x, cfg.num_heads * d, bias=False), (d, cfg.num_heads, n_token, n))
    k = im.reshape(b.linear(x, cfg.num_kv_heads * d, bias=False), (d, cfg.num_kv_heads, n_token, n))
    v = im.reshape(b.linear(x, cfg.num_kv_heads * d, bias=False), (d, cfg.num_kv_heads, n_token, n))
    q = g.rope(_rms(b, q, cfg.rms_norm_eps), pos, d, ROPE_NEOX, 1_000_000.0)
    k = g.rope(_rms(b, k, cfg.rms_norm_eps), pos, d, ROPE_NEOX, 1_000_000.0)
    q = g.cont(g.permute(q, (0, 2, 1, 3)))
    q = im.reshape(q, (q.ne[0], q.ne[1], q.ne[2] * q.ne[3]))
    k = g.cont(g.permute(k, (0, 2, 1, 3)))
    k = im.reshape(k, (k.ne[0], k.ne[1], k.ne[2] * k.ne[3]))
    out = b.attention_heads(q, k, v, cfg.num_heads, mask, flash_attn=False)
    return b.linear(out, cfg.hidden_size, bias=False)


def _block(b: Blocks, x: Tensor, pos: Tensor, mask: Tensor, cfg: LlmConfig) -> Tensor:
    h = _attention(b, _rms(b, x, cfg.rms_norm_eps), pos, mask, cfg)
    x = im.add_inplace(h, x)
    h = _rms(b, x, cfg.rms_norm_eps)
    gate = im.unary_inplace(b.linear(h, cfg.intermediate_size, bias=False), "SILU")
    h = b.linear(im.mul_inplace(gate, b.linear(h, cfg.intermediate_size, bias=False)), cfg.hidden_size, bias=False)
    return im.add_inplace(h, x)


def text_model(b: Blocks, input_ids: Tensor, pos: Tensor, mask: Tensor, out_layer: int,
               cfg: LlmConfig = QWEN3_4B) -> Tensor:
    """The hidden states after block out_layer - 1 (out_layer <= num_layers) for input_ids [n_tokens, 1]."""
    weight = b.param((cfg.hidden_size, cfg.vocab_size), GGMLType.F16)
    n = input_ids.ne[1]
    flat = im.reshape(input_ids, (input_ids.ne[0] * n,))
    rows = g.get_rows(weight, im.reshape(flat, (flat.ne[0], 1, flat.ne[1])))
    x = im.reshape(rows, (rows.ne[0], rows.ne[1] // n, n))
    for _ in range(out_layer):
        x = _block(b, x, pos, mask, cfg)
    return x
