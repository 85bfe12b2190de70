"""gemma3n (runtime/engine/gemma3n.py) on tiny files (planner/synth/shapes_gemma4.py): its caches and its graph
against the pinned llama.cpp's figures on the very same files (llama-fit-params -v: "llama_kv_cache: size",
"graph: nodes = N", "CPU compute buffer size = X MiB")."""
from __future__ import annotations

from pathlib import Path

import pytest

from planner.core.units import MiB
from planner.memory.estimate import estimate
from planner.synth.shapes_gemma4 import tiny_gemma3n
from tests.support.reserve_checks import assert_reserve_equals


@pytest.fixture(scope="module")
def short(tmp_path_factory) -> Path:
    """Six blocks (sliding but the fifth), heads 2 x 64: every block owns its cache (the pin starts sharing at 20)."""
    [path] = tiny_gemma3n(n_layer=6, shared_kv=0).write(tmp_path_factory.mktemp("gemma3n") / "short.gguf")
    return path


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Path:
    """24 blocks; the file's shared_kv_layers says 10, the pin's loader fixes 20 cache-owning blocks anyway."""
    [path] = tiny_gemma3n(n_layer=24, shared_kv=10).write(tmp_path_factory.mktemp("gemma3n") / "shared.gguf")
    return path


def test_twenty_blocks_own_caches_whatever_the_key(shared: Path) -> None:
    """llama-fit-params -v -c 4096: 8.00 MiB (4096 cells, 4 layers) and 6.00 MiB (768 cells, 16 layers); by hand
    full blocks 4, 9, 14, 19: 4096 x 4 x 128 x 2 B x 2 = 8 MiB; the 16 sliding ones below 20: 768 x 16 x 512 B."""
    [host] = [d for d in estimate(str(shared), ["-c", "4096"]).devices if d.name == "Host"]
    assert host.context_bytes == 8 * MiB + 768 * 16 * 128 * 2 * 2


LLAMA_CPP_RESERVE = {
    ("short", "-c 4096"): (651, 17.27),
    ("short", "-c 4096 -fa off"): (681, 48.27),
    ("short", "-c 4096 -np 2 -ctk q8_0 -ctv q8_0"): (735, 15.34),
    ("short", "-c 2048 -ub 64 -np 3"): (663, 1.74),
    ("short", "-c 1024 -ub 32"): (651, 0.86),
    ("shared", "-c 4096"): (2263, 53.27),
    ("shared", "-c 4096 -fa off"): (2375, 59.02),
    ("shared", "-c 4096 -np 2 -ctk q8_0 -ctv q8_0"): (2567, 51.34),
    ("shared", "-c 2048 -ub 64 -np 3"): (2303, 6.38),
    ("shared", "-c 1024 -ub 32"): (2263, 3.11),
}


@pytest.mark.parametrize(("file", "flags"), list(LLAMA_CPP_RESERVE))
def test_reserve_nodes_and_compute_buffer_equal_llama_cpp(request, file: str, flags: str) -> None:
    assert_reserve_equals(request.getfixturevalue(file), flags, *LLAMA_CPP_RESERVE[(file, flags)])


def test_estimate_simulates_gemma3n(short: Path) -> None:
    assert estimate(str(short), ["-c", "4096"]).compute_model == "simulated"
