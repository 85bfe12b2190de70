"""The ops of Gated DeltaNet layers (qwen3next): constructors with ggml's shape rules (ggml.c, pinned
build). The runtime sizes these graphs and does not run them (recurrent models are reserve-only), so
only REPEAT gets a kernel; GATED_DELTA_NET's refuses.

- REPEAT (ggml_repeat_4d): a tiled to ne, each of ne a multiple of a's; a new tensor, never in place.
- GATED_DELTA_NET (ggml_gated_delta_net): q, k [S_k, H, T, n_s], v [S_v, H, T, n_s], gate g
  [1 or S_v, H, T, n_s], beta [1, H, T, n_s], state [S_v, S_v, H, n_s] -> one f32
  [S_v * H, T * n_s + K * S_v * n_s] holding the attention output and then K state snapshots.
"""
from __future__ import annotations

import numpy as np

from runtime.ggml.graph import GGMLType, Op, Tensor
from runtime.ggml.kernels import KERNELS

F32 = GGMLType.F32


def repeat_4d(a: Tensor, ne: tuple[int, int, int, int], name: str = "") -> Tensor:
    if any(n % m for n, m in zip(ne, a.ne, strict=True)):
        raise ValueError(f"repeat_4d: {a.ne} does not tile {ne}")
    return Tensor(a.type, ne, name=name, op=Op.REPEAT, src=[a])


def gated_delta_net(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, n_snap: int = 1,
                    name: str = "") -> Tensor:
    s_v, heads, n_tokens, n_seqs = v.ne
    if not (all(t.type == F32 for t in (q, k, v, g, beta, state)) and g.is_contiguous() and beta.is_contiguous()
            and state.is_contiguous() and g.ne[0] in (1, s_v) and beta.ne[0] == 1 and n_snap >= 1
            and state.ne == (s_v, s_v, heads, n_seqs)):
        raise ValueError(f"gated_delta_net: q {q.ne} k {k.ne} v {v.ne} g {g.ne} beta {beta.ne} state {state.ne}")
    ne = (s_v * heads, n_tokens * n_seqs + n_snap * s_v * n_seqs, 1, 1)
    return Tensor(F32, ne, name=name, op=Op.GATED_DELTA_NET, src=[q, k, v, g, beta, state],
                  op_params={"K": n_snap})


def repeat_kernel(node: Tensor) -> None:
    a = node.source(0).numpy()
    node.numpy()[...] = np.tile(a, tuple(n // m for n, m in zip(node.numpy().shape, a.shape, strict=True)))


def gated_delta_net_kernel(node: Tensor) -> None:
    raise NotImplementedError("GATED_DELTA_NET: the runtime sizes qwen3next graphs but does not run them")


# A device runs the ops that have kernels (runtime/ggml/backend.py Device.ops); these join the table
# where the ops are defined, as runtime/ggml/ssm.py's do.
KERNELS.setdefault(Op.REPEAT, repeat_kernel)
KERNELS.setdefault(Op.GATED_DELTA_NET, gated_delta_net_kernel)
