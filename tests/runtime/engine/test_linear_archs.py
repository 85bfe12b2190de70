"""The linear-attention hybrids' graph builders on tiny files: the reserve's node count and CPU compute
buffer against llama-fit-params -v on the very same file (pinned build; "graph: nodes = N" and "CPU
compute buffer size = X MiB", two decimals), each file as planner/synth/shapes_linear.py writes it.

- kimi-linear (runtime/engine/kimi.py): 4 layers (KDA x 3, MLA), 128 wide, 4 heads; KDA heads of 32,
  conv 4; MLA kv_lora_rank 64, qk_nope 32 + qk_rope 32, v 32; a SwiGLU FFN of 256 in layer 0, 8
  sigmoid-routed experts (2 used) of 64 with a shared expert in the others.

The recurrent states are sized as llama_hparams::n_embd_r / n_embd_s state them for KDA layers.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from gguf import Keys

from planner.gguf.reader import read_model
from planner.model.arch import AttnKind, model_facts
from planner.synth.gguf_factory import ModelSpec, add_tokenizer
from planner.synth.shapes_linear import kimi_linear_layout
from tests.support.reserve_checks import assert_reserve_equals


def _tokenized(spec: ModelSpec) -> ModelSpec:
    add_tokenizer(spec, 512, n_merges=1)
    spec.metadata[Keys.Tokenizer.PRE] = "default"
    return spec


TINY: dict[str, Callable[[], ModelSpec]] = {
    "kimi-linear": lambda: _tokenized(kimi_linear_layout()),
}

# llama-fit-params -v on each tiny file: (nodes, CPU compute buffer MiB)
LLAMA_CPP_RESERVE: dict[str, dict[str, tuple[int, float]]] = {
    "kimi-linear": {
        "-c 256": (407, 1.53),
        "-c 256 -fa off": (409, 2.65),
        "-c 256 -np 2": (408, 1.53),
        "-c 512 -np 3 -ub 64": (408, 0.45),
        "-c 256 -ctk q8_0 -ctv q8_0": (407, 1.53),
        "-c 256 -ub 32": (407, 0.20),
        "-c 256 -fa off -np 2": (410, 2.65),
    },
}


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("linear")
    return {arch: make().write(root / f"{arch}.gguf")[0] for arch, make in TINY.items()}


@pytest.mark.parametrize(("arch", "flags"), [(a, f) for a, rows in LLAMA_CPP_RESERVE.items() for f in rows])
def test_reserve_nodes_and_compute_buffer_equal_llama_cpp(arch: str, flags: str, tiny_files: dict[str, Path]) -> None:
    assert_reserve_equals(tiny_files[arch], flags, *LLAMA_CPP_RESERVE[arch][flags])


def test_kimi_linear_state_sizes(tiny_files: dict[str, Path]) -> None:
    """llama_hparams::n_embd_r = 3 (d_conv - 1) n_head kda_head, n_embd_s = kda_head^2 n_head on the KDA
    layers; the MLA layer holds one K head of kv_lora_rank + n_rot per cell and no V (llama-fit-params
    -v: "llama_kv_cache: ... K (f16): 0.05 MiB, V (f16): 0.00 MiB" at -c 256, 1 layer)."""
    facts = model_facts(read_model(tiny_files["kimi-linear"]))
    kda = [lf for lf in facts.layers if lf.kind is AttnKind.RECURRENT]
    assert [lf.index for lf in kda] == [0, 1, 2]
    assert {(lf.state_r, lf.state_s) for lf in kda} == {(3 * 3 * 4 * 32, 32 * 32 * 4)}
    mla = facts.layers[3]
    assert (mla.k_per_cell, mla.v_per_cell, mla.state_r) == (64 + 32, 0, 0)
