"""Passes 1-4 on small hand-built graphs. Every expected placement, cause and split list is
derived by hand from the rules in seed 000, in the comments next to it."""
from __future__ import annotations

import numpy as np
import pytest

from runtime.ggml import build as B
from runtime.ggml.backend import make_accel, make_virtual
from runtime.ggml.graph import BufferUsage, GGMLType, Graph, Op, Tensor
from runtime.ggml.passes import (
    Assignment,
    assign_forced,
    expand_gpu_down,
    expand_gpu_up,
    expand_rest_down,
    expand_rest_up,
)
from runtime.ggml.sched import Scheduler
from runtime.ggml.sched_errors import SchedulerError

F32, I32, I64 = GGMLType.F32, GGMLType.I32, GGMLType.I64
E, T, N_CTX = 8, 2, 16


def _attention(gpu, cpu, weight):
    """q/k/v/o weights on `gpu`, KV cache in host memory (--no-kv-offload)."""
    w = {n: weight(gpu, [E, E], n, seed=i) for i, n in enumerate(("wq", "wk", "wv", "wo"))}
    k_cache = weight(cpu, [E, N_CTX], "k_cache", usage=BufferUsage.ANY)
    v_cache = weight(cpu, [E, N_CTX], "v_cache", usage=BufferUsage.ANY)
    x, idx = B.new_input(F32, [E, T], "x"), B.new_input(I64, [T], "kv_idx")
    q, k, v = B.mul_mat(w["wq"], x, "q"), B.mul_mat(w["wk"], x, "k"), B.mul_mat(w["wv"], x, "v")
    k_store, v_store = B.set_rows(k_cache, k, idx, "k_store"), B.set_rows(v_cache, v, idx, "v_store")
    kq = B.mul_mat(B.view(k_cache, [E, N_CTX], name="k_view"), q, "kq")
    sm = B.soft_max_ext(kq, None, 1.0, name="kq_soft_max")
    kqv = B.mul_mat(B.transpose(v_cache, "vT"), sm, "kqv")
    cur = B.cont(kqv, name="attn_cur")
    out = B.mul_mat(w["wo"], cur, "attn_out")
    # llama.cpp expands q, v, k, then the KV writes, then the attention (llama-graph.cpp)
    graph = Graph.build(q, v, k, k_store, v_store, out)
    return graph, cur


ATTN_NODES = ["q", "v", "k", "k_store", "v_store", "vT", "k_view", "kq", "kq_soft_max", "kqv", "attn_cur",
              "attn_out"]


def test_kv_on_cpu_pin_keeps_attention_on_cpu(gpu, cpu, weight, splits_of):
    graph, cur = _attention(gpu, cpu, weight)
    assert [n.name for n in graph.nodes] == ATTN_NODES
    s = Scheduler([gpu, cpu])
    s.set_tensor_backend(cur, cpu)
    s.split_graph(graph)
    # 1.wgt0: q,v,k,attn_out (weights on GPU0); 1.dst: the KV writes and views (host cache).
    # Sweeps: GPU down stops at v_store (CPU clears the carried id); GPU up from attn_out stops
    # at the pinned attn_cur; so only "rest down" reaches kq..kqv, carrying v_store's CPU.
    assert s.assignment_names(graph.nodes) == {
        "q": "GPU0", "v": "GPU0", "k": "GPU0", "k_store": "CPU", "v_store": "CPU", "vT": "CPU",
        "k_view": "CPU", "kq": "CPU", "kq_soft_max": "CPU", "kqv": "CPU", "attn_cur": "CPU",
        "attn_out": "GPU0"}
    assert s.assignment.causes[cur] == "usr"
    assert [s.assignment.causes[n] for n in graph.nodes[7:10]] == ["2.sup"] * 3
    assert splits_of(s) == [
        ("GPU0", 0, 3, ("x",)),
        ("CPU", 3, 11, ("k", "v", "q")),  # only this token's k/v/q cross: the cache stays put
        ("GPU0", 11, 12, ("attn_cur",)),
    ]


