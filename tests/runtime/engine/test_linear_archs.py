"""The linear-attention hybrids' graph builders on tiny files: the reserve's node count and CPU compute
buffer against llama-fit-params -v on the very same file (pinned build; "graph: nodes = N" and "CPU
compute buffer size = X MiB", two decimals), each file as planner/synth/shapes_linear.py writes it.

- kimi-linear (runtime/engine/kimi.py): 4 layers (KDA x 3, MLA), 128 wide, 4 heads; KDA heads of 32,
  conv 4; MLA kv_lora_rank 64, qk_nope 32 + qk_rope 32, v 32; a SwiGLU FFN of 256 in layer 0, 8
  sigmoid-routed experts (2 used) of 64 with a shared expert in the others.
- bailingmoe3 (runtime/engine/kimi.py BailingMoe3Builder): the same sizes with full-rank KDA gates and
  gated MLA with RoPE (gate_lower_bound -5, experts' weights normalised); "bailingmoe3-qlora": 6 layers
  (KDA x 3, MLA, then the two tail layers past the last whole group of 4, MLA) and a query LoRA of 64.
- kimi-k3 (runtime/engine/kimi_k3.py): kimi-linear's sizes with a full-rank KDA output gate, the safe
  decay gate (lower bound -5), gated RoPE-less MLA, situ FFNs (betas 2 and 3), experts in a 64-wide latent
  space and attention residuals banked every 2 layers; "kimi-k3-qlora": 6 layers (MLA at 3 and 5), a
  query LoRA of 64, kimi-linear's softplus decay (no lower bound), situ_linear_beta 0 and a bank every 3.

The recurrent states are sized as llama_hparams::n_embd_r / n_embd_s state them for KDA layers.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from gguf import Keys

from planner.gguf.reader import read_model
from planner.llama.flags import parse_llama_flags
from planner.model.arch import AttnKind, model_facts
from planner.synth.gguf_factory import ModelSpec, add_tokenizer
from planner.synth.shapes_linear import bailingmoe3_layout, kimi_k3_layout, kimi_linear_layout
from runtime.engine.runner import ModelRunner
from tests.support.reserve_checks import MIB, assert_reserve_equals


def _tokenized(spec: ModelSpec) -> ModelSpec:
    add_tokenizer(spec, 512, n_merges=1)
    spec.metadata[Keys.Tokenizer.PRE] = "default"
    return spec


TINY: dict[str, Callable[[], ModelSpec]] = {
    "kimi-linear": lambda: _tokenized(kimi_linear_layout()),
    "bailingmoe3": lambda: _tokenized(bailingmoe3_layout()),
    "bailingmoe3-qlora": lambda: _tokenized(bailingmoe3_layout(n_layer=6, q_lora=64)),
    "kimi-k3": lambda: _tokenized(kimi_k3_layout()),
    "kimi-k3-qlora": lambda: _tokenized(kimi_k3_layout(n_layer=6, mla_layers=(3, 5), q_lora=64,
                                                       gate_lower_bound=None, res_block=3, situ_linear_beta=0.0)),
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
    "bailingmoe3": {
        "-c 256": (405, 1.53),
        "-c 256 -fa off": (407, 2.65),
        "-c 256 -np 2": (406, 1.53),
        "-c 512 -np 3 -ub 64": (406, 0.49),
        "-c 256 -ctk q8_0 -ctv q8_0": (405, 1.53),
        "-c 256 -ub 32": (405, 0.21),
        "-c 256 -fa off -np 2": (408, 2.65),
    },
    "bailingmoe3-qlora": {
        "-c 256": (554, 1.40),
        "-c 256 -fa off": (560, 2.06),
        "-c 256 -np 2": (557, 1.43),
        "-c 512 -np 3 -ub 64": (557, 0.49),
        "-c 256 -ctk q8_0 -ctv q8_0": (554, 1.40),
        "-c 256 -ub 32": (554, 0.21),
        "-c 256 -fa off -np 2": (563, 2.09),
    },
    "kimi-k3": {
        "-c 256": (609, 1.88),
        "-c 256 -fa off": (611, 3.00),
        "-c 256 -np 2": (610, 1.88),
        "-c 512 -np 3 -ub 64": (610, 0.46),
        "-c 256 -ctk q8_0 -ctv q8_0": (609, 1.88),
        "-c 256 -ub 32": (609, 0.23),
        "-c 256 -fa off -np 2": (612, 3.00),
    },
    "kimi-k3-qlora": {
        "-c 256": (864, 1.75),
        "-c 256 -fa off": (868, 2.88),
        "-c 256 -np 2": (866, 1.75),
        "-c 512 -np 3 -ub 64": (866, 0.49),
        "-c 256 -ctk q8_0 -ctv q8_0": (864, 1.75),
        "-c 256 -ub 32": (864, 0.22),
        "-c 256 -fa off -np 2": (870, 2.88),
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


def test_bailingmoe3_layers_and_state_sizes(tiny_files: dict[str, Path]) -> None:
    """conversion/bailingmoe3.py's is_full_attention: every 4th layer and the tail past the last whole group
    attend (head_count_kv 1); the KDA layers hold kimi-linear's states (llama-fit-params -v on the 6-layer
    file: "llama_kv_cache: ... 3 layers" and "llama_memory_recurrent: layer 3/4/5: skipped")."""
    facts = model_facts(read_model(tiny_files["bailingmoe3-qlora"]))
    assert [lf.kind is AttnKind.RECURRENT for lf in facts.layers] == [True, True, True, False, False, False]
    assert {(lf.state_r, lf.state_s) for lf in facts.layers if lf.state_s} == {(3 * 3 * 4 * 32, 32 * 32 * 4)}


# llama-server -v on the tiny kimi-linear file (n_outputs_max = -np): "CPU compute buffer size is X MiB,
# matches expectation", four decimals
LLAMA_SERVER_COMPUTE: dict[str, float] = {
    "-c 1024 -np 4": 3.0528,
    "-c 1024 -np 4 -fa off": 5.3028,
    "-c 2048 -np 2 -ub 256": 1.9014,
}


@pytest.mark.parametrize("flags", list(LLAMA_SERVER_COMPUTE))
def test_kimi_linear_real_load_equals_llama_server(flags: str, tiny_files: dict[str, Path]) -> None:
    """A real load's reserve (ModelRunner.reserve(dry_run=False): prompt, token, prompt again, the buffers
    grown to the largest) equals llama-server's. sched_reserve reserves kimi-linear's second prompt graph
    with one sequence (TAG_RESERVE_DIAG_DECAY, llama-context.cpp) where the runtime reserves -np again; on
    these files that graph is not the largest (the fused GATED_DELTA_NET has no n_seq_tokens^2 decay
    input), so the buffers agree to the byte."""
    parsed = parse_llama_flags(flags.split())
    runner = ModelRunner.load(str(tiny_files["kimi-linear"]), parsed, weights=False, reserve=False,
                              n_outputs_max=parsed.n_parallel)
    assert round(runner.reserve(dry_run=False).compute_bytes["CPU"] / MIB, 4) == LLAMA_SERVER_COMPUTE[flags]
