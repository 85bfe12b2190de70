"""Stage 3: split graphs compute what one device computes; MoE copies only the selected
experts. Split lists and byte counts are derived by hand in the comments."""
from __future__ import annotations

import numpy as np

from runtime.ggml import build as B
from runtime.ggml.backend import make_cpu, make_virtual
from runtime.ggml.graph import GGMLType, Graph
from runtime.ggml.sched import Scheduler

F32, I32 = GGMLType.F32, GGMLType.I32
E, V, T = 8, 10, 3
TOKENS = np.array([3, 7, 1], dtype=np.int32)


def _two_layer(weight, homes):
    """Embedding on homes[0], layer 0 on homes[1], layer 1 on homes[2], output on homes[3]."""
    tok = weight(homes[0], [E, V], "tok_embd", seed=1)
    n0, w0 = weight(homes[1], [E], "norm0", seed=2), weight(homes[1], [E, E], "w0", seed=3)
    n1, w1 = weight(homes[2], [E], "norm1", seed=4), weight(homes[2], [E, E], "w1", seed=5)
    w_out = weight(homes[3], [E, V], "output", seed=6)
    tokens = B.new_input(I32, [T], "tokens")
    emb = B.get_rows(tok, tokens, "emb")
    h0 = B.mul_mat(w0, B.mul(B.rms_norm(emb, 1e-6, "nrm0"), n0, "nrm0w"), "h0")
    res0 = B.add(B.silu(h0, "act0"), emb, "res0")
    h1 = B.mul_mat(w1, B.mul(B.rms_norm(res0, 1e-6, "nrm1"), n1, "nrm1w"), "h1")
    res1 = B.add(B.soft_max_ext(h1, None, 0.5, name="sm1"), res0, "res1")
    out = B.mul_mat(w_out, res1, "out")
    return Graph.build(out), tokens, out


def test_split_graph_computes_the_single_device_result(gpu, gpu1, cpu, weight, splits_of):
    graph, tokens, out = _two_layer(weight, [cpu, gpu, gpu1, cpu])
    s = Scheduler([gpu, gpu1, cpu])
    m = s.compute(graph, inputs={tokens: TOKENS})
    # emb: CPU (1.wgt0, GET_ROWS never offloads). GPU0 sweeps down from nrm0w through res0 into
    # nrm1 (the "norm on the previous layer" effect llama.cpp pins against); GPU1 from nrm1w on.
    assert s.assignment_names(graph.nodes) == {
        "emb": "CPU", "nrm0": "GPU0", "nrm0w": "GPU0", "h0": "GPU0", "act0": "GPU0", "res0": "GPU0",
        "nrm1": "GPU0", "nrm1w": "GPU1", "h1": "GPU1", "sm1": "GPU1", "res1": "GPU1", "out": "CPU"}
    assert splits_of(s) == [("CPU", 0, 1, ()), ("GPU0", 1, 7, ("emb",)), ("GPU1", 7, 11, ("nrm1", "res0")),
                            ("CPU", 11, 12, ("res1",))]
    assert m.n_splits == 4 and m.n_nodes == 12
    # every crossing tensor is [8, 3] f32 = 96 bytes
    assert [(c.split, c.name, c.n_bytes) for c in m.copies] == [
        (1, "emb", 96), (2, "nrm1", 96), (2, "res0", 96), (3, "res1", 96)]
    split_result = out.get_data()

    ref_cpu = make_cpu()
    ref_graph, ref_tokens, ref_out = _two_layer(weight, [ref_cpu] * 4)
    ref = Scheduler([ref_cpu])
    assert ref.compute(ref_graph, inputs={ref_tokens: TOKENS}).n_splits == 1
    np.testing.assert_allclose(split_result, ref_out.get_data(), rtol=1e-5, atol=1e-6)


def test_the_result_matches_numpy_by_hand(cpu, weight):
    graph, tokens, out = _two_layer(weight, [cpu] * 4)
    Scheduler([cpu]).compute(graph, inputs={tokens: TOKENS})
    w = {t.name: t.get_data() for t in graph.leafs if t.buffer is not None}

    def rms(x):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)

    emb = w["tok_embd"][TOKENS]
    h0 = (rms(emb) * w["norm0"]) @ w["w0"].T
    res0 = h0 / (1 + np.exp(-h0)) + emb
    h1 = (rms(res0) * w["norm1"]) @ w["w1"].T * 0.5
    res1 = np.exp(h1 - h1.max(-1, keepdims=True))
    res1 = res1 / res1.sum(-1, keepdims=True) + res0
    np.testing.assert_allclose(out.get_data(), res1 @ w["output"].T, rtol=1e-5, atol=1e-6)


