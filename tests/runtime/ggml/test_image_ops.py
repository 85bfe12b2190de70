"""runtime/ggml/image_ops.py: ggml's shape rules for image ops, and what the graph allocator makes of them."""
from __future__ import annotations

from runtime.ggml import build as g
from runtime.ggml import image_ops as im
from runtime.ggml.backend import UNLIMITED, make_cpu
from runtime.ggml.graph import GGMLType, Op, Tensor
from runtime.sd.sd_reserve import reserve_graph

F16, F32 = GGMLType.F16, GGMLType.F32


def weight(ne: tuple[int, ...], ggml_type: GGMLType = F16) -> Tensor:
    t = Tensor(ggml_type, ne)
    t.buffer = object()   # pre-allocated: the compute buffer never holds it
    return t


def test_conv_2d_is_im2col_matmul_and_a_permuted_copy():
    x = Tensor(F32, (8, 8, 4, 1))
    y = im.conv_2d(weight((3, 3, 4, 16)), x, 1, 1, 1, 1)
    ops = [t.op for t in _chain(y)]
    assert ops == [Op.IM2COL, Op.RESHAPE, Op.MUL_MAT, Op.RESHAPE, Op.PERMUTE, Op.CONT]
    assert _chain(y)[2].source(1).op is Op.RESHAPE   # the kernel flattened to [KW*KH*IC, OC]
    col = _chain(y)[0]
    assert (col.type, col.ne) == (F16, (36, 8, 8, 1))      # IC*KH*KW columns per output pixel, f16
    assert y.ne == (8, 8, 16, 1)
    assert im.conv_2d(weight((3, 3, 4, 16)), x, 2, 2, 0, 0).ne == (3, 3, 16, 1)   # (8 - 3) // 2 + 1


def _chain(t: Tensor) -> list[Tensor]:
    """The nodes from the IM2COL to t along src[0] (the data path)."""
    out = [t]
    while out[-1].op is not Op.IM2COL:
        out.append(out[-1].source(0))
    return out[::-1]


def test_a_conv_reserves_its_input_columns_and_product_at_once():
    """Input 8*8*4 f32 = 1024 B; columns 36*64 f16 = 4608 B; product 64*16 f32 = 4096 B. The input dies
    after IM2COL, the columns after the MUL_MAT, so the copy reuses their 5632 B: the peak is all three."""
    x = Tensor(F32, (8, 8, 4, 1))
    y = im.conv_2d(weight((3, 3, 4, 16)), x, 1, 1, 1, 1)
    assert reserve_graph(make_cpu(UNLIMITED).buffer_type, [y]) == 1024 + 4608 + 4096


def test_inplace_ops_are_views_and_take_no_bytes():
    x = Tensor(F32, (8, 8, 4, 1))
    y = im.unary_inplace(im.group_norm(x, 2, 1e-6), "SILU")
    assert y.view_src is not None and y.op is Op.UNARY
    # x (1024 B) and the norm (1024 B); the SiLU writes over the norm
    assert reserve_graph(make_cpu(UNLIMITED).buffer_type, [y]) == 2048


def test_contiguity_skips_unit_dimensions():
    q = Tensor(F32, (64, 1, 77, 1))
    moved = g.permute(q, (0, 2, 1, 3))          # swaps a unit axis: still packed
    assert not moved.is_contiguous() and im.is_contiguous(moved)
    assert im.reshape(moved, (64, 77)).ne == (64, 77, 1, 1)
    assert not im.is_contiguous(g.transpose(Tensor(F32, (4, 3, 1, 1))))


def test_upscale_pad_concat_shapes():
    a = Tensor(F32, (5, 7, 3, 1))
    assert im.upscale(a, 2).ne == (10, 14, 3, 1)
    assert im.pad_ext(a, [(1, 0), (0, 1)]).ne == (6, 8, 3, 1)
    assert im.concat(a, Tensor(F32, (5, 7, 4, 1)), 2).ne == (5, 7, 7, 1)
    assert im.timestep_embedding(Tensor(F32, (1, 1, 1, 1)), 320).ne == (320, 1, 1, 1)
