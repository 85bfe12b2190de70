"""Pass 5/6 on hand-built graphs: input copies and rewiring, the cut rules, pipeline copies,
and the debug text. Expected lists are written out by hand from seed 000's rules."""
from __future__ import annotations

from runtime.ggml import build as B
from runtime.ggml.backend import make_accel
from runtime.ggml.graph import GGMLType, Graph, Op, TensorFlag
from runtime.ggml.sched import Scheduler

F32 = GGMLType.F32
E, T = 8, 4


def test_input_copies_are_named_and_sources_rewired(gpu, cpu, weight, splits_of):
    w = weight(gpu, [E, E], "w")
    x = B.new_input(F32, [E, T], "x")
    h = B.mul_mat(w, x, "h")
    y = B.add(h, x, "y")  # a second consumer of x in the same split reuses the same copy
    graph = Graph.build(y)
    s = Scheduler([gpu, cpu])
    s.split_graph(graph)
    assert splits_of(s) == [("GPU0", 0, 2, ("x",))]
    copy = h.src[1]
    assert copy is not x and copy.name == "GPU0#x#0"
    assert y.src[1] is copy
    assert (copy.type, copy.ne, copy.nb, copy.op) == (x.type, x.ne, x.nb, Op.NONE)
    assert s.get_tensor_backend(copy).name == "GPU0" and s.assignment.causes[copy] == "4.cpy"
    s.reset()  # undoes the in-place rewiring so the graph can be split again
    assert h.src[1] is x and y.src[1] is x


def test_shared_buffer_type_needs_no_copy(cpu, weight, splits_of):
    accel = make_accel("BLAS", cpu, ops=[Op.MUL_MAT])
    w = weight(cpu, [E, E], "w")
    x = B.new_input(F32, [E, T], "x")
    graph = Graph.build(B.rms_norm(B.mul_mat(w, x, "h"), 1e-6, "n"))
    s = Scheduler([accel, cpu])
    s.split_graph(graph)
    # h runs on BLAS (1.wgt0: it reads host memory); x and h cross backends without copies
    assert splits_of(s) == [("BLAS", 0, 1, ()), ("CPU", 1, 2, ())]
    assert graph.nodes[1].src[0] is graph.nodes[0]


def test_a_new_weight_to_stage_starts_a_new_split(gpu, cpu, weight, splits_of):
    w1, w2 = weight(cpu, [E, E], "w1"), weight(cpu, [E, E], "w2")
    x = B.new_input(F32, [E, 64], "x")
    graph = Graph.build(B.mul_mat(w2, B.mul_mat(w1, x, "h1"), "h2"))
    s = Scheduler([gpu, cpu])
    s.split_graph(graph)
    # both matmuls are offloaded (64 >= 32); h2's weight must be staged while the split already
    # has inputs -> a new split, so w1's staging bytes are free again when w2 arrives.
    # Inputs are listed in source order: mul_mat(w1, x) has src[0] = w1.
    assert splits_of(s) == [("GPU0", 0, 1, ("w1", "x")), ("GPU0", 1, 2, ("w2",))]


def test_a_full_input_list_starts_a_new_split(gpu, cpu, weight, splits_of):
    w = weight(gpu, [E, E], "w")
    x1, x2, x3 = (B.new_input(F32, [E, T], f"x{i}") for i in (1, 2, 3))
    graph = Graph.build(B.add(B.add(B.mul_mat(w, x1, "h"), x2, "a2"), x3, "a3"))
    s = Scheduler([gpu, cpu], max_split_inputs=2)
    s.split_graph(graph)
    # a3 would add a third foreign input to a split holding two: cut
    assert splits_of(s) == [("GPU0", 0, 2, ("x1", "x2")), ("GPU0", 2, 3, ("x3",))]
    s.reset()  # give the graph its original sources back before another scheduler splits it
    s = Scheduler([gpu, cpu])  # the pinned llama.cpp grows the list instead
    s.split_graph(graph)
    assert splits_of(s) == [("GPU0", 0, 3, ("x1", "x2", "x3"))]


def test_pipeline_copies_rotate_and_generation_uses_copy_zero(gpu, cpu, weight):
    w = weight(gpu, [E, E], "w")
    x = B.new_input(F32, [E, T], "x")
    h = B.mul_mat(w, x, "h")
    graph = Graph.build(h)
    s = Scheduler([gpu, cpu], parallel=True)
    assert s.n_copies == 4
    s.alloc(graph)
    assert [c.name for c in s.plan.copies[(x, 0)]] == ["GPU0#x#0", "GPU0#x#1", "GPU0#x#2", "GPU0#x#3"]
    assert all(c.flags & TensorFlag.INPUT and c.flags & TensorFlag.OUTPUT for c in s.plan.copies[(x, 0)])
    # pass 6: the CPU-side slots of the input, the current one being x itself
    assert [c.name for c in s.plan.copies[(x, 1)]] == ["x", "CPU#x#1", "CPU#x#2", "CPU#x#3"]
    assert h.src[1].name == "GPU0#x#0"
    s.reset()
    s.alloc(graph)  # the next graph uses the next copy
    assert h.src[1].name == "GPU0#x#1"
    s.reset()
    s.alloc(graph)
    assert h.src[1].name == "GPU0#x#2"
    s.reset()
    s.synchronize()  # idle scheduler: back to copy 0
    s.alloc(graph)
    assert h.src[1].name == "GPU0#x#0"


def test_debug_text_reads_like_ggml_sched_debug_2(gpu, cpu, weight):
    w_cpu, w_gpu = weight(cpu, [E, E], "w_cpu"), weight(gpu, [E, E], "w_gpu")
    x = B.new_input(F32, [E, T], "x")
    b = B.scale(B.mul_mat(w_cpu, x, "a"), 2.0, "b")
    graph = Graph.build(B.mul_mat(w_gpu, b, "d"))
    s = Scheduler([gpu, cpu], op_offload=False)
    s.split_graph(graph)
    text = s.debug_text()
    # a is 8x4 f32 = 128 bytes -> "0K" in ggml's whole-KiB format
    assert "## SPLIT #0: CPU # 0 inputs\n" in text
    assert "## SPLIT #1: GPU0 # 1 inputs: [a (   0K)]\n" in text
    assert ("node #  1 (     SCALE):                    b (   0K) [ GPU0    2.sup] use=1,c=1:"
            "             GPU0#a#0 (   0K) [ GPU0    4.cpy]") in text
    assert "[  CPU   1.wgt0]" in text.splitlines()[2]
