"""Devices, buffer types, buffers and the graph IR's byte sizes, against hand arithmetic."""
from __future__ import annotations

import pytest
from gguf import GGML_QUANT_SIZES

from runtime.ggml import build as B
from runtime.ggml.backend import Registry, alloc_tensors, make_cpu, make_virtual, op_batch_size
from runtime.ggml.graph import BufferUsage, GGMLType, Graph, Op, Tensor
from runtime.ggml.sched_errors import BufferAllocationError

F32, F16, Q4_K, I32 = GGMLType.F32, GGMLType.F16, GGMLType.Q4_K, GGMLType.I32


def test_allocating_past_capacity_names_the_device_and_the_shortfall():
    gpu = make_virtual("GPU3", 1000)
    first = gpu.buffer_type.alloc_buffer(600)
    with pytest.raises(BufferAllocationError, match=r"GPU3: .* short by 100 B \(100 bytes\)") as err:
        gpu.buffer_type.alloc_buffer(500)
    assert err.value.shortfall_bytes == 100 and err.value.device == "GPU3"
    assert gpu.device.memory().free == 400
    first.free()
    assert gpu.device.memory().free == 1000


def test_buffer_types_belong_to_their_device():
    cpu, g0, g1 = make_cpu(capacity=1 << 20), make_virtual("GPU0", 1 << 20), make_virtual("GPU1", 1 << 20)
    assert (cpu.buffer_type.alignment, cpu.buffer_type.is_host) == (32, True)
    assert (g0.buffer_type.alignment, g0.buffer_type.is_host, g0.buffer_type.name) == (128, False, "GPU0")
    assert g0.device.supports_buft(g0.buffer_type) and not g0.device.supports_buft(g1.buffer_type)
    assert not g0.device.supports_buft(cpu.buffer_type)
    assert cpu.device.supports_buft(cpu.buffer_type) and not cpu.device.supports_buft(g0.buffer_type)


def test_alloc_tensors_aligns_offsets_and_splits_at_max_size():
    cpu = make_cpu(capacity=1 << 20)
    ts = [Tensor(F32, [10], name=f"t{i}") for i in range(3)]  # 40 bytes each, aligned to 64
    (buf,) = alloc_tensors(cpu.buffer_type, ts, BufferUsage.WEIGHTS)
    assert [t.offset for t in ts] == [0, 64, 128] and buf.size == 192 and buf.usage is BufferUsage.WEIGHTS
    gpu = make_virtual("GPU0", 1 << 20, alignment=32, max_alloc=128)
    us = [Tensor(F32, [10], name=f"u{i}") for i in range(3)]
    bufs = alloc_tensors(gpu.buffer_type, us)
    assert [b.size for b in bufs] == [128, 64] and [u.offset for u in us] == [0, 64, 0]


def test_op_batch_size_and_the_offload_threshold():
    w, x = Tensor(F32, [64, 64]), Tensor(F32, [64, 31])
    mm31, mm32 = B.mul_mat(w, x), B.mul_mat(w, Tensor(F32, [64, 32]))
    assert op_batch_size(mm31) == 31 and op_batch_size(mm32) == 32  # MUL_MAT: ne[1]
    rows = B.get_rows(w, Tensor(I32, [100]))
    assert op_batch_size(rows) == 0  # GET_ROWS never wants offloading
    assert op_batch_size(B.scale(Tensor(F32, [4, 5, 6]), 1.0)) == 30  # default: rows
    gpu, cpu = make_virtual("GPU0", 1 << 20), make_cpu(capacity=1 << 20)
    assert not gpu.device.offload_op(mm31) and gpu.device.offload_op(mm32)  # default 32
    assert not cpu.device.offload_op(mm32)


def test_declared_op_support():
    gpu = make_virtual("GPU0", 1 << 20, ops=[Op.MUL_MAT], supports=lambda t: t.type != Q4_K)
    w = Tensor(F32, [8, 8])
    assert gpu.supports_op(B.mul_mat(w, w)) and not gpu.supports_op(B.scale(w, 2.0))
    assert gpu.supports_op(B.reshape(w, [64]))  # view ops are metadata: always accepted
    assert not gpu.supports_op(Tensor(Q4_K, [256], op=Op.MUL_MAT))


def test_registry_enumerates_devices():
    reg = Registry("Virtual")
    make_virtual("GPU0", 1 << 20, registry=reg)
    make_virtual("GPU1", 1 << 20, registry=reg)
    assert [d.name for d in reg.devices] == ["GPU0", "GPU1"]
    with pytest.raises(ValueError, match="already registered"):
        make_virtual("GPU0", 1 << 20, registry=reg)


def test_byte_sizes_of_float_and_quantized_types():
    assert Tensor(F32, [4096, 32]).nbytes() == 4096 * 32 * 4
    assert Tensor(F16, [4096, 32]).nbytes() == 4096 * 32 * 2
    assert GGML_QUANT_SIZES[Q4_K] == (256, 144)
    assert Tensor(Q4_K, [512, 3]).nbytes() == 2 * 144 * 3  # 2 blocks of 256 per row
    t = B.transpose(Tensor(F32, [4, 3], name="m"))
    assert (t.ne[:2], t.nb[:2], t.nbytes()) == ((3, 4), (16, 4), 48)  # strided span, same bytes


def test_graph_order_and_view_chains():
    w = Tensor(F32, [4, 4], name="w")
    x = B.new_input(F32, [4, 2], "x")
    a = B.mul_mat(w, x, "a")
    v = B.view(B.view(a, [4], offset=8, name="v1"), [2], offset=4, name="v2")
    graph = Graph.build(B.add(B.cont(v, name="c"), B.cont(v, name="c2"), "s"))
    assert [t.name for t in graph.leafs] == ["w", "x"]
    assert [t.name for t in graph.nodes] == ["a", "v1", "v2", "c", "c2", "s"]
    assert v.view_src is a and v.view_offs == 12  # ggml collapses view chains onto the root