def test_eval_callback_sees_the_nodes_it_asks_for(gpu, gpu1, cpu, weight):
    graph, tokens, out = _two_layer(weight, [cpu, gpu, gpu1, cpu])
    s = Scheduler([gpu, gpu1, cpu])
    seen = {}

    def callback(t, ask):
        if ask:
            return t.name in ("h0", "h1")
        seen[t.name] = t.get_data()
        return True

    s.set_eval_callback(callback)
    s.compute(graph, inputs={tokens: TOKENS})
    assert list(seen) == ["h0", "h1"]
    first = out.get_data()
    s.set_eval_callback(None)
    s.compute(graph, inputs={tokens: TOKENS})
    np.testing.assert_array_equal(out.get_data(), first)


K, M, N_EXPERT, N_USED, N_TOK = 32, 4, 8, 2, 4
IDS = np.array([[1, 2], [2, 5], [1, 5], [2, 1]], dtype=np.int32)  # per token: used experts


def _moe(weight, home_dense, home_experts):
    w0 = weight(home_dense, [K, K], "w0", seed=7)
    experts = weight(home_experts, [K, M, N_EXPERT], "ffn_up_exps", seed=8)
    x = B.new_input(F32, [K, N_TOK], "x")
    ids = B.new_input(I32, [N_USED, N_TOK], "ids")
    h = B.reshape(B.mul_mat(w0, x, "h"), [K, 1, N_TOK], name="h3")
    y = B.mul_mat_id(experts, h, ids, "moe")
    return Graph.build(y), x, ids, y


def test_only_the_selected_experts_are_copied(cpu, weight, splits_of):
    gpu = make_virtual("GPU0", 1 << 30, offload_min_batch=2)
    graph, x, ids, y = _moe(weight, gpu, cpu)
    xv = np.random.default_rng(9).standard_normal((N_TOK, K)).astype(np.float32)
    s = Scheduler([gpu, cpu])
    m = s.compute(graph, inputs={x: xv, ids: IDS})
    # moe: experts in host memory, batch ne[2] = 4 >= 2 -> 1.off; staging a weight in a split
    # that has inputs cuts a new split starting at the MUL_MAT_ID
    assert s.assignment.causes[y] == "1.off"
    assert splits_of(s) == [("GPU0", 0, 2, ("x",)), ("GPU0", 2, 3, ("ffn_up_exps", "ids"))]
    # experts used: {1, 2, 5} -> runs (1..2) and (5..5). One expert is 4 rows x 32 f32 = 512
    # bytes; each run is followed by min(512, 512) bytes of padding as neither ends at expert 7:
    # (2*512 + 512) + (512 + 512) = 2560 bytes instead of the whole 8*512 = 4096
    experts_copy = m.copies[1]
    assert (experts_copy.name, experts_copy.expert_runs, experts_copy.n_bytes) == (
        "ffn_up_exps", ((1, 2), (5, 5)), 2560)
    assert [(c.name, c.n_bytes) for c in m.copies] == [("x", 512), ("ffn_up_exps", 2560), ("ids", 32)]

    leafs = {t.name: t for t in graph.leafs}
    w0, ex = leafs["w0"].get_data(), leafs["ffn_up_exps"].get_data()  # (K, K), (N_EXPERT, M, K)
    h = xv @ w0.T
    want = np.stack([np.stack([ex[e] @ h[t] for e in IDS[t]]) for t in range(N_TOK)])
    np.testing.assert_allclose(y.get_data(), want, rtol=1e-5, atol=1e-5)


def test_the_last_expert_run_is_not_padded(cpu, weight):
    gpu = make_virtual("GPU0", 1 << 30, offload_min_batch=2)
    graph, x, ids, _ = _moe(weight, gpu, cpu)
    last = np.array([[6, 7], [7, 6], [6, 7], [7, 6]], dtype=np.int32)
    m = Scheduler([gpu, cpu]).compute(graph, inputs={x: np.ones((N_TOK, K), np.float32), ids: last})
    assert (m.copies[1].expert_runs, m.copies[1].n_bytes) == (((6, 7),), 2 * 512)


def test_pipeline_parallel_compute_matches(gpu, gpu1, cpu, weight):
    graph, tokens, out = _two_layer(weight, [cpu, gpu, gpu1, cpu])
    s = Scheduler([gpu, gpu1, cpu], parallel=True)
    s.compute(graph, inputs={tokens: TOKENS})
    first = out.get_data()
    s.reset()
    s.compute(graph, inputs={tokens: TOKENS})  # copy 1 this time
    assert graph.nodes[1].src[0].name == "GPU0#emb#1"
    np.testing.assert_allclose(out.get_data(), first, rtol=0, atol=0)
