"""The MLA builder (runtime/engine/deepseek2.py) on the architectures that share deepseek2's graph, the DSA
builder (runtime/engine/dsa.py) and llama4's (runtime/engine/llama4.py): tiny files' reserves and caches against
llama.cpp's, decode against an independent forward pass, the DSA kernels against their definitions.

mistral4 (deepseek2's model class at the pin) ships merged gate_up experts; its published config also
selects experts within groups (expert_group_count 8, 1 used), so the grouped file below covers that path.
Expected figures are llama-fit-params -v on these very files (pinned build): "graph: nodes = N" and
"CPU compute buffer size = X MiB"; the DSA models' "llama_kv_cache: size = ..." lines for their two caches.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import Keys

from planner.core.errors import BadInput, GGUFError
from planner.gguf.keys import LLM_KV_ATTENTION_INDEXER_TYPES
from planner.gguf.reader import read_model
from planner.llama.context import model_context
from planner.llama.flags import parse_llama_flags
from planner.memory.coverage import Status, coverage_table
from planner.memory.estimate import estimate
from planner.model.arch import model_facts
from planner.synth.gguf_factory import ModelSpec, add_tokenizer, deepseek2_spec
from planner.synth.shapes_mla import dsa_layout, llama4_spec, mistral4_layout
from planner.synth.tiny_models import write_random
from runtime.engine.deepseek2 import MlaHParams
from runtime.engine.runner import ModelRunner
from runtime.ggml import build as B
from runtime.ggml.graph import GGMLType, Graph, Op
from runtime.ggml.sched import Scheduler
from tests.runtime.engine.test_deepseek2 import TOKENS, reference_logits
from tests.support.reference import float64_weights
from tests.support.reserve_checks import assert_reserve_equals


def mistral4_tiny(groups: bool) -> ModelSpec:
    """3 MoE layers of deepseek2_spec's tiny dimensions (q_lora 128, kv_lora 128, rope 32, 4 experts of 64,
    2 used), merged gate_up, normalised weights; with `groups`, 2 expert groups of which 1 is used."""
    spec = mistral4_layout(deepseek2_spec(n_vocab=512, n_dense_lead=0), probs_bias=True)
    spec.metadata[Keys.LLM.EXPERT_WEIGHTS_NORM] = True
    if groups:
        spec.metadata.update({Keys.LLM.EXPERT_GROUP_COUNT: 2, Keys.LLM.EXPERT_GROUP_USED_COUNT: 1})
    add_tokenizer(spec, 512, n_merges=1)
    return spec


TINY = {"mistral4": lambda: mistral4_tiny(False), "mistral4-groups": lambda: mistral4_tiny(True)}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("mla")
    out = {}
    for name, make in TINY.items():
        [out[name]] = make().write(d / f"{name}.gguf")
    out["mistral4-f32"] = write_random(d / "mistral4-f32.gguf", TINY["mistral4"](), True, 0)
    out["mistral4-groups-f32"] = write_random(d / "mistral4-groups-f32.gguf", TINY["mistral4-groups"](), True, 0)
    return out


# llama-fit-params -v on the tiny files: (graph nodes, CPU compute buffer MiB)
LLAMA_CPP_RESERVE = {
    "mistral4": {"-c 256": (210, 2.63), "-c 256 -fa off": (216, 3.75), "-c 256 -np 2": (213, 2.63),
                 "-c 512 -np 3 -ub 64": (213, 0.68), "-c 256 -ctk q8_0 -ctv q8_0": (210, 2.63)},
    # 14 nodes more per MoE layer: the group scores, the kept groups and the masked selection
    "mistral4-groups": {"-c 256": (252, 2.63), "-c 256 -fa off": (258, 3.75), "-c 256 -np 2": (255, 2.63),
                        "-c 512 -np 3 -ub 64": (255, 0.68), "-c 256 -ctk q8_0 -ctv q8_0": (252, 2.63)},
}


@pytest.mark.parametrize("name, flags", [(n, f) for n, rows in LLAMA_CPP_RESERVE.items() for f in rows])
def test_reserve_nodes_and_compute_buffer_equal_llama_cpp(name: str, flags: str, models: dict[str, Path]) -> None:
    assert_reserve_equals(models[name], flags, *LLAMA_CPP_RESERVE[name][flags])


def test_mistral4_cache_holds_the_latent_only(models: dict[str, Path]) -> None:
    """One K row of kv_lora_rank + n_rot (128 + 32) f16 per cell and layer, no V (has_v = !is_mla)."""
    runner = ModelRunner.load(str(models["mistral4"]), parse_llama_flags(["-c", "256"]), weights=False)
    assert isinstance(runner.hp, MlaHParams)
    assert runner.kv_bytes == {"CPU": 3 * 256 * (128 + 32) * 2}


def test_mistral4_is_simulated_in_the_coverage_table() -> None:
    row = next(r for r in coverage_table() if r.name == "mistral4")
    assert (row.status, row.kv) == (Status.SIMULATED, "exact")


def _split_gate_up(w: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The merged experts as the reference reads them: gate rows first, then up (build_moe_ffn's views)."""
    out = dict(w)
    for name in [n for n in w if n.endswith("ffn_gate_up_exps.weight")]:
        both = out.pop(name)                        # numpy order: (n_expert, 2 * n_ff, n_embd)
        n_ff = both.shape[1] // 2
        out[name.replace("gate_up", "gate")], out[name.replace("gate_up", "up")] = both[:, :n_ff], both[:, n_ff:]
    return out


