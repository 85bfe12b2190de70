"""The state-space ops of Mamba-style layers: constructors with ggml's shape rules (ggml.c) and
numpy kernels with ggml-cpu's arithmetic (ggml-cpu/ops.cpp), pinned build (DESIGN.md).

- CONCAT (ggml_concat): a and b joined along one dim; every other dim equal.
- SSM_CONV (ggml_ssm_conv): sx [d_conv - 1 + n_t, d_inner, n_s] and c [d_conv, d_inner] ->
  [d_inner, n_t, n_s], each output the dot product of a d_conv window of sx with c's row.
- SSM_SCAN (ggml_ssm_scan): the selective scan; one flat f32 result holding y (x's shape) and then
  the last state of every sequence (K snapshots each, K = 1 here).
- scale_inplace (ggml_scale_inplace): a SCALE node that is a view of its source (it writes the
  source's bytes), as llama.cpp clears a recurrent state slot with it.
The kernels read f32 sources through numpy views; quantized sources never reach these ops.
"""
from __future__ import annotations

import numpy as np

from planner.core.errors import ModelShapeError
from runtime.ggml.graph import GGMLType, Op, Tensor
from runtime.ggml.kernels import KERNELS

F32, I32 = GGMLType.F32, GGMLType.I32
SOFTPLUS_MAX = 20.0   # ggml-cpu ssm_scan: dt above this is used as is (softplus(dt) ~ dt)


def concat(a: Tensor, b: Tensor, dim: int, name: str = "") -> Tensor:
    if a.type != b.type or any(a.ne[d] != b.ne[d] for d in range(4) if d != dim):
        raise ValueError(f"concat: {a.ne} and {b.ne} along dim {dim}")
    ne = tuple(a.ne[d] + b.ne[d] if d == dim else a.ne[d] for d in range(4))
    return Tensor(a.type, ne, name=name, op=Op.CONCAT, src=[a, b], op_params={"dim": dim})


def ssm_conv(sx: Tensor, c: Tensor, name: str = "") -> Tensor:
    d_conv, d_inner = c.ne[0], c.ne[1]
    n_t = sx.ne[0] - d_conv + 1
    if sx.ne[1] != d_inner or n_t < 0 or sx.ne[3] != 1 or c.ne[2] != 1 or c.ne[3] != 1:
        raise ModelShapeError(f"the model's tensors do not match its metadata: ssm_conv of {tuple(sx.ne)} with "
                              f"the conv kernel {tuple(c.ne)}")
    return Tensor(F32, (d_inner, n_t, sx.ne[2], 1), name=name, op=Op.SSM_CONV, src=[sx, c])


def ssm_scan(s: Tensor, x: Tensor, dt: Tensor, a: Tensor, b: Tensor, c: Tensor, ids: Tensor, k: int = 1,
             name: str = "") -> Tensor:
    """s [d_state, head_dim, n_head, slots], x [head_dim, n_head, n_t, n_s], dt [n_head, n_t, n_s],
    A [1 or d_state, n_head], B and C [d_state, n_group, n_t, n_s], ids [n_s] I32."""
    head_dim, n_head, n_t, n_s = x.ne
    if not (k >= 1 and s.is_contiguous() and dt.is_contiguous() and ids.type == I32 and ids.ne[0] == n_s
            and dt.ne[:3] == (n_head, n_t, n_s) and s.ne[1] == head_dim and s.ne[2] == n_head
            and b.ne == c.ne and b.ne[0] == s.ne[0] and b.ne[2:] == (n_t, n_s) and a.ne[1] == n_head):
        raise ValueError(f"ssm_scan: s {s.ne} x {x.ne} dt {dt.ne} A {a.ne} B {b.ne} C {c.ne} ids {ids.ne}")
    n = x.n_elements + k * s.ne[0] * s.ne[1] * s.ne[2] * n_s
    return Tensor(F32, (n, 1, 1, 1), name=name, op=Op.SSM_SCAN, src=[s, x, dt, a, b, c, ids],
                  op_params={"K": k})


def scale_inplace(a: Tensor, s: float, name: str = "") -> Tensor:
    return Tensor(a.type, a.ne, name=name or f"{a.name} (view)", op=Op.SCALE, src=[a], view_src=a, nb=a.nb,
                  op_params={"scale": float(s)})


# --- kernels (ggml-cpu/ops.cpp) --------------------------------------------------------------

def concat_kernel(node: Tensor) -> None:
    dim = node.op_params["dim"]
    a, b = node.source(0).numpy(), node.source(1).numpy()
    node.numpy()[...] = np.concatenate([a, b], axis=3 - dim)


def ssm_conv_kernel(node: Tensor) -> None:
    sx, c = node.source(0).numpy()[0], node.source(1).numpy()[0, 0]   # (n_s, d_inner, L), (d_inner, d_conv)
    d_conv, n_t = c.shape[1], node.ne[1]
    windows = np.stack([sx[:, :, i:i + n_t] for i in range(d_conv)], axis=-1)   # (n_s, d_inner, n_t, d_conv)
    out = (windows * c[None, :, None, :]).sum(-1, dtype=np.float32)
    node.numpy()[0] = out.transpose(0, 2, 1)


def ssm_scan_kernel(node: Tensor) -> None:
    """Mamba-2 (A of one value per head) and Mamba-1 (A per state element) scans, K = 1."""
    s_t, x_t, dt_t, a_t, b_t, c_t, ids_t = (node.source(i) for i in range(7))
    if node.op_params["K"] != 1:
        raise ValueError("ssm_scan: the runtime executes K = 1 only")
    head_dim, n_head, n_t, n_s = x_t.ne
    d_state, n_group = b_t.ne[0], b_t.ne[1]
    states = s_t.numpy()                       # (slots, n_head, head_dim, d_state)
    x, dt, a = x_t.numpy(), dt_t.numpy()[0], a_t.numpy()[0, 0]   # (n_s, n_t, n_head, head_dim), (n_s, n_t, n_head)
    b, c = b_t.numpy(), c_t.numpy()            # (n_s, n_t, n_group, d_state)
    group = np.arange(n_head) // (n_head // n_group)
    flat = node.numpy().reshape(-1)
    y = flat[:x_t.n_elements].reshape(n_s, n_t, n_head, head_dim)
    last = flat[x_t.n_elements:].reshape(n_s, n_head, head_dim, d_state)
    for seq, slot in enumerate(ids_t.numpy().reshape(-1)[:n_s]):
        state = states[slot].astype(np.float32, copy=True)
        for t in range(n_t):
            d = dt[seq, t]
            d = np.where(d <= SOFTPLUS_MAX, np.log1p(np.exp(np.minimum(d, SOFTPLUS_MAX))), d).astype(np.float32)
            decay = np.exp(d[:, None] * a)                                # (n_head, 1 or d_state)
            xdt = x[seq, t] * d[:, None]                                  # (n_head, head_dim)
            state = state * decay[:, None, :] + xdt[:, :, None] * b[seq, t][group][:, None, :]
            y[seq, t] = (state * c[seq, t][group][:, None, :]).sum(-1, dtype=np.float32)
        last[seq] = state


# A device runs the ops that have kernels (runtime/ggml/backend.py Device.ops); these join the table
# where the ops are defined, as runtime/engine/deepseek2.py's CONCAT does (either kernel serves both).
KERNELS.setdefault(Op.CONCAT, concat_kernel)
KERNELS.setdefault(Op.SSM_CONV, ssm_conv_kernel)
KERNELS.setdefault(Op.SSM_SCAN, ssm_scan_kernel)
