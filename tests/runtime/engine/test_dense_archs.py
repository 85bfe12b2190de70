"""The llama-like dense architectures on the one decoder builder (runtime/engine/hparams.py ARCHS rows,
their "dense" facts): tiny files of each (planner/synth/shapes_dense.tiny_spec) against llama.cpp.

Expected figures come from the pinned llama.cpp on these very files: llama-fit-params -v ("graph: nodes
= N" and "CPU compute buffer size = X MiB"); the peer test re-checks every node's op, shape and strides
against fitplan-dump-nodes (4 tokens at -c 256).
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from gguf import Keys

from planner.gguf.reader import read_model
from planner.llama.flags import parse_llama_flags
from planner.memory.estimate import estimate
from planner.model.arch import AttnKind, model_facts
from planner.synth.shapes_dense import tiny_spec
from runtime.engine.builder import BatchShape
from runtime.engine.runner import ModelRunner
from tests.support.nodes import node_shapes
from tests.support.reserve_checks import assert_reserve_equals

# name -> (architecture, layers, extra keys)
TINY = {
    "mistral3": ("mistral3", 2, {}),
    # Ministral-3-like: an attention temperature (inp_attn_scale) over YaRN
    "mistral3-temp": ("mistral3", 2, {Keys.Attention.TEMPERATURE_SCALE: 0.1, Keys.Rope.SCALING_TYPE: "yarn",
                                      Keys.Rope.SCALING_FACTOR: 16.0, Keys.Rope.SCALING_ORIG_CTX_LEN: 8192}),
    "internlm2": ("internlm2", 2, {}),
    "ernie4_5": ("ernie4_5", 2, {}),
    "seed_oss": ("seed_oss", 2, {}),
    "smollm3": ("smollm3", 4, {}),   # layer 3 without RoPE
    "granite": ("granite", 4, {Keys.LLM.EMBEDDING_SCALE: 12.0, Keys.LLM.RESIDUAL_SCALE: 0.22,
                               Keys.Attention.SCALE: 0.0078125, Keys.LLM.LOGIT_SCALE: 16.0}),
    "arcee": ("arcee", 4, {}),
    "apertus": ("apertus", 4, {}),
    "olmo2": ("olmo2", 4, {}),
    "olmo2-swa": ("olmo2", 4, {Keys.Attention.SLIDING_WINDOW: 64}),   # OLMo 3: three sliding layers in four
    "exaone4": ("exaone4", 4, {}),
    "exaone4-swa": ("exaone4", 64, {}),   # 64 layers: three sliding layers, then one global without RoPE
    "hunyuan-dense": ("hunyuan-dense", 4, {}),
    "glm4": ("glm4", 4, {}),
}

FLAGS = ("-c 256", "-c 256 -fa off", "-c 512 -np 3 -ub 64")
# llama-fit-params -v on each tiny file, per FLAGS: (graph nodes, CPU compute buffer MiB)
LLAMA_CPP_RESERVE: dict[str, tuple[tuple[int, float], ...]] = {
    "mistral3": ((68, 1.13), (78, 2.00), (72, 0.29)),
    "mistral3-temp": ((70, 1.13), (80, 2.01), (74, 0.29)),
    "internlm2": ((68, 1.13), (78, 2.00), (72, 0.29)),
    "ernie4_5": ((68, 1.13), (78, 2.00), (72, 0.29)),
    "seed_oss": ((74, 1.13), (84, 2.00), (78, 0.29)),
    "smollm3": ((128, 1.26), (148, 2.00), (136, 0.32)),
    "granite": ((140, 1.26), (160, 2.00), (148, 0.32)),
    "arcee": ((130, 0.88), (150, 2.00), (138, 0.23)),
    "apertus": ((142, 0.88), (162, 2.00), (150, 0.23)),
    "olmo2": ((146, 1.13), (166, 1.88), (154, 0.29)),
    "olmo2-swa": ((146, 1.26), (166, 2.26), (154, 0.33)),
    "exaone4": ((146, 1.13), (166, 1.88), (154, 0.29)),
    "exaone4-swa": ((2214, 1.26), (2534, 2.26), (2342, 0.33)),
    "hunyuan-dense": ((146, 1.26), (166, 2.00), (154, 0.32)),
    "glm4": ((154, 1.26), (174, 2.00), (162, 0.32)),
}
CASES = [(name, i) for name in TINY for i in range(len(FLAGS))]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("dense")
    out = {}
    for name, (arch, n_layer, extra) in TINY.items():
        [out[name]] = tiny_spec(arch, n_layer, extra).write(d / f"{name}.gguf")
    return out


@pytest.mark.parametrize("name, i", CASES, ids=[f"{n}: {FLAGS[i]}" for n, i in CASES])
def test_reserve_nodes_and_compute_buffer_equal_llama_cpp(models: dict[str, Path], name: str, i: int) -> None:
    assert_reserve_equals(models[name], FLAGS[i], *LLAMA_CPP_RESERVE[name][i])


@pytest.mark.parametrize("name", list(TINY))
def test_estimate_simulates_the_dense_architectures(models: dict[str, Path], name: str) -> None:
    assert estimate(str(models[name]), ["-c", "256"]).compute_model == "simulated"


def test_exaone4_slides_only_at_64_layers(tmp_path: Path) -> None:
    """exaone4's load_arch_hparams sets SWA (window 4096, three sliding layers in four) for a 64-layer model
    only; any other size is full attention whatever its sliding_window key says."""
    [small] = tiny_spec("exaone4", 4, {Keys.Attention.SLIDING_WINDOW: 128}).write(tmp_path / "small.gguf")
    assert {lf.kind for lf in model_facts(read_model(str(small))).layers} == {AttnKind.FULL}
    [big] = tiny_spec("exaone4", 64).write(tmp_path / "big.gguf")
    layers = model_facts(read_model(str(big))).layers
    assert [lf.kind for lf in layers[:4]] == [AttnKind.SWA] * 3 + [AttnKind.FULL]
    assert {lf.window for lf in layers if lf.kind is AttnKind.SWA} == {4096}


# --- against llama.cpp itself ------------------------------------------------------------------------

# fitplan-dump-nodes prints a UNARY or GLU node as its kind (ggml_op_desc); the runtime keeps it in op_params
DUMP_KINDS = {"SILU": "UNARY", "RELU": "UNARY", "XIELU": "UNARY", "SWIGLU": "GLU"}


@pytest.mark.peer
@pytest.mark.parametrize("name", list(TINY))
def test_every_node_equals_llama_cpp(llama_tools: Path, models: dict[str, Path], tmp_path: Path, name: str) -> None:
    subprocess.run([str(llama_tools / "fitplan-dump-nodes"), str(models[name]), str(tmp_path), "256", "4",
                    "1", "2", "3", "4"], check=True, capture_output=True, timeout=300)
    runner = ModelRunner.load(str(models[name]), parse_llama_flags(["-c", "256"]), weights=False, reserve=False)
    assert runner.kv is not None
    full = tuple((k, runner.kv.tables[k].size) for k in runner.kv.kind_order())
    ours = [(n.op.value, tuple(n.ne), tuple(n.nb)) for n in runner._graph(BatchShape(4, 1, full)).graph.nodes]
    assert node_shapes(tmp_path / "step0.bin", DUMP_KINDS) == ours