@pytest.mark.parametrize("fa", ["on", "off"])
def test_mistral4_logits_match_an_independent_forward_pass(fa: str, models: dict[str, Path]) -> None:
    path = models["mistral4-f32"]
    runner = ModelRunner.load(str(path), parse_llama_flags(["-c", "256", "-fa", fa]))
    got = runner.decode(TOKENS, all_logits=True)
    ref = reference_logits(path, TINY["mistral4"](), TOKENS, _split_gate_up(float64_weights(path)))
    assert np.abs(got - ref).max() <= 5e-3 * np.abs(ref).max()


def test_grouped_selection_is_sized_not_decoded(models: dict[str, Path]) -> None:
    runner = ModelRunner.load(str(models["mistral4-groups-f32"]), parse_llama_flags(["-c", "256"]))
    with pytest.raises(BadInput, match="grouped expert selection"):
        runner.decode(TOKENS)


# --- DSA caches (deepseek32, glm-dsa): the K-only MLA cache plus the lightning indexer's key cache -------

def dsa_tiny(arch: str, n_layer: int, index_full: tuple[int, ...] | None = None) -> ModelSpec:
    """deepseek2_spec's tiny MLA layers (kv_lora 128 + rope 32 per cell) with an indexer of 4 heads of 64."""
    spec = dsa_layout(deepseek2_spec(n_vocab=512, n_layer=n_layer), arch, n_index_head=4, index_head=64, top_k=64,
                      index_full=index_full)
    add_tokenizer(spec, 512, n_merges=1)
    return spec


