"""ggml-cuda's graph_optimize alloc deps (runtime/ggml/cuda_fusion.py), on graphs built here in
build_moe_ffn's order (src/llama-graph.cpp: the weighted experts, one view per used expert, then the
adds). What is expected follows the matchers of ggml-cuda.cu at the pinned build, read by hand."""
from __future__ import annotations

import pytest

from runtime.ggml import build as B
from runtime.ggml.cuda_fusion import cuda_alloc_deps
from runtime.ggml.graph import GGMLType, Graph, Tensor

F32 = GGMLType.F32


def moe_tail(n_embd: int, n_used: int, n_tokens: int) -> tuple[Graph, Tensor, Tensor, Tensor]:
    """experts [n_embd, n_used, n_tokens] * weights [1, n_used, n_tokens], summed over the experts."""
    experts = B.new_input(F32, (n_embd, n_used, n_tokens, 1), "ffn_moe_down")
    weights = B.new_input(F32, (1, n_used, n_tokens, 1), "ffn_moe_weights")
    weighted = B.mul(experts, weights, name="ffn_moe_weighted")
    views = [B.view(weighted, (n_embd, n_tokens), (weighted.nb[0], weighted.nb[2]), i * weighted.nb[1],
                    name=f"expert_{i}") for i in range(n_used)]
    g = Graph()
    for v in views:
        g.expand(v)
    out = views[0]
    for v in views[1:]:
        out = B.add(out, v, name="ffn_moe_out")
    g.expand(out)
    return g, experts, weights, out


def deps_of(g: Graph) -> dict[Tensor, list[Tensor]]:
    deps: dict[Tensor, list[Tensor]] = {}
    cuda_alloc_deps(g.nodes, 0, len(g.nodes), g.use_counts(), deps)
    return deps


def test_weighted_reduction_keeps_experts_and_weights_until_the_last_add():
    g, experts, weights, out = moe_tail(64, 4, 8)
    assert len(g.nodes) == 1 + 4 + 3            # MUL, four views, three adds: 2k + 1 - 1 nodes after it
    deps = deps_of(g)
    assert list(deps) == [out]
    assert deps[out] == [experts, weights]


@pytest.mark.parametrize("n_used", [1, 16])
def test_weighted_reduction_needs_two_to_fifteen_experts(n_used):
    g, *_ = moe_tail(64, n_used, 8)
    assert deps_of(g) == {}


def test_a_view_used_outside_the_group_stops_the_fusion():
    """ggml_can_fuse_subgraph: a node the group does not output may have no use outside it."""
    g, *_ = moe_tail(64, 4, 8)
    g.expand(B.add(g.nodes[2], g.nodes[2], name="elsewhere"))   # the second expert's view, used again
    assert deps_of(g) == {}


def test_fusion_disabled_by_the_environment(monkeypatch):
    g, *_ = moe_tail(64, 4, 8)
    monkeypatch.setenv("GGML_CUDA_DISABLE_FUSION", "1")
    assert deps_of(g) == {}
    monkeypatch.setenv("GGML_CUDA_DISABLE_FUSION", "0")
    assert deps_of(g) != {}
