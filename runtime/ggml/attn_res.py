"""The op kimi-k3's attention residuals add (ggml.c, pinned build): a constructor with ggml's shape rules.
The runtime sizes these graphs and does not run them (recurrent models are reserve-only), so its kernel
refuses.

- DSV4_HC_PRE (ggml_dsv4_hc_pre, ungated): x [n_embd, n, n_tokens] f32 and weights [n, n_tokens] f32 ->
  one f32 [n_embd, n_tokens], each token's n rows of x summed with its n weights.
"""
from __future__ import annotations

from runtime.ggml.graph import GGMLType, Op, Tensor
from runtime.ggml.kernels import KERNELS

F32 = GGMLType.F32


def hc_pre(x: Tensor, weights: Tensor, name: str = "") -> Tensor:
    n_embd, n, n_tokens, rest = x.ne
    if not (x.type == F32 and weights.type == F32 and rest == 1 and n > 0
            and weights.ne == (n, n_tokens, 1, 1)):
        raise ValueError(f"dsv4_hc_pre: x {x.ne} weights {weights.ne}")
    return Tensor(F32, (n_embd, n_tokens, 1, 1), name=name, op=Op.DSV4_HC_PRE, src=[x, weights],
                  op_params={"scale": 1.0, "gated": 0})


def hc_pre_kernel(node: Tensor) -> None:
    raise NotImplementedError("DSV4_HC_PRE: the runtime sizes kimi-k3 graphs but does not run them")


KERNELS.setdefault(Op.DSV4_HC_PRE, hc_pre_kernel)
