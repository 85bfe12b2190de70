"""Layer split across a `&` list: contiguous ranges proportional to free memory minus 2 GiB."""
from __future__ import annotations

import pytest

from planner.core.units import GiB, MiB
from planner.sd.components import Component, SdTensor
from planner.sd.roles import Kind
from planner.sd.split import block_key, split_ranges


def component(kind, tensors):
    ts = tuple(SdTensor(n, b) for n, b in tensors)
    return Component(kind, sum(t.n_bytes for t in ts), max(t.n_bytes for t in ts), ts)


@pytest.mark.parametrize("name,key", [
    ("model.diffusion_model.transformer_blocks.12.attn.to_q.weight", (0, 12)),
    ("model.diffusion_model.joint_blocks.3.x_block.attn.qkv.weight", (1, 3)),
    ("model.diffusion_model.double_blocks.0.img_attn.qkv.weight", (2, 0)),
    ("model.diffusion_model.single_blocks.37.linear1.weight", (3, 37)),
    ("model.diffusion_model.blocks.5.self_attn.q.weight", (4, 5)),
    ("text_encoders.t5xxl.transformer.encoder.block.23.layer.0.SelfAttention.q.weight", (5, 23)),
    ("text_encoders.llm.model.layers.7.mlp.up_proj.weight", (6, 7)),
    ("model.diffusion_model.input_blocks.1.1.transformer_blocks.0.attn1.to_q.weight", None),  # UNet stage
    ("model.diffusion_model.myblocks.1.weight", None),  # not a path segment
    ("model.diffusion_model.layers.final.weight", None),  # no number
    ("model.diffusion_model.img_in.weight", None),
])
def test_block_key(name, key):
    assert block_key(name) == key


def test_flux_like_split_by_free_memory():
    blocks = [(f"model.diffusion_model.double_blocks.{i}.w", 100 * MiB) for i in range(4)]
    blocks += [(f"model.diffusion_model.single_blocks.{i}.w", 50 * MiB) for i in range(4)]
    dit = component(Kind.DIFFUSION, [("model.diffusion_model.img_in.weight", 10 * MiB), *blocks])
    r0, r1 = split_ranges(dit, ("CUDA0", "CUDA1"), {"CUDA0": 12 * GiB, "CUDA1": 6 * GiB})
    # weights 10 : 4 -> block b on CUDA0 while b/8 < 10/14, i.e. b <= 5: double 0-3 + single 0-1
    assert (r0.device, r0.first_block, r0.end_block) == ("CUDA0", 0, 6)
    assert (r1.device, r1.first_block, r1.end_block) == ("CUDA1", 6, 8)
    assert r0.block_bytes == 4 * 100 * MiB + 2 * 50 * MiB and r0.other_bytes == 10 * MiB
    assert r1.block_bytes == 2 * 50 * MiB and r1.other_bytes == 0


def test_three_devices_equal_split():
    dit = component(Kind.DIFFUSION, [(f"model.diffusion_model.blocks.{i}.w", MiB) for i in range(9)])
    got = split_ranges(dit, ("A", "B", "C"), {"A": 10 * GiB, "B": 10 * GiB, "C": 10 * GiB})
    assert [(r.first_block, r.end_block) for r in got] == [(0, 3), (3, 6), (6, 9)]


def test_unet_has_no_blocks_and_falls_back_to_the_first_device():
    unet = component(Kind.DIFFUSION, [("model.diffusion_model.input_blocks.1.0.in_layers.2.weight", MiB),
                                      ("model.diffusion_model.output_blocks.3.0.out.weight", MiB)])
    (only,) = split_ranges(unet, ("CUDA0", "CUDA1"), {"CUDA0": 8 * GiB, "CUDA1": 8 * GiB})
    assert only.device == "CUDA0" and only.total_bytes == 2 * MiB and only.n_blocks_total == 0


def test_te_splits_only_the_dominant_encoder():
    te = component(Kind.TE, [
        *[(f"text_encoders.clip_l.transformer.text_model.encoder.layers.{i}.w", MiB) for i in range(4)],
        *[(f"text_encoders.t5xxl.transformer.encoder.block.{i}.w", 10 * MiB) for i in range(4)],
    ])
    r0, r1 = split_ranges(te, ("CUDA0", "CUDA1"), {"CUDA0": 6 * GiB, "CUDA1": 6 * GiB})
    assert r0.n_blocks_total == 4  # the t5 blocks only
    assert (r0.first_block, r0.end_block, r1.first_block, r1.end_block) == (0, 2, 2, 4)
    assert r0.other_bytes == 4 * MiB and r0.block_bytes == r1.block_bytes == 20 * MiB


def test_vae_is_never_split():
    vae = component(Kind.VAE, [("first_stage_model.decoder.up.0.block.0.conv1.weight", MiB)])
    (only,) = split_ranges(vae, ("CUDA0", "CUDA1"), {"CUDA0": 8 * GiB, "CUDA1": 8 * GiB})
    assert only.device == "CUDA0" and only.block_bytes == 0


def test_devices_below_the_headroom_share_equally():
    dit = component(Kind.DIFFUSION, [(f"model.diffusion_model.blocks.{i}.w", MiB) for i in range(4)])
    r0, r1 = split_ranges(dit, ("A", "B"), {"A": GiB, "B": GiB})
    assert (r0.end_block, r1.first_block) == (2, 2)


def test_max_vram_caps_a_devices_share():
    dit = component(Kind.DIFFUSION, [(f"model.diffusion_model.blocks.{i}.w", MiB) for i in range(10)])
    free = {"A": 12 * GiB, "B": 12 * GiB}
    # B capped at 2.5 GiB: weights 10 : 2.5 -> b/10 < 0.8 on A -> 8 blocks on A
    r0, r1 = split_ranges(dit, ("A", "B"), free, {"A": 20 * GiB, "B": 2 * GiB + 512 * MiB})
    assert (r0.end_block, r1.first_block, r1.end_block) == (8, 8, 10)
