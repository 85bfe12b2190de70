"""gemma4 on tiny files (planner/synth/shapes_gemma4.py): its KV facts and its graph against the pinned
llama.cpp's own figures on the very same files.

Expected figures come from llama-fit-params -v on these files: "llama_kv_cache: size = X MiB (N cells,
L layers, ...)" per cache, "graph: nodes = N" and "CPU compute buffer size = X MiB".
"""
from __future__ import annotations

from pathlib import Path

import pytest

from planner.core.errors import BadInput
from planner.core.units import MiB
from planner.llama.context import model_context
from planner.llama.flags import parse_llama_flags
from planner.memory.estimate import estimate
from planner.model.arch import AttnKind
from planner.synth.shapes_gemma4 import tiny_gemma4
from runtime.engine.runner import ModelRunner
from tests.support.reserve_checks import assert_reserve_equals

# sliding, sliding, full, sliding, full | three blocks reusing caches: sliding ones layer 3's, full ones layer 4's
SWA = (True, True, False, True, False, True, False, True)
SHARED = 3


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> Path:
    """Sliding, sliding, full, sliding, full: sliding heads 2 x 32, full heads 1 x 64, every layer its own cache."""
    [path] = tiny_gemma4().write(tmp_path_factory.mktemp("gemma4") / "plain.gguf")
    return path


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> Path:
    """Heads of 64 (sliding, 2 KV) and 128 (full, 2 KV): quantized caches rotate (layer 0's head is a multiple
    of 64, each cache its own side) and -fa off pads the sliding layers' V rows to the full layers' 256."""
    [path] = tiny_gemma4(swa=SWA, shared_kv=SHARED, heads=(64, 2, 128, 2)).write(
        tmp_path_factory.mktemp("gemma4") / "wide.gguf")
    return path


@pytest.fixture(scope="module")
def moe(tmp_path_factory) -> Path:
    """The MoE block on every layer: 8 experts (2 used) beside the dense FFN, V from K on full layers."""
    [path] = tiny_gemma4(heads=(64, 2, 128, 1), k_eq_v=True, n_expert=8).write(
        tmp_path_factory.mktemp("gemma4") / "moe.gguf")
    return path


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Path:
    """Shared KV, per-layer embeddings, V from K on full layers, a double-wide MLP on the shared blocks."""
    spec = tiny_gemma4(swa=SWA, shared_kv=SHARED, n_embd_per_layer=32, k_eq_v=True, double_wide=True)
    [path] = spec.write(tmp_path_factory.mktemp("gemma4") / "shared.gguf")
    return path


def test_kv_facts_follow_the_flags_and_the_shared_layers(shared: Path) -> None:
    """load_arch_hparams: sliding layers from the per-layer array, their head size from key_length_swa;
    blocks from n_layer - shared_kv_layers on own no cache (llama-fit-params -v: "layer 5: filtered"...)."""
    facts = model_context(str(shared)).facts
    kinds = [lf.kind for lf in facts.layers]
    assert kinds == [AttnKind.SWA if s else AttnKind.FULL for s in SWA]
    assert [lf.has_kv for lf in facts.layers] == [True] * 5 + [False] * 3
    assert [(lf.k_per_cell, lf.window) for lf in facts.layers[:5]] == [(64, 64), (64, 64), (64, 0), (64, 64), (64, 0)]


# llama-fit-params -v on `shared`: (non-SWA cache MiB, SWA cache MiB) as "llama_kv_cache: size" prints them:
# -c 4096: 2.00 (4096 cells, 2 layers) and 0.56 (768 cells, 3 layers); -np 2 q8_0: 1.06 (2048 cells x 2 streams)
# and 0.60 (768 x 2). By hand: full layers 64 wide, f16 K+V: 4096 x 2 x 64 x 2 x 2 B = 2 MiB; sliding layers
# 768 x 3 x 64 x 2 x 2 B = 589824 B; q8_0 (34 B per 32): 2048 x 2 x 2 x 68 x 2 + 768 x 2 x 3 x 68 x 2.
CONTEXT = {
    "-c 4096": 2 * MiB + 589824,
    "-c 4096 -fa off": 2 * MiB + 589824,
    "-c 4096 -np 2 -ctk q8_0 -ctv q8_0": 2048 * 2 * 2 * 68 * 2 + 768 * 2 * 3 * 68 * 2,
}


@pytest.mark.parametrize("flags", list(CONTEXT))
def test_context_equals_llama_cpp_caches(shared: Path, flags: str) -> None:
    est = estimate(str(shared), flags.split())
    [host] = [d for d in est.devices if d.name == "Host"]
    assert host.context_bytes == CONTEXT[flags]


# llama-fit-params -v on each file: "graph: nodes = N" and "CPU compute buffer size = X MiB"
LLAMA_CPP_RESERVE = {
    ("plain", "-c 4096"): (214, 7.02),
    ("plain", "-c 4096 -fa off"): (239, 43.76),
    ("plain", "-c 4096 -np 2 -ctk q8_0 -ctv q8_0"): (224, 5.02),
    ("plain", "-c 2048 -ub 64 -np 3"): (224, 0.42),
    ("shared", "-c 4096"): (375, 9.09),
    ("shared", "-c 4096 -fa off"): (409, 44.33),
    ("shared", "-c 4096 -np 2 -ctk q8_0 -ctv q8_0"): (385, 7.09),
    ("shared", "-c 2048 -ub 64 -np 3"): (385, 0.69),
    ("wide", "-c 4096"): (301, 8.02),
    ("wide", "-c 4096 -fa off"): (338, 46.26),
    ("wide", "-c 4096 -fa off -np 2"): (343, 26.26),
    ("wide", "-c 4096 -np 2 -ctk q8_0 -ctv q8_0"): (389, 6.13),
    ("wide", "-c 4096 -ctk q4_0 -ctv q8_0"): (379, 8.13),
    ("moe", "-c 4096"): (387, 7.52),
    ("moe", "-c 4096 -fa off"): (412, 45.26),
    ("moe", "-c 4096 -np 2 -ctk q8_0 -ctv q8_0"): (457, 5.63),
    ("moe", "-c 1024 -ub 32"): (387, 0.25),
}


@pytest.mark.parametrize(("file", "flags"), list(LLAMA_CPP_RESERVE))
def test_reserve_nodes_and_compute_buffer_equal_llama_cpp(request, file: str, flags: str) -> None:
    assert_reserve_equals(request.getfixturevalue(file), flags, *LLAMA_CPP_RESERVE[(file, flags)])


def test_estimate_simulates_gemma4(shared: Path) -> None:
    assert estimate(str(shared), ["-c", "4096"]).compute_model == "simulated"


def test_decode_is_refused(plain: Path) -> None:
    runner = ModelRunner.load(str(plain), parse_llama_flags(["-c", "256"]), weights=False)
    with pytest.raises(BadInput, match="does not run"):
        runner.decode([1, 2])
