"""step35 (Step-3.5): the shared decoder with three things of its own (src/models/step35.cpp, pinned build).

- Heads per block: the full-attention and the sliding-window blocks have head counts of their own
  (attention.head_count as an array), Q/K norms per head where the file has them, before RoPE.
- RoPE per block: load_arch_hparams halves rope.dimension_count for the full-attention blocks (n_rot_full / 2);
  the sliding-window blocks rotate rope.dimension_count_swa dims (the unhalved count when absent) and take no
  rope factors.
- A sigmoid gate per head (attn_gate, {n_embd, n_head}) on the attention's output before attn_output:
  sigmoid(attn_gate . x) reshaped to [1, n_head, n_tokens] and multiplied in.

The FFN is build_ffn / build_moe_ffn with the file's SwiGLU clamps (swiglu_clamp_exp for the experts,
swiglu_clamp_shexp for every build_ffn of a block, its dense FFN included): up clamped to +-limit, silu(gate)
clamped from above by limit, their product (llama-graph.cpp, the path of architectures other than deepseek4).
The trunk's last hidden state is a graph output (res->t_h_nextn) and the output rows are picked after it.
"""
from __future__ import annotations

from gguf import MODEL_TENSOR as T

from planner.model.tensors import rope_freqs_name, tensor_name
from runtime.engine.builder import DecoderBuilder, Qkv
from runtime.engine.hparams import HParams
from runtime.engine.moe import CLAMP_EPS, clamped_swiglu
from runtime.ggml import build as B
from runtime.ggml.graph import Tensor

STEP35 = "step35"
def swiglu_limit(limits: tuple[float, ...], il: int) -> float:
    limit = limits[il] if il < len(limits) else 0.0
    return limit if limit > CLAMP_EPS else 0.0


class Step35Builder(DecoderBuilder):
    """DecoderBuilder with step35's per-block heads and RoPE, the head-wise gate and the clamped SwiGLUs."""

    def __init__(self, hp: HParams, *args, **kwargs) -> None:
        super().__init__(hp, *args, **kwargs)
        self._attn_in: Tensor | None = None

    def _n_rot(self, il: int) -> int:
        return self.hp.n_rot_swa if self.hp.swa[il] else self.hp.n_rot // 2

    def _rope_l(self, x: Tensor, il: int) -> Tensor:
        hp = self.hp
        swa = hp.swa[il]
        factors = None if swa else self._w(rope_freqs_name(il))
        r = B.rope(x, self.out.pos, self._n_rot(il), int(hp.spec.rope), hp.freq_base_swa if swa else hp.freq_base,
                   factors, name=f"rope-{il}")
        r.op_params["freq_scale"] = hp.freq_scale_swa if swa else hp.freq_scale
        if hp.ext_factor:
            r.op_params.update(ext_factor=hp.ext_factor, n_ctx_orig=hp.n_ctx_orig)
        return r

    def _qkv(self, x: Tensor, il: int, n_tokens: int) -> Qkv:
        """build_qkv without reshape, then reshape, Q and K norms where the file has them, RoPE on Q and K."""
        hp = self.hp
        self._attn_in = x
        flat = [self.lora.mm(self._need(tensor_name(t, il)), x, name=f"{p}cur-{il}")
                for p, t in (("Q", T.ATTN_Q), ("K", T.ATTN_K), ("V", T.ATTN_V))]
        q = B.reshape(flat[0], (hp.head_dim, hp.n_heads[il], n_tokens))
        k = B.reshape(flat[1], (hp.head_dim, hp.n_head_kv[il], n_tokens))
        v = B.reshape(flat[2], (hp.hd_v, hp.n_head_kv[il], n_tokens))
        if self._w(tensor_name(T.ATTN_Q_NORM, il)) is not None:
            q = self.norm(q, tensor_name(T.ATTN_Q_NORM, il), il)
        if self._w(tensor_name(T.ATTN_K_NORM, il)) is not None:
            k = self.norm(k, tensor_name(T.ATTN_K_NORM, il), il)
        return Qkv(self._rope_l(q, il), self._rope_l(k, il), v)

    def attention(self, il: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        cur = super().attention(il, q, k, v)
        gate_w = self._w(tensor_name(T.ATTN_GATE, il))
        if gate_w is None or self._attn_in is None:
            return cur
        heads, n_tokens = q.ne[1], cur.ne[1]
        gate = B.unary(self.lora.mm(gate_w, self._attn_in, name=f"attn_gate-{il}"), "SIGMOID",
                       name=f"attn_gate_sigmoid-{il}")
        gated = B.mul(B.reshape(cur, (cur.ne[0] // heads, heads, n_tokens)), B.reshape(gate, (1, heads, n_tokens)),
                      name=f"attn_gated_3d-{il}")
        return B.reshape(gated, (cur.ne[0], n_tokens))

    def dense_ffn(self, x: Tensor, il: int, up_w: T = T.FFN_UP, gate_w: T = T.FFN_GATE, down_w: T = T.FFN_DOWN,
                  name: str = "ffn") -> Tensor:
        limit = swiglu_limit(self.hp.swiglu_clamp_shexp, il)
        if not limit:
            return super().dense_ffn(x, il, up_w, gate_w, down_w, name)
        up = self.lora.mm(self._need(tensor_name(up_w, il)), x, name=f"{name}_up-{il}")
        gate = self.lora.mm(self._need(tensor_name(gate_w, il)), x, name=f"{name}_gate-{il}")
        act = clamped_swiglu(gate, up, limit, il, name)
        return self.lora.mm(self._need(tensor_name(down_w, il)), act, name=f"{name}_out-{il}")
