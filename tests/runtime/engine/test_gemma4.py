"""gemma4 on tiny files (planner/synth/shapes_gemma4.py): its KV facts and its graph against the pinned
llama.cpp's own figures on the very same files.

Expected figures come from llama-fit-params -v on these files: "llama_kv_cache: size = X MiB (N cells,
L layers, ...)" per cache, "graph: nodes = N" and "CPU compute buffer size = X MiB".
"""
from __future__ import annotations

from pathlib import Path

import pytest

from planner.core.units import MiB
from planner.llama.context import model_context
from planner.memory.estimate import estimate
from planner.model.arch import AttnKind
from planner.synth.shapes_gemma4 import tiny_gemma4

# sliding, sliding, full, sliding, full | three blocks reusing caches: sliding ones layer 3's, full ones layer 4's
SWA = (True, True, False, True, False, True, False, True)
SHARED = 3


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
