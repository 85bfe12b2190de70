"""The hybrid recurrent architectures' graph builders on tiny files: the reserve's node count and CPU
compute buffer against llama-fit-params -v on the very same file (pinned build; "graph: nodes = N" and
"CPU compute buffer size = X MiB", two decimals), each file as planner/synth writes it below.

- qwen35 / qwen35moe (runtime/engine/qwen35.py): 4 layers (DeltaNet x 3, gated attention), 128 wide;
  DeltaNet 2 key / 4 value heads of 32, conv 4; attention 4 heads / 2 KV of 64, 16 roped dimensions in
  M-RoPE sections 3/3/2; qwen35 a SwiGLU FFN of 256, qwen35moe 8 experts (2 used) of 64 and a shared
  expert of 64; "-mtp" the same with the MTP block the converter appends (llama.cpp skips it: same graph).
- nemotron_h / nemotron_h_moe (runtime/engine/nemotronh.py): 5 blocks "M*-M-" / "M*EME" (Mamba-2 of 8
  heads over d_inner 256, 2 groups, state 16, conv 4; RoPE-less attention 4 heads / 2 KV of 32; relu^2
  MLP of 256; 8 relu^2 experts, 2 used, of 64 with a shared expert of 128, weights normalised and
  scaled by 2.5), 128 wide.
- lfm2moe (runtime/engine/lfm2.py): lfm2's 4 blocks (short convolution x 2, attention 4 heads / 2 KV of
  32, short convolution), 128 wide, a SwiGLU FFN of 256 in block 0 and 8 sigmoid-routed SwiGLU experts
  (2 used, weights normalised) of 64 in the others.
- mamba2 (runtime/engine/mamba.py): gguf_factory's mamba2_spec, 2 Mamba-2 blocks of 8 heads over d_inner
  256, 2 groups, state 16, conv 4, 128 wide, tied output.
- mamba (runtime/engine/mamba.py): 2 Mamba-1 blocks, 128 wide, d_inner 256, state 16, conv 4, dt_rank 32,
  with ssm.dt_b_c_rms (Falcon-Mamba's weightless dt/B/C norms) and without.
- falcon-h1 (runtime/engine/falconh1.py): 3 blocks, 128 wide, each with attention (4 heads / 2 KV of 32)
  beside a Mamba-2 mixer (8 heads over d_inner 256, 1 group, state 16, conv 4) and a SwiGLU FFN of 256.
- jamba (runtime/engine/jamba.py): 4 layers (Mamba-1, attention 4 heads / 2 KV of 32, Mamba-1, Mamba-1),
  128 wide, Mamba-1 d_inner 256, state 16, conv 4, dt_rank 32; 4 softmax-routed experts (2 used) of 256 in
  layers 1 and 3, a SwiGLU FFN of 256 in the others.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from gguf import Keys

from planner.hardware.inventory import Backend, DeviceKind, DeviceSpec, HostSpec, Inventory
from planner.llama.context import model_context
from planner.llama.flags import parse_llama_flags
from planner.llama.settings import resolve_settings
from planner.synth.gguf_factory import ModelSpec, add_tokenizer, mamba2_spec
from planner.synth.hybrid_factory import falcon_h1_spec, jamba_spec, lfm2moe_spec, mamba_layout, nemotron_h_spec
from planner.synth.qwen3next_factory import qwen35_spec
from runtime.engine.probe import flash_attn_mismatches
from tests.support.reserve_checks import assert_reserve_equals


def _tokenized(spec: ModelSpec) -> ModelSpec:
    add_tokenizer(spec, 512, n_merges=1)
    spec.metadata[Keys.Tokenizer.PRE] = "default"
    return spec


TINY: dict[str, Callable[[], ModelSpec]] = {
    "qwen35": lambda: _tokenized(qwen35_spec(moe=False)),
    "qwen35moe": lambda: _tokenized(qwen35_spec(moe=True)),
    "qwen35-mtp": lambda: _tokenized(qwen35_spec(moe=False, n_mtp=1)),
    "qwen35moe-mtp": lambda: _tokenized(qwen35_spec(moe=True, n_mtp=1)),
    "nemotron_h": lambda: _tokenized(nemotron_h_spec(pattern="M*-M-")),
    "nemotron_h_moe": lambda: _tokenized(nemotron_h_spec(pattern="M*EME")),
    "lfm2moe": lambda: _tokenized(lfm2moe_spec()),
    "mamba2": lambda: _tokenized(mamba2_spec()),
    "mamba": lambda: _tokenized(mamba_layout(dt_b_c_rms=True)),
    "mamba-plain": lambda: _tokenized(mamba_layout(dt_b_c_rms=False)),
    "falcon-h1": lambda: _tokenized(falcon_h1_spec()),
    "jamba": lambda: _tokenized(jamba_spec(dt_rank=32)),
}

# llama-fit-params -v on each tiny file: (nodes, CPU compute buffer MiB)
LLAMA_CPP_RESERVE: dict[str, dict[str, tuple[int, float]]] = {
    "qwen35": {
        "-c 256": (241, 1.51),
        "-c 256 -fa off": (246, 2.63),
        "-c 256 -np 2": (243, 1.51),
        "-c 512 -np 3 -ub 64": (243, 0.42),
        "-c 256 -ctk q8_0 -ctv q8_0": (253, 1.54),
    },
    "qwen35moe": {
        "-c 256": (337, 1.65),
        "-c 256 -fa off": (342, 2.77),
        "-c 256 -np 2": (339, 1.65),
        "-c 512 -np 3 -ub 64": (339, 0.45),
        "-c 256 -ctk q8_0 -ctv q8_0": (349, 1.68),
    },
    "qwen35-mtp": {"-c 256": (241, 1.51), "-c 256 -np 2": (243, 1.51)},
    "qwen35moe-mtp": {"-c 256": (337, 1.65), "-c 256 -np 2": (339, 1.65)},
    "nemotron_h": {
        "-c 256": (143, 1.96),
        "-c 256 -fa off": (148, 2.21),
        "-c 256 -np 2": (145, 1.97),
        "-c 512 -np 3 -ub 64": (145, 0.57),
        "-c 256 -ub 32": (143, 0.27),
    },
    "nemotron_h_moe": {
        "-c 256": (189, 1.96),
        "-c 256 -fa off": (194, 2.21),
        "-c 256 -np 2": (191, 1.97),
        "-c 512 -np 3 -ub 64": (191, 0.57),
        "-c 256 -ub 32": (189, 0.27),
    },
    "lfm2moe": {
        "-c 256": (193, 1.26),
        "-c 256 -fa off": (198, 2.00),
        "-c 256 -np 2": (195, 1.26),
        "-c 512 -np 3 -ub 64": (195, 0.33),
        "-c 256 -ctk q8_0 -ctv q8_0": (193, 1.26),
    },
    "mamba2": {
        "-c 256": (108, 1.83),
        "-c 256 -np 2": (108, 1.84),
        "-c 512 -np 3 -ub 64": (108, 0.54),
        "-c 256 -ub 32": (108, 0.25),
    },
    "mamba": {
        "-c 256": (110, 1.65),
        "-c 256 -np 2": (110, 1.67),
        "-c 512 -np 3 -ub 64": (110, 0.48),
        "-c 256 -ub 32": (110, 0.22),
    },
    "mamba-plain": {
        "-c 256": (106, 1.65),
        "-c 256 -np 2": (106, 1.67),
        "-c 512 -np 3 -ub 64": (106, 0.48),
        "-c 256 -ub 32": (106, 0.22),
    },
    "falcon-h1": {
        "-c 256": (250, 2.11),
        "-c 256 -fa off": (265, 2.23),
        "-c 256 -np 2": (256, 2.12),
        "-c 512 -np 3 -ub 64": (256, 0.60),
        "-c 256 -ctk q8_0 -ctv q8_0": (250, 2.11),
    },
    "jamba": {
        "-c 256": (242, 1.89),
        "-c 256 -fa off": (247, 2.13),
        "-c 256 -np 2": (244, 1.89),
        "-c 512 -np 3 -ub 64": (244, 0.52),
        "-c 256 -ctk q8_0 -ctv q8_0": (242, 1.89),
    },
}


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hybrid")
    return {arch: make().write(root / f"{arch}.gguf")[0] for arch, make in TINY.items()}


@pytest.mark.parametrize(("arch", "flags"), [(a, f) for a, rows in LLAMA_CPP_RESERVE.items() for f in rows])
def test_reserve_nodes_and_compute_buffer_equal_llama_cpp(arch: str, flags: str, tiny_files: dict[str, Path]) -> None:
    assert_reserve_equals(tiny_files[arch], flags, *LLAMA_CPP_RESERVE[arch][flags])


def _rpc_inventory() -> Inventory:
    rpcs = tuple(DeviceSpec(f"RPC{i}", DeviceKind.GPU, Backend.RPC, 1 << 30, 1 << 30, 0, 0, 0) for i in range(2))
    return Inventory(rpcs, HostSpec(1 << 34, 1 << 34, 0, "test"))


# A host attention layer followed by a device's recurrent layer: Granite-4.0-H's graph pulls the attention
# core onto that device (and -fa auto turns off); these graphs keep it on the layer's device, as
# llama-fit-params shows on their shape-faithful files (flash attention stays on; the peer matrix's
# boundary rows) and the runtime's replay of llama.cpp's probe finds.
@pytest.mark.parametrize(("make", "flags", "il"), [
    (lambda: qwen35_spec(moe=False, interval=2), "-ngl 3 -ts 1,1", 1),   # layer 1 attends on the host
    (lambda: qwen35_spec(moe=True, interval=2), "-ngl 3 -ts 1,1", 1),
    (lambda: lfm2moe_spec(), "-ngl 2 -ts 1,1", 2),                        # layer 2 attends on the host
])
def test_attention_stays_on_its_layers_device(make: Callable[[], ModelSpec], flags: str, il: int,
                                              tmp_path: Path) -> None:
    [path] = _tokenized(make()).write(tmp_path / "m.gguf")
    settings = resolve_settings(model_context(str(path)), parse_llama_flags(["-c", "256", *flags.split()]),
                                _rpc_inventory())
    devices = settings.placement.layer_device
    assert devices[il] == "CPU" and devices[il + 1] != "CPU"
    assert flash_attn_mismatches(settings) == {}
    assert dict(settings.pulled) == {}
    assert settings.cparams.flash_attn


@pytest.mark.parametrize("flags", ["-ts 1,1 -nkvo", "-ts 3,1 -ngl 2 -nkvo", "-ts 1,1"])
def test_falcon_h1_attention_follows_its_states_to_the_host_under_nkvo(flags: str, tmp_path: Path) -> None:
    """A falcon-h1 block attends and recurs: with -nkvo its states are on the CPU and llama.cpp's probe finds
    its fused attention there ("layer 0 is assigned to device RPC0 but Flash Attention is assigned to
    device CPU"), so -fa auto turns off; with the states on the layer's device it stays on."""
    [path] = _tokenized(falcon_h1_spec()).write(tmp_path / "m.gguf")
    settings = resolve_settings(model_context(str(path)), parse_llama_flags(["-c", "256", *flags.split()]),
                                _rpc_inventory())
    offloaded = {il: "CPU" for il, dev in enumerate(settings.placement.layer_device[:3]) if dev != "CPU"}
    expected = offloaded if "-nkvo" in flags else {}
    assert dict(settings.pulled) == flash_attn_mismatches(settings) == expected
    assert settings.cparams.flash_attn is not bool(expected)


@pytest.mark.parametrize(("pattern", "flags", "expected"), [
    ("M*-M-", "-ts 1,1 -nkvo", {1: "CPU"}),   # the offloaded attention block follows the host's states
    ("M*-M-", "-ts 1,1 -ngl 3", {1: "RPC0"}),  # blocks 0-2 on the host, 3 (Mamba-2) on RPC0: the MLP passes it on
    ("M*EME", "-ts 1,1 -nkvo", {}),           # an expert block after the attention block: nothing moves
])
def test_nemotron_h_attention_pulled_across_mlp_blocks(pattern: str, flags: str, expected: dict[int, str],
                                                      tmp_path: Path) -> None:
    """planner.llama.settings.pulled_attention on nemotron_h (FFN_BLOCKS_PASS_THROUGH) against the runtime's
    replay of llama.cpp's flash-attention probe; llama-fit-params agrees on the Nemotron-Nano-9B-v2 shape
    (peer matrix rows -nkvo and -ngl 41)."""
    [path] = _tokenized(nemotron_h_spec(pattern=pattern)).write(tmp_path / "m.gguf")
    settings = resolve_settings(model_context(str(path)), parse_llama_flags(["-c", "256", *flags.split()]),
                                _rpc_inventory())
    assert dict(settings.pulled) == flash_attn_mismatches(settings) == expected