@pytest.mark.parametrize("arch, n_layer, index_full, flags, expected", [
    # llama-fit-params -v: "size = 0.31 MiB (256 cells, 4 layers ...)" for the MLA cache and "0.06 MiB (256
    # cells, 2 layers ...)" for the indexer's; by hand: 4 x 256 x 160 x 2 B and 2 x 256 x 64 x 2 B
    ("glm-dsa", 4, (1, 0, 1, 0), "-c 256", (4 * 160 + 2 * 64) * 256 * 2),
    # every deepseek32 trunk layer owns an indexer; q8_0 rows are 34 B per 32 values, K type for both caches
    ("deepseek32", 3, None, "-c 256 -ctk q8_0 -ctv q8_0", 3 * (160 + 64) * 256 * 34 // 32),
    ("deepseek32", 3, None, "-c 512 -np 2", 3 * (160 + 64) * 256 * 2 * 2),   # two streams of 256 cells
])
def test_dsa_context_bytes(arch: str, n_layer: int, index_full: tuple[int, ...] | None, flags: str, expected: int,
                           tmp_path: Path) -> None:
    [path] = dsa_tiny(arch, n_layer, index_full).write(tmp_path / "dsa.gguf")
    est = estimate(model_context(str(path)), flags.split())
    assert [d.context_bytes for d in est.devices if d.name == "Host"] == [expected]


def test_glm_5_2_files_own_indexers_every_fourth_layer(tmp_path: Path) -> None:
    """glm-dsa.cpp: a 1M-position file without attention.indexer.types takes GLM-5.2's layout (blocks 0, 1,
    then 2, 6, 10, ...); a shorter one has an indexer at every block."""
    spec = dsa_tiny("glm-dsa", 8)
    spec.metadata[Keys.LLM.CONTEXT_LENGTH] = 1048576
    [path] = spec.write(tmp_path / "glm52.gguf")
    facts = model_facts(read_model(str(path)))
    assert [il for il, lf in enumerate(facts.layers) if lf.index_k] == [0, 1, 2, 6]
    [short] = dsa_tiny("glm-dsa", 8).write(tmp_path / "glm5.gguf")
    assert all(lf.index_k == 64 for lf in model_facts(read_model(str(short))).layers)


def test_indexer_types_of_the_wrong_length_are_refused(tmp_path: Path) -> None:
    spec = dsa_tiny("glm-dsa", 4)
    spec.metadata[LLM_KV_ATTENTION_INDEXER_TYPES] = [1, 0, 1]
    [path] = spec.write(tmp_path / "bad.gguf")
    with pytest.raises(GGUFError, match="indexer.types has 3 entries, expected 4"):
        model_facts(read_model(str(path)))


def _dsa_files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("dsa")
    specs = {"deepseek32": dsa_tiny("deepseek32", 3), "glm-dsa": dsa_tiny("glm-dsa", 4, (1, 0, 1, 0)),
             "glm-dsa-full": dsa_tiny("glm-dsa", 4)}
    out = {}
    for name, spec in specs.items():
        [out[name]] = spec.write(d / f"{name}.gguf")
    return out


@pytest.fixture(scope="module")
def dsa_models(tmp_path_factory) -> dict[str, Path]:
    return _dsa_files(tmp_path_factory)


# llama-fit-params -v on the tiny DSA files (3 deepseek32 layers, the first dense; 4 glm-dsa layers): the graph's
# node count and the CPU compute buffer (MiB)
LLAMA_CPP_DSA_RESERVE = {
    "deepseek32": {"-c 256": (256, 2.96), "-c 256 -fa off": (262, 4.08), "-c 256 -np 2": (262, 2.96),
                   "-c 512 -np 3 -ub 64": (262, 0.77), "-c 256 -ctk q8_0 -ctv q8_0": (256, 2.96),
                   "-c 2048 -ub 128": (256, 3.36)},
    # layers 1 and 3 share layer 0's and 2's top-k: no indexer nodes of their own
    "glm-dsa": {"-c 256": (303, 3.02), "-c 256 -fa off": (311, 4.15), "-c 256 -np 2": (309, 3.02),
                "-c 512 -np 3 -ub 64": (309, 0.79), "-c 256 -ctk q8_0 -ctv q8_0": (303, 3.02),
                "-c 2048 -ub 128": (303, 3.39)},
    "glm-dsa-full": {"-c 256": (345, 3.02), "-c 256 -fa off": (353, 4.15)},
}


@pytest.mark.parametrize("name, flags", [(n, f) for n, rows in LLAMA_CPP_DSA_RESERVE.items() for f in rows])
def test_dsa_reserve_nodes_and_compute_buffer_equal_llama_cpp(name: str, flags: str,
                                                              dsa_models: dict[str, Path]) -> None:
    assert_reserve_equals(dsa_models[name], flags, *LLAMA_CPP_DSA_RESERVE[name][flags])


def test_dsa_runner_allocates_both_caches(dsa_models: dict[str, Path]) -> None:
    """The MLA cache (160 per cell) of every layer plus the indexer's (64 per cell) of layers 0 and 2."""
    runner = ModelRunner.load(str(dsa_models["glm-dsa"]), parse_llama_flags(["-c", "256"]), weights=False)
    assert runner.kv_bytes == {"CPU": (4 * 160 + 2 * 64) * 256 * 2}


def test_dsa_decode_is_refused(tmp_path: Path) -> None:
    spec = dsa_tiny("deepseek32", 3)
    spec.metadata[Keys.LLM.EXPERT_GATING_FUNC] = 1   # softmax: no other op stops the decode first
    [path] = spec.write(tmp_path / "softmax.gguf")
    runner = ModelRunner.load(str(path), parse_llama_flags(["-c", "256"]))
    with pytest.raises(BadInput, match="DSA indexer's graphs"):
        runner.decode(TOKENS)


def _run(cpu, out, inputs):
    Scheduler([cpu]).compute(Graph.build(out), inputs=inputs)
    return out.get_data()


def test_lightning_indexer_kernel_is_relu_scores_weighted_by_head_plus_mask(cpu) -> None:
    """llama.cpp's unfused indexer (deepseek32.cpp without fused_lid): relu(k . q) per head, times the head's
    weight, summed over heads, plus the mask."""
    rng = np.random.default_rng(5)
    d, h, t, c = 8, 3, 2, 5
    q = B.new_input(GGMLType.F32, (d, h, t, 1), "q")
    k = B.new_input(GGMLType.F32, (d, 1, c, 1), "k")
    w = B.new_input(GGMLType.F32, (h, t, 1, 1), "w")
    mask = B.new_input(GGMLType.F16, (c, t, 1, 1), "mask")
    qv, kv, wv = rng.standard_normal((t, h, d)), rng.standard_normal((c, d)), rng.standard_normal((t, h))
    mv = np.array([[0, 0, -np.inf, -np.inf, -np.inf], [0, 0, 0, 0, -np.inf]])
    out = B._node(Op.LIGHTNING_INDEXER, (c, t, 1, 1), [q, k, w, mask], "score")
    got = _run(cpu, out, {q: qv.astype(np.float32), k: kv.astype(np.float32), w: wv.astype(np.float32),
                          mask: mv.astype(np.float16)})
    for ti in range(t):
        for ci in range(c):
            want = sum(max(float(kv[ci] @ qv[ti, hi]), 0.0) * wv[ti, hi] for hi in range(h)) + mv[ti, ci]
            assert got.reshape(t, c)[ti, ci] == pytest.approx(want, rel=1e-5, abs=1e-5)


def test_top_k_kernel_picks_each_rows_largest(cpu) -> None:
    x = B.new_input(GGMLType.F32, (5, 2), "x")
    out = B._node(Op.TOP_K, (2, 2), [x], "top", GGMLType.I32)
    got = _run(cpu, out, {x: np.array([[0.1, 3.0, -1.0, 2.0, 0.0], [5.0, 4.0, 6.0, -2.0, 1.0]], np.float32)})
    assert [sorted(row) for row in got.reshape(2, 2).tolist()] == [[1, 3], [0, 2]]


def test_norm_kernel_centres_and_scales_rows(cpu) -> None:
    x = B.new_input(GGMLType.F32, (4, 1), "x")
    out = B._node(Op.NORM, (4, 1), [x], "norm", eps=0.0)
    got = _run(cpu, out, {x: np.array([1.0, 2.0, 3.0, 6.0], np.float32)})
    mean, var = 3.0, (4 + 1 + 0 + 9) / 4
    np.testing.assert_allclose(got.reshape(-1), (np.array([1, 2, 3, 6]) - mean) / np.sqrt(var), rtol=1e-6)


# --- llama4: chunked attention, NoPE layers, Q/K L2 norms, experts weighted before the FFN ---------------

def llama4_tiny(n_expert: int, moe_step: int) -> ModelSpec:
    """8 layers (chunked, chunked, chunked, full/NoPE, ...), 128 wide, 4 heads / 2 KV of 32, one expert used of
    `n_expert` (128: Maverick's count, no Q/K norms), a MoE layer every `moe_step` blocks, llama3 rope factors."""
    spec = llama4_spec(n_layer=8, n_embd=128, n_head=4, n_head_kv=2, head_dim=32, n_ff=256, n_ff_exp=64,
                       n_expert=n_expert, n_expert_used=1, moe_step=moe_step, n_vocab=512, rope_freqs=True)
    add_tokenizer(spec, 512, n_merges=1)
    return spec


@pytest.fixture(scope="module")
def llama4_models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("llama4")
    out = {}
    for name, spec in (("scout", llama4_tiny(4, 1)), ("maverick", llama4_tiny(128, 2))):
        [out[name]] = spec.write(d / f"{name}.gguf")
    return out


# llama-fit-params -v on the tiny files: (graph nodes, CPU compute buffer MiB)
LLAMA_CPP_LLAMA4_RESERVE = {
    "scout": {"-c 256": (392, 0.96), "-c 256 -fa off": (432, 2.46), "-c 512 -np 2": (408, 1.92),
              "-c 256 -ctk q8_0 -ctv q8_0": (392, 0.96)},
    "maverick": {"-c 256": (316, 1.39), "-c 256 -fa off": (356, 2.45), "-c 512 -np 2": (332, 2.77),
                 "-c 256 -ctk q8_0 -ctv q8_0": (316, 1.39)},
}


@pytest.mark.parametrize("name, flags", [(n, f) for n, rows in LLAMA_CPP_LLAMA4_RESERVE.items() for f in rows])
def test_llama4_reserve_nodes_and_compute_buffer_equal_llama_cpp(name: str, flags: str,
                                                                 llama4_models: dict[str, Path]) -> None:
    assert_reserve_equals(llama4_models[name], flags, *LLAMA_CPP_LLAMA4_RESERVE[name][flags])


def test_llama4_decode_is_refused(llama4_models: dict[str, Path]) -> None:
    runner = ModelRunner.load(str(llama4_models["scout"]), parse_llama_flags(["-c", "256"]))
    with pytest.raises(BadInput, match="llama4's graphs"):
        runner.decode(TOKENS)
