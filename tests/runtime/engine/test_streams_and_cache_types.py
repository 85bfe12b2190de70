"""The reserve of -np N (unified or per-sequence KV streams) and of quantized or mixed KV caches.

Expected node counts and compute buffers come from llama.cpp (the pinned build's llama-fit-params
-v, or llama-server -v where fit-params has no -kvu, on these very files); shapes and rotation
sizes are derived here from the definitions in src/llama-kv-cache.cpp and src/llama-graph.cpp.
tests/peer/test_validate_peer.py re-measures the node counts live.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as Q

from planner.core.errors import BadInput
from planner.llama.flags import parse_llama_flags
from planner.registry.examples import resolve_model
from planner.synth.tiny_models import Dims, write_tiny
from runtime.engine.kvcache import CacheKind, rotation_size
from runtime.engine.reserve import reserve_compute, supported
from runtime.engine.runner import ModelRunner

MIB = 2**20
HEAD64 = Dims(head_dim=64, n_embd=128, n_head=2, n_head_kv=1)   # a head size the Hadamard rotation takes
# llama-fit-params -v on write_tiny(arch, dims): "graph: nodes = N" (prompt and token graphs alike)
LLAMA_CPP_NODES = [
    ("llama", Dims(), ["-c", "256", "-np", "4"], 72),                     # + a stream reshape of K and V
    ("llama", Dims(), ["-c", "256", "-ctk", "f32", "-ctv", "f32"], 72),   # + f16 casts before the fused op
    ("llama", HEAD64, ["-c", "256", "-ctk", "q8_0", "-ctv", "q8_0"], 92),  # + Q, K, V and output rotations
    ("llama", HEAD64, ["-c", "256", "-ctk", "q8_0", "-ctv", "f16"], 80),
    ("llama", HEAD64, ["-c", "256", "-ctk", "f16", "-ctv", "q8_0", "-fa", "on"], 80),
    ("llama", HEAD64, ["-c", "256", "-np", "4", "-ctk", "q8_0", "-ctv", "q8_0"], 96),
    ("llama", HEAD64, ["-c", "256", "-np", "3", "-fa", "off"], 80),
    ("gemma3", HEAD64, ["-c", "256", "-ctk", "q8_0", "-ctv", "q8_0"], 111),
]
# llama-server -v -m gemma-3-270m -c 4096 -np 4 [-kvu] -fa on|off (it sets n_outputs_max = -np):
# "graph: nodes = N" and "CPU compute buffer size = X MiB"
GEMMA_SERVER = [
    (["-kvu", "-fa", "off"], 817, 54.76),
    (["-fa", "off"], 835, 21.76),
    (["-kvu", "-fa", "on"], 727, 24.27),
    (["-fa", "on"], 763, 19.77),
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-streams")
    made: dict[tuple[str, Dims], Path] = {}

    def get(arch: str, dims: Dims) -> Path:
        if (arch, dims) not in made:
            made[arch, dims] = write_tiny(d / f"{arch}-{len(made)}.gguf", arch, dims)
        return made[arch, dims]

    return get


@pytest.mark.parametrize("arch, dims, flags, nodes", LLAMA_CPP_NODES,
                         ids=[f"{a}-hd{d.head_dim} {' '.join(f)}" for a, d, f, _ in LLAMA_CPP_NODES])
def test_node_counts_equal_llama_cpp(tiny, arch, dims, flags, nodes) -> None:
    report = ModelRunner.load(str(tiny(arch, dims)), parse_llama_flags(flags), weights=False).reserve_report
    assert report is not None
    assert (report.n_nodes_pp, report.n_nodes_tg, report.n_splits_pp) == (nodes, nodes, 1)


@pytest.mark.parametrize("extra, nodes, compute_mib", GEMMA_SERVER, ids=[" ".join(e) for e, *_ in GEMMA_SERVER])
def test_gemma3_parallel_sequences_equal_llama_server(extra, nodes, compute_mib) -> None:
    flags = parse_llama_flags(["-c", "4096", "-np", "4", *extra])
    runner = ModelRunner.load(resolve_model("example:gemma3-270m"), flags, n_outputs_max=4, weights=False)
    report = runner.reserve_report
    assert report is not None
    assert (report.n_nodes_pp, report.n_nodes_tg) == (nodes, nodes)
    # llama.cpp prints MiB to two decimals
    assert abs(report.compute_bytes["CPU"] / MIB - compute_mib) <= 0.005


def test_rotation_sizes_follow_llama_kv_cache() -> None:
    # K: the largest power of two from 64 that divides the head size; V: 64; none for f16/f32/bf16
    # or a head size that is no multiple of 64
    assert [rotation_size(Q.Q8_0, hd, widest=True) for hd in (64, 128, 192, 256, 96)] == [64, 128, 64, 256, 0]
    assert [rotation_size(Q.Q4_0, hd, widest=False) for hd in (64, 128, 256, 32)] == [64, 64, 64, 0]
    assert [rotation_size(t, 128, widest=True) for t in (Q.F16, Q.F32, Q.BF16)] == [0, 0, 0]


def test_streams_shape_the_cache_views_and_masks(tiny) -> None:
    """-np 4: K/V [n_embd_gqa, n_ctx_seq, 4] of the cache types; the prompt mask [n_kv, n_tokens / 4,
    1, 4]; with -kvu one stream of the whole context and a [n_kv, n_tokens, 1, 1] mask."""
    d = HEAD64
    width = d.head_dim * d.n_head_kv
    path = str(tiny("llama", d))
    split = ModelRunner.load(path, parse_llama_flags(["-c", "1024", "-np", "4", "-ctk", "q8_0", "-ctv", "q4_0"]),
                             weights=False)
    assert split.kv is not None
    assert split.kv.k[0].ne == (width, 256, 4, 1) and split.kv.v[0].ne == (width, 256, 4, 1)
    assert (split.kv.k[0].type, split.kv.v[0].type) == (Q.Q8_0, Q.Q4_0)
    # q8_0: 34 bytes per 32 values; q4_0: 18 bytes per 32 values; per layer K + V, 4 streams of 256 cells
    assert split.kv_bytes["CPU"] == d.n_layer * 4 * 256 * width // 32 * (34 + 18)
    pp, tg = list(split._graphs.values())
    assert pp.attn[CacheKind.BASE].mask.ne == (256, 512 // 4, 1, 4)
    assert tg.attn[CacheKind.BASE].mask.ne == (256, 1, 1, 4)
    assert (tg.shape.n_tokens, tg.shape.n_outputs) == (4, 4)

    unified = ModelRunner.load(path, parse_llama_flags(["-c", "1024", "-np", "4", "-kvu"]), weights=False)
    assert unified.kv is not None
    assert unified.kv.k[0].ne == (width, 1024, 1, 1)
    pp, tg = list(unified._graphs.values())
    assert pp.attn[CacheKind.BASE].mask.ne == (1024, 512, 1, 1)
    assert tg.attn[CacheKind.BASE].mask.ne == (1024, 4, 1, 1)


def test_prompt_reserve_rounds_tokens_to_the_sequences(tiny) -> None:
    """graph_reserve rounds n_tokens up to a multiple of n_seqs; the outputs are counted before."""
    runner = ModelRunner.load(str(tiny("llama", Dims())), parse_llama_flags(["-c", "768", "-np", "3"]), weights=False)
    pp, tg = list(runner._graphs)
    assert (pp.n_tokens, pp.n_outputs) == (513, 512)
    assert (tg.n_tokens, tg.n_outputs) == (3, 3)


@pytest.mark.parametrize("flags", [["-np", "2"], ["-ctk", "q8_0", "-ctv", "q8_0"], ["-ctk", "q4_0", "-ctv", "f16"]])
def test_decode_refuses_what_it_only_sizes(tiny, flags) -> None:
    runner = ModelRunner.load(str(tiny("llama", Dims())), parse_llama_flags(["-c", "256", *flags]))
    with pytest.raises(BadInput, match="only sizes"):
        runner.decode([1, 2, 3])


@pytest.mark.parametrize("flags", [["-np", "4"], ["-np", "4", "-kvu"], ["-ctk", "q8_0", "-ctv", "q8_0"],
                                   ["-ctk", "q8_0", "-ctv", "f16"], ["-ctk", "q4_0", "-ctv", "q4_0", "-fa", "on"]])
def test_the_estimate_reserve_admits_streams_and_cache_types(tiny, flags) -> None:
    from planner.llama.context import model_context
    from planner.llama.settings import resolve_settings

    settings = resolve_settings(model_context(str(tiny("llama", HEAD64))), parse_llama_flags(["-c", "512", *flags]))
    assert supported(settings)
    rows = reserve_compute(settings)
    assert rows is not None and rows["Host"] > 0
