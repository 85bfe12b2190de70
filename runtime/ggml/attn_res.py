"""The hyper-connection ops of the pinned ggml (ggml.c) and deepseek4's de-rotation: constructors with ggml's
shape rules. kimi-k3's attention residuals use DSV4_HC_PRE; glm5-next's and deepseek4's hyper-connections
(src/models/glm5-next.cpp, deepseek4.cpp, with cparams.fused_dsv4_hc_* on, llama.cpp's default) use all three.
The runtime sizes these graphs and does not run them, so their kernels refuse.

- DSV4_HC_PRE (ggml_dsv4_hc_pre, ungated): x [n_embd, n, n_tokens] f32 and weights [n, n_tokens] f32 ->
  one f32 [n_embd, n_tokens], each token's n rows of x summed with its n weights.
- DSV4_HC_COMB (ggml_dsv4_hc_comb): mixes [(2 + hc) hc, n_tokens], scale [>= 3], base [(2 + hc) hc] (f32)
  -> the Sinkhorn-normalised stream mixing [hc, hc, n_tokens] f32; ggml asserts hc == 4.
- DSV4_HC_POST (ggml_dsv4_hc_post): x [n_embd, n_tokens], residual [n_embd, hc, n_tokens], post [hc, n_tokens],
  comb [hc, hc, n_tokens] or none (f32) -> the new streams [n_embd, hc, n_tokens] f32.
- ROPE_BACK (ggml_rope_ext_back): ggml_rope_ext's node with the inverse rotation, same shape and sources.
"""
from __future__ import annotations

from runtime.ggml.graph import GGMLType, Op, Tensor
from runtime.ggml.kernels import KERNELS

F32 = GGMLType.F32
HC_COMB_STREAMS = 4   # ggml_dsv4_hc_comb asserts hc == 4


def hc_pre(x: Tensor, weights: Tensor, name: str = "") -> Tensor:
    n_embd, n, n_tokens, rest = x.ne
    if not (x.type == F32 and weights.type == F32 and rest == 1 and n > 0
            and weights.ne == (n, n_tokens, 1, 1)):
        raise ValueError(f"dsv4_hc_pre: x {x.ne} weights {weights.ne}")
    return Tensor(F32, (n_embd, n_tokens, 1, 1), name=name, op=Op.DSV4_HC_PRE, src=[x, weights],
                  op_params={"scale": 1.0, "gated": 0})


def hc_comb(mixes: Tensor, scale: Tensor, base: Tensor, eps: float, n_iter: int, name: str = "") -> Tensor:
    hc = HC_COMB_STREAMS
    mix, n_tokens = mixes.ne[0], mixes.ne[1]
    if not (all(t.type == F32 for t in (mixes, scale, base)) and mix == (2 + hc) * hc and mixes.ne[2:] == (1, 1)
            and scale.ne[0] >= 3 and scale.ne[1:] == (1, 1, 1) and base.ne == (mix, 1, 1, 1) and n_iter > 0):
        raise ValueError(f"dsv4_hc_comb: mixes {mixes.ne} scale {scale.ne} base {base.ne} n_iter {n_iter}")
    return Tensor(F32, (hc, hc, n_tokens, 1), name=name, op=Op.DSV4_HC_COMB, src=[mixes, scale, base],
                  op_params={"eps": float(eps), "n_iter": int(n_iter)})


def hc_post(x: Tensor, residual: Tensor, post: Tensor, comb: Tensor | None, name: str = "") -> Tensor:
    n_embd, n_tokens = x.ne[0], x.ne[1]
    hc = residual.ne[1]
    ok = (all(t.type == F32 for t in (x, residual, post)) and hc > 0 and x.ne[2:] == (1, 1)
          and residual.ne == (n_embd, hc, n_tokens, 1) and post.ne == (hc, n_tokens, 1, 1)
          and (comb is None or (comb.type == F32 and comb.ne == (hc, hc, n_tokens, 1))))
    if not ok:
        raise ValueError(f"dsv4_hc_post: x {x.ne} residual {residual.ne} post {post.ne}")
    return Tensor(F32, (n_embd, hc, n_tokens, 1), name=name, op=Op.DSV4_HC_POST, src=[x, residual, post, comb])


def rope_back(a: Tensor, pos: Tensor, n_dims: int, mode: int, freq_base: float, name: str = "") -> Tensor:
    """ggml_rope_ext_back: a [head_dim, n_head, n_tokens], pos [n_tokens] I32."""
    if not (pos.type == GGMLType.I32 and pos.ne[0] == a.ne[2]):
        raise ValueError(f"rope_back: pos {pos.ne} vs {a.ne}")
    return Tensor(a.type, a.ne, name=name, op=Op.ROPE_BACK, src=[a, pos, None],
                  op_params={"n_dims": n_dims, "mode": mode, "freq_base": float(freq_base)})


def _sized_only(node: Tensor) -> None:
    raise NotImplementedError(f"{node.op.value}: the runtime sizes kimi-k3, glm5-next and deepseek4 graphs but "
                              f"does not run them")


for _op in (Op.DSV4_HC_PRE, Op.DSV4_HC_COMB, Op.DSV4_HC_POST, Op.ROPE_BACK):
    KERNELS.setdefault(_op, _sized_only)
