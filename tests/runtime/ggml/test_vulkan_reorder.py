"""ggml-vulkan's graph_optimize order (runtime/ggml/vulkan_reorder.py) on small graphs whose new order
follows by hand from ggml_vk_graph_optimize's rules; the sizes it changes are checked against the
Vulkan build in tests/peer/test_vulkan_peer.py and tests/peer/test_vulkan_archs_peer.py."""
from __future__ import annotations

import pytest

from runtime.ggml import build as B
from runtime.ggml.cuda_fusion import AllocDeps
from runtime.ggml.graph import GGMLType, Graph, Tensor
from runtime.ggml.vulkan_reorder import DISABLE_ENV, vulkan_graph_optimize

F32, I64 = GGMLType.F32, GGMLType.I64


def _weights(*names: str) -> list[Tensor]:
    return [B.new_tensor(F32, (64, 64), name) for name in names]


def _reordered(*outputs: Tensor) -> list[str]:
    g = Graph()
    for t in outputs:
        g.expand(t)
    deps: AllocDeps = {}
    vulkan_graph_optimize(g.nodes, 0, len(g.nodes), g.use_counts(), deps)
    assert deps == {}   # only the top-k MoE groups keep tensors alive
    return [n.name for n in g.nodes]


def test_independent_matmuls_run_together_and_their_sum_waits() -> None:
    # a and b read only x; s reads a (not the node placed last): it waits; d joins the first set
    x = B.new_input(F32, (64, 8), "x")
    w1, w2, w3 = _weights("w1", "w2", "w3")
    a, b = B.mul_mat(w1, x, name="a"), B.mul_mat(w2, x, name="b")
    s = B.add(a, b, name="s")
    d = B.mul_mat(w3, x, name="d")
    assert _reordered(s, d) == ["a", "b", "d", "s"]


def test_a_matmul_and_the_add_right_after_it_stay_paired() -> None:
    # MUL_MAT -> ADD adjacent and the ADD reads the node placed last: ggml-vulkan fuses them
    x = B.new_input(F32, (64, 8), "x")
    w1, w2 = _weights("w1", "w2")
    bias = B.new_tensor(F32, (64, 8), "bias")
    a = B.mul_mat(w1, x, name="a")
    ab = B.add(a, bias, name="ab")
    c = B.mul_mat(w2, x, name="c")
    assert _reordered(ab, c) == ["a", "ab", "c"]


def test_a_norm_its_weight_and_the_rope_of_its_output_are_pulled_together() -> None:
    # RMS_NORM + MUL, then the ROPE that reads the MUL (positions a leaf), then the unrelated matmul
    x = B.new_input(F32, (64, 4, 8), "x")
    pos = B.new_input(GGMLType.I32, (8,), "pos")
    w = B.new_tensor(F32, (64,), "norm_w")
    (wm,) = _weights("wm")
    n = B.rms_norm(x, 1e-6, name="n")
    m = B.mul(n, w, name="m")
    other = B.mul_mat(wm, B.reshape(x, (64, 32)), name="other")
    r = B.rope(m, pos, 64, 2, name="r")
    order = _reordered(other, r)
    assert order.index("n") < order.index("m") < order.index("r")
    assert order.index("r") == order.index("m") + 1


def test_a_rope_that_joins_a_set_pulls_its_cache_row_store_along() -> None:
    # lead, r (rope), x reshaped, mid (reads the reshape), rv (view of r), store (set_rows of rv):
    # r joins lead's set and pulls rv + store; mid reads the unplaced reshape and waits; the views pass
    # then adds the reshape. (A rope that opens a set pulls nothing: only nodes that join do.)
    x = B.new_input(F32, (64, 4, 8), "x")
    y = B.new_input(F32, (64, 8), "y")
    pos = B.new_input(GGMLType.I32, (8,), "pos")
    idx = B.new_input(I64, (8,), "idx")
    cache = B.new_tensor(F32, (256, 16), "cache")
    wl, wm = _weights("wl", "wm")
    lead = B.mul_mat(wl, y, name="lead")
    r = B.rope(x, pos, 64, 2, name="r")
    mid = B.mul_mat(wm, B.reshape(x, (64, 32), name="xr"), name="mid")
    store = B.set_rows(cache, B.view(r, (256, 8), None, 0, name="rv"), idx, name="store")
    g = Graph()
    for t in (lead, r, mid, store):
        g.expand(t)
    assert [n.name for n in g.nodes] == ["lead", "r", "xr", "mid", "rv", "store"]
    vulkan_graph_optimize(g.nodes, 0, len(g.nodes), g.use_counts(), {})
    assert [n.name for n in g.nodes] == ["lead", "r", "rv", "store", "xr", "mid"]


def test_the_environment_switch_keeps_the_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DISABLE_ENV, "1")
    x = B.new_input(F32, (64, 8), "x")
    w1, w2, w3 = _weights("w1", "w2", "w3")
    s = B.add(B.mul_mat(w1, x, name="a"), B.mul_mat(w2, x, name="b"), name="s")
    assert _reordered(s, B.mul_mat(w3, x, name="d")) == ["a", "b", "s", "d"]
