"""Graph allocator and the scheduler's reallocation rules. Offsets and sizes are worked out
by hand from ggml-alloc's walk: allocate the node, then free parents with no children left;
best fit among free blocks, else the chunk's open tail."""
from __future__ import annotations

import pytest

from planner.core.units import MiB
from runtime.ggml import build as B
from runtime.ggml.alloc import GraphAllocator, PlannedGraph
from runtime.ggml.backend import make_accel, make_virtual
from runtime.ggml.graph import GGMLType, Graph, TensorFlag
from runtime.ggml.sched import Scheduler
from runtime.ggml.sched_errors import BufferAllocationError, SchedulerError

F32 = GGMLType.F32
N = 16  # 16 f32 = 64 bytes, a multiple of the CPU's 32-byte alignment


def _planned(graph: Graph) -> PlannedGraph:
    return PlannedGraph(graph.nodes, [0] * len(graph.nodes), graph.leafs, [0] * len(graph.leafs))


def _chain(output_c: bool = False):
    x = B.new_input(F32, [N], "x")
    a = B.cont(x, name="a")
    b = B.cont(a, name="b")
    c = B.cont(b, name="c")
    if output_c:
        c.flags |= TensorFlag.OUTPUT
    d = B.scale(c, 2.0, "d")
    return Graph.build(d), (x, a, b, c, d)


def test_freed_bytes_are_reused_and_inplace_ops_take_their_parent(cpu):
    graph, (x, a, b, c, d) = _chain()
    galloc = GraphAllocator([cpu.buffer_type])
    sizes = galloc.plan(_planned(graph))
    # x: 0 (leaf). a: tail -> 64, x freed -> free block [0,64). b: best fit [0,64) -> 0, a freed
    # -> tail back to 64. c: tail -> 64, b freed. d (SCALE, c's only child, same layout): in
    # place at 64. Five 64-byte tensors in 128 bytes.
    assert [galloc.address(t) for t in (x, a, b, c, d)] == [(0, 0, 0), (0, 0, 64), (0, 0, 0), (0, 0, 64),
                                                          (0, 0, 64)]
    assert sizes == [128]


def test_an_output_parent_is_not_overwritten_in_place(cpu):
    graph, (_, _, _, c, d) = _chain(output_c=True)
    galloc = GraphAllocator([cpu.buffer_type])
    galloc.plan(_planned(graph))
    # c is an output: d cannot take it; after c, b was freed at [0,64) -> d best-fits there
    assert galloc.address(c) == (0, 0, 64) and galloc.address(d) == (0, 0, 0)


def test_chunks_open_at_the_buffer_type_max_size(cpu):
    dev = make_virtual("GPU0", 1 * MiB, alignment=32, max_alloc=128)
    x, y = B.new_input(F32, [N], "x"), B.new_input(F32, [N], "y")
    a = B.cont(x, name="a")
    graph = Graph.build(B.add(a, y, "b"))
    galloc = GraphAllocator([dev.buffer_type])
    sizes = galloc.reserve(_planned(graph))
    # x and y fill chunk 0 (128 bytes = max size); a opens chunk 1; b adds in place over a
    assert [galloc.address(t) for t in (x, y, a, graph.nodes[1])] == [(0, 0, 0), (0, 0, 64), (0, 1, 0),
                                                                      (0, 1, 0)]
    assert sizes == [192]
    assert [buf.size for buf in galloc.buffers[0]] == [128, 64]
    assert dev.device.used == 192


def test_reserve_sizes_touch_no_device_memory_but_reserve_does(gpu, cpu, weight):
    w = weight(gpu, [N, N], "w")  # 1024 bytes of weights already on GPU0
    x = B.new_input(F32, [N, 4], "x")
    graph = Graph.build(B.mul_mat(w, x, "h"))
    s = Scheduler([gpu, cpu])
    # GPU0: copy of x (256 B) + h (256 B), both live together; CPU: x (256 B)
    assert s.reserve_sizes(graph) == {"GPU0": 512, "CPU": 256}
    assert (gpu.device.used, cpu.device.used) == (1024, 0)
    assert s.reserve(graph) == {"GPU0": 512, "CPU": 256}
    assert (gpu.device.used, cpu.device.used) == (1024 + 512, 256)
    assert s.buffer_size(gpu) == 512


def test_a_compute_buffer_past_capacity_names_the_device_and_shortfall(cpu, weight):
    small = make_virtual("GPU0", 1024 + 300)
    w = weight(small, [N, N], "w")  # 1024 bytes of weights fit, 300 bytes stay free
    graph = Graph.build(B.mul_mat(w, B.new_input(F32, [N, 4], "x"), "h"))
    with pytest.raises(BufferAllocationError, match="GPU0.*short by 212 B") as err:
        Scheduler([small, cpu]).reserve(graph)  # needs 512: 512 - 300 = 212 short
    assert err.value.exit_code == 1
    assert err.value.shortfalls[0].missing_bytes == 212
    assert small.device.used == 1024


def _scale_graph(n_tok: int):
    x = B.new_input(F32, [N, n_tok], "x")
    h = B.scale(x, 2.0, "h")
    return Graph.build(B.cont(h, name="out")), h


def test_realloc_only_when_a_node_moves_to_another_buffer_type(gpu, cpu):
    accel = make_accel("BLAS", cpu)
    s = Scheduler([gpu, accel, cpu], debug_realloc=1)
    graph, h = _scale_graph(4)
    s.reserve(graph)
    s.alloc(graph)
    assert s.n_reallocs == 0
    # h: GPU0 cannot read x where it is, BLAS can -> 3.best on BLAS. Pinning it to the CPU
    # changes its backend but not its buffer type: no reallocation
    assert s.get_tensor_backend(h).name == "BLAS"
    s.set_tensor_backend(h, cpu)
    s.alloc(graph)
    assert s.n_reallocs == 0
    # onto GPU0: another buffer type -> reserve again (an expected change: no tripwire)
    s.set_tensor_backend(h, gpu)
    s.alloc(graph)
    assert s.n_reallocs == 1


def test_unexpected_reallocation_tripwire(gpu, cpu):
    s = Scheduler([gpu, cpu], debug_realloc=1)
    small, _ = _scale_graph(4)
    s.reserve(small)
    s.alloc(small)
    big, _ = _scale_graph(8)  # same nodes, same backends, bigger tensors: the plan is stale
    with pytest.raises(SchedulerError, match="unexpected graph reallocation"):
        s.alloc(big)


def test_without_the_tripwire_a_stale_plan_is_reserved_again(gpu, cpu):
    s = Scheduler([gpu, cpu], debug_realloc=0)
    small, _ = _scale_graph(4)
    assert s.reserve(small)["CPU"] == 2 * N * 4 * 4  # x and out live together (h is in place on x)
    big, _ = _scale_graph(8)
    s.alloc(big)
    assert s.n_reallocs == 1
    assert s.buffer_size(cpu) == 2 * N * 8 * 4
