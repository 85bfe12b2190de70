"""Ops of the LayerNorm / fused-projection decoders (phi3, command-r, cohere2, stablelm, starcoder2,
olmo, qwen3vl): constructors with ggml's shape rules (ggml.c) and numpy kernels with ggml-cpu's
arithmetic (ggml-cpu/ops.cpp), pinned build (DESIGN.md).

- NORM (ggml_norm): each row minus its mean, divided by sqrt(variance + eps); never in place
  (ggml_op_can_inplace leaves it out, ggml-alloc.c).
- GLU of one source (ggml_swiglu): the first half of each row activated times the second half, a
  row of half the width (phi3's fused up/gate projection).
- CLAMP (ggml_clamp): values kept in [min, max]; in place where ggml-alloc allows.
- PAD (ggml_pad): zeros appended to each dimension.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from runtime.ggml.graph import GGMLType, Op, Tensor
from runtime.ggml.kernels import KERNELS, _write, read_f32

F32 = GGMLType.F32


def norm(a: Tensor, eps: float, name: str = "") -> Tensor:
    return Tensor(a.type, a.ne, name=name, op=Op.NORM, src=[a], op_params={"eps": float(eps)})


def clamp(a: Tensor, lo: float, hi: float, name: str = "") -> Tensor:
    return Tensor(a.type, a.ne, name=name, op=Op.CLAMP, src=[a], op_params={"min": float(lo), "max": float(hi)})


def pad(a: Tensor, p: Sequence[int], name: str = "") -> Tensor:
    """ggml_pad: `p[i]` zeros after dimension i (f32 only, as ggml asserts)."""
    if a.type != F32:
        raise ValueError("pad: f32 only")
    pads = tuple(p) + (0,) * (4 - len(p))
    return Tensor(F32, tuple(n + q for n, q in zip(a.ne, pads, strict=True)), name=name, op=Op.PAD, src=[a])


def _norm_kernel(node: Tensor) -> None:
    x = read_f32(node.source(0)).astype(np.float64)
    x = x - x.mean(axis=-1, keepdims=True)
    var = (x * x).mean(axis=-1, keepdims=True)
    _write(node, (x / np.sqrt(var + node.op_params["eps"])).astype(np.float32))


def _pad_kernel(node: Tensor) -> None:
    x = read_f32(node.source(0))
    out = np.zeros(tuple(reversed(node.ne)), dtype=np.float32)
    out[tuple(slice(0, n) for n in reversed(node.source(0).ne))] = x.reshape(tuple(reversed(node.source(0).ne)))
    _write(node, out)


# A device runs the ops that have kernels (runtime/ggml/backend.py Device.ops); these join the table
# where the ops are defined, as runtime/ggml/ssm.py's do.
KERNELS.setdefault(Op.NORM, _norm_kernel)
KERNELS.setdefault(Op.PAD, _pad_kernel)