def test_without_the_pin_the_gpu_sweep_claims_attention_and_copies_the_cache(gpu, cpu, weight, splits_of):
    graph, _ = _attention(gpu, cpu, weight)
    s = Scheduler([gpu, cpu])
    s.split_graph(graph)
    # GPU up from attn_out claims attn_cur, kqv, soft_max, kq (2.sup) before the CPU can spread.
    assert [s.get_tensor_backend(n).name for n in graph.nodes[7:]] == ["GPU0"] * 5
    assert splits_of(s) == [
        ("GPU0", 0, 3, ("x",)),
        ("CPU", 3, 7, ("k", "v")),
        ("GPU0", 7, 12, ("k_view", "vT")),  # the whole K and V cache is copied every token
    ]
    assert [t.nbytes() for t in s.splits[2].inputs] == [E * N_CTX * 4, E * N_CTX * 4]


def test_pinned_unpinned_and_cpu_only_attention_compute_the_same(gpu, cpu, weight):
    xv = np.random.default_rng(11).standard_normal((T, E)).astype(np.float32)
    idx = np.array([3, 4], dtype=np.int64)
    results = []
    for pin, home in ((True, gpu), (False, gpu), (False, cpu)):
        graph, cur = _attention(home, cpu, weight)
        s = Scheduler([gpu, cpu] if home is gpu else [cpu])
        if pin:
            s.set_tensor_backend(cur, cpu)
        leafs = {t.name: t for t in graph.leafs}
        s.compute(graph, inputs={leafs["x"]: xv, leafs["kv_idx"]: idx})
        results.append(graph.nodes[-1].get_data())
    assert [len(r) for r in results] == [T, T, T]
    np.testing.assert_allclose(results[0], results[2], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(results[1], results[2], rtol=1e-5, atol=1e-6)


def _offload_graph(gpu, cpu, weight, n_tok):
    w_gpu, w_cpu = weight(gpu, [E, E], "w_gpu"), weight(cpu, [E, E], "w_cpu")
    x = B.new_input(F32, [E, n_tok], "x")
    return Graph.build(B.mul_mat(w_cpu, B.mul_mat(w_gpu, x, "h"), "ffn"))


def test_op_offload_places_the_same_matmul_by_batch_size(gpu, cpu, weight, splits_of):
    # batch 512: ffn's weight is in host memory, GPU0 wants ne[1]=512 >= 32 -> 1.off; the weight
    # must then be staged, and a staged weight in a split that already has inputs starts a new one
    s = Scheduler([gpu, cpu])
    s.split_graph(_offload_graph(gpu, cpu, weight, 512))
    assert s.assignment_names(s._graph.nodes) == {"h": "GPU0", "ffn": "GPU0"}
    assert s.assignment.causes[s._graph.nodes[1]] == "1.off"
    assert splits_of(s) == [("GPU0", 0, 1, ("x",)), ("GPU0", 1, 2, ("w_cpu",))]
    # batch 1: 1 < 32, GPU0 declines; the op runs where its weight is
    s = Scheduler([gpu, cpu])
    s.split_graph(_offload_graph(gpu, cpu, weight, 1))
    assert s.assignment_names(s._graph.nodes) == {"h": "GPU0", "ffn": "CPU"}
    assert s.assignment.causes[s._graph.nodes[1]] == "1.wgt0"
    assert splits_of(s) == [("GPU0", 0, 1, ("x",)), ("CPU", 1, 2, ("h",))]


def test_no_op_offload_keeps_the_batch_matmul_with_its_weight(gpu, cpu, weight, splits_of):
    s = Scheduler([gpu, cpu], op_offload=False)
    s.split_graph(_offload_graph(gpu, cpu, weight, 512))
    assert splits_of(s) == [("GPU0", 0, 1, ("x",)), ("CPU", 1, 2, ("h",))]


def test_offload_threshold_is_per_device(cpu, weight, splits_of):
    gpu = make_virtual("GPU0", 1 << 30, offload_min_batch=4)
    s = Scheduler([gpu, cpu])
    s.split_graph(_offload_graph(gpu, cpu, weight, 4))  # 4 >= 4: offloaded
    assert s.assignment.causes[s._graph.nodes[1]] == "1.off"


def test_reshape_between_gpu_nodes_does_not_fragment_the_split(gpu, cpu, weight, splits_of):
    w1, w2 = weight(gpu, [E, E], "w1"), weight(gpu, [4, 4], "w2")
    x = B.new_input(F32, [E, T], "x")
    r = B.reshape(B.mul_mat(w1, x, "a"), [4, 2 * T], name="r")
    graph = Graph.build(B.mul_mat(w2, r, "b"))
    s = Scheduler([gpu, cpu])
    s.split_graph(graph)
    # pass 2 and pass 5 skip view ops; pass 4 gives r its view source's backend
    assert [(n.name, s.get_tensor_backend(n).name, s.assignment.causes[n]) for n in graph.nodes] == [
        ("a", "GPU0", "1.wgt0"), ("r", "GPU0", "4.vsrc"), ("b", "GPU0", "1.wgt0")]
    assert splits_of(s) == [("GPU0", 0, 3, ("x",))]


def test_a_view_of_a_cpu_tensor_between_gpu_nodes_is_an_input_not_a_split(gpu, cpu, weight, splits_of):
    w1, w2 = weight(gpu, [E, E], "w1"), weight(gpu, [4, 4], "w2")
    x, x2 = B.new_input(F32, [4, 2 * T], "x"), B.new_input(F32, [E, T], "x2")
    a = B.reshape(B.mul_mat(w1, x2, "a"), [4, 2 * T], name="a2")
    r = B.reshape(x, [4, 2 * T], name="r")  # lives where x lives: the CPU (4.vsrc)
    graph = Graph.build(B.add(a, B.mul_mat(w2, r, "b"), "c"))
    s = Scheduler([gpu, cpu])
    s.split_graph(graph)
    assert [n.name for n in graph.nodes] == ["a", "a2", "r", "b", "c"]
    assert s.get_tensor_backend(r).name == "CPU" and s.assignment.causes[r] == "4.vsrc"
    assert splits_of(s) == [("GPU0", 0, 5, ("x2", "r"))]


def test_an_unsupported_real_op_between_gpu_nodes_does_fragment(cpu, weight, splits_of):
    gpu = make_virtual("GPU0", 1 << 30, ops=[Op.MUL_MAT])
    w1, w2 = weight(gpu, [E, E], "w1"), weight(gpu, [E, E], "w2")
    x = B.new_input(F32, [E, T], "x")
    graph = Graph.build(B.mul_mat(w2, B.cont(B.mul_mat(w1, x, "a"), name="c"), "b"))
    s = Scheduler([gpu, cpu])
    s.split_graph(graph)
    # c: GPU0 refuses CONT in every sweep; pass 3's guess: only the CPU runs it -> 3.best
    assert s.assignment.causes[graph.nodes[1]] == "3.best"
    assert splits_of(s) == [("GPU0", 0, 1, ("x",)), ("CPU", 1, 2, ("a",)), ("GPU0", 2, 3, ("c",))]


def _spread_graph(gpu, cpu, weight):
    w_cpu, w_cpu2, w_gpu = weight(cpu, [E, E], "w_cpu"), weight(cpu, [E, E], "w_cpu2"), weight(gpu, [E, E], "w_gpu")
    x = B.new_input(F32, [E, T], "x")
    a = B.mul_mat(w_cpu, x, "a")
    c = B.rms_norm(B.scale(a, 2.0, "b"), 1e-6, "c")
    e = B.scale(B.mul_mat(w_gpu, c, "d"), 0.5, "e")
    return Graph.build(B.scale(B.mul_mat(w_cpu2, e, "f"), 3.0, "g"))


def test_cpu_never_spreads_into_a_region_a_gpu_sweep_reaches(gpu, cpu, weight, splits_of):
    graph = _spread_graph(gpu, cpu, weight)
    s = Scheduler([gpu, cpu], op_offload=False)
    ctx, a = s.ctx, Assignment()

    def names():
        return {n.name: a.get(n) for n in graph.nodes}

    a = assign_forced(ctx, graph, a)
    assert names() == {"a": 1, "b": -1, "c": -1, "d": 0, "e": -1, "f": 1, "g": -1}
    a = expand_gpu_down(ctx, graph, a)  # d carries GPU0 to e; f (CPU) clears it: g untouched
    assert names() == {"a": 1, "b": -1, "c": -1, "d": 0, "e": 0, "f": 1, "g": -1}
    a = expand_gpu_up(ctx, graph, a)  # d carries GPU0 up to c and b; a (CPU) does not spread down
    assert names() == {"a": 1, "b": 0, "c": 0, "d": 0, "e": 0, "f": 1, "g": -1}
    a = expand_rest_down(ctx, graph, a)  # only now may the CPU spread: f -> g, no GPU after it
    assert names() == {"a": 1, "b": 0, "c": 0, "d": 0, "e": 0, "f": 1, "g": 1}
    a = expand_rest_up(ctx, graph, a)
    assert names()["g"] == 1
    s.split_graph(graph)
    assert splits_of(s) == [("CPU", 0, 1, ()), ("GPU0", 1, 5, ("a",)), ("CPU", 5, 7, ("e",))]


def test_nothing_supports_the_op_fails_with_all_nodes_should_be_assigned(gpu, cpu):
    x = B.new_input(F32, [E, T], "x")
    conv = Tensor(F32, [E, T], name="conv", op=Op.CONV_2D, src=[x])  # no kernel on any device
    with pytest.raises(SchedulerError, match="all nodes should be assigned"):
        Scheduler([gpu, cpu]).split_graph(Graph.build(conv))


def test_the_last_backend_must_be_the_cpu(gpu, cpu):
    with pytest.raises(SchedulerError, match="last backend must be the CPU"):
        Scheduler([cpu, gpu])


def test_preallocated_tensor_no_backend_can_run_aborts(cpu, weight):
    gpu = make_virtual("GPU0", 1 << 30, ops=[Op.MUL_MAT])  # cannot SET_ROWS into its own cache
    cache = weight(gpu, [E, N_CTX], "k_cache", usage=BufferUsage.ANY)
    store = B.set_rows(cache, B.new_input(F32, [E, T], "k"), B.new_input(I64, [T], "idx"), "k_store")
    with pytest.raises(SchedulerError, match=r"pre-allocated tensor \(k_store\)"):
        Scheduler([gpu, cpu]).split_graph(Graph.build(store))


def test_rope_abstains_from_the_weight_rule(gpu, cpu, weight, splits_of):
    w_cpu = weight(cpu, [E, E], "w_cpu")
    freqs = weight(gpu, [2], "rope_freqs")  # a tiny model tensor on the GPU
    x, pos = B.new_input(F32, [E, T], "x"), B.new_input(I32, [T], "pos")
    q = B.reshape(B.mul_mat(w_cpu, x, "q"), [4, 2, T], name="q3")
    graph = Graph.build(B.rope(q, pos, 4, freq_factors=freqs, name="q_rope"))
    s = Scheduler([gpu, cpu], op_offload=False)
    s.split_graph(graph)
    # no 1.wgt2 for ROPE: rest down carries q's CPU onto it; the frequencies are copied instead
    assert (s.get_tensor_backend(graph.nodes[2]).name, s.assignment.causes[graph.nodes[2]]) == ("CPU", "2.sup")
    assert splits_of(s) == [("CPU", 0, 3, ("rope_freqs",))]


def test_upgrade_to_same_buffer_type_and_pins_survive(cpu, weight, splits_of):
    accel = make_accel("BLAS", cpu, ops=[Op.MUL_MAT, Op.SCALE])  # shares the CPU's buffer type
    tok = weight(cpu, [E, 10], "tok_embd")
    e = B.get_rows(tok, B.new_input(I32, [T], "ids"), "emb")
    f = B.scale(e, 2.0, "f")
    graph = Graph.build(f)
    s = Scheduler([accel, cpu])
    s.split_graph(graph)
    # emb: BLAS reads host memory but has no GET_ROWS -> CPU (1.wgt0); rest down gives f the CPU;
    # pass 3: BLAS has the identical buffer type and runs SCALE -> 3.upg. Same memory: no copy.
    assert [(n.name, s.get_tensor_backend(n).name, s.assignment.causes[n]) for n in graph.nodes] == [
        ("emb", "CPU", "1.wgt0"), ("f", "BLAS", "3.upg")]
    assert splits_of(s) == [("CPU", 0, 1, ()), ("BLAS", 1, 2, ())]
    s.set_tensor_backend(f, cpu)
    s.split_graph(graph)
    assert s.get_tensor_backend(f).name == "CPU" and s.assignment.causes[f] == "usr"
    assert splits_of(s) == [("CPU", 0, 2, ())]
