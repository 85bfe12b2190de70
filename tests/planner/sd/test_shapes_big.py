"""The two large checkpoints beside their smaller variants: SD3.5 large (planner/synth/shapes_sd3.py)
and Wan2.1-T2V-14B (planner/synth/shapes_wan.py). Their layouts worked out by hand from the published
configs, the families sd-fit recognises them as (and does not confuse with medium / 1.3B), and the
params buffers sd-fit sizes equal sd-cli's "total params memory size" figures in the corpus."""
from __future__ import annotations

import json

from planner.sd.components import read_components
from planner.sd.family import family
from planner.sd.roles import FileRole, Kind, ModelSource
from planner.sd.sd_compute import CORPUS
from planner.synth.shapes_sd3 import sd35_large_mmdit_tensors, write_sd3, write_sd35_large
from planner.synth.shapes_wan import wan14b_dit_tensors, wan_dit_tensors, write_wan

MiB = 1 << 20
ROLES = {"-m": FileRole.MODEL, "--clip_l": FileRole.CLIP_L, "--clip_g": FileRole.CLIP_G, "--t5xxl": FileRole.T5XXL,
         "--diffusion-model": FileRole.DIFFUSION_MODEL, "--vae": FileRole.VAE}
COMPONENT = {"diffusion_model": Kind.DIFFUSION, "text_encoders": Kind.TE, "vae": Kind.VAE}


def components(files):
    return {c.kind: c for c in read_components([ModelSource(str(p), ROLES[f]) for f, p in files.items()])}


def params(fam: str) -> dict[str, int]:
    return {r["component"]: r["bytes"] for r in json.loads(CORPUS.read_text())["params"] if r["family"] == fam}


def test_sd35_large_layout_by_hand():
    t = sd35_large_mmdit_tensors()
    h, p = 64 * 38, "model.diffusion_model."
    assert sum(1 for n in t if n.endswith("x_block.attn.qkv.weight")) == 38
    assert not any("attn2" in n for n in t)                       # no MMDiT-X blocks
    assert t[f"{p}joint_blocks.0.x_block.attn.qkv.weight"] == (3 * h, h)
    assert t[f"{p}joint_blocks.0.x_block.attn.ln_q.weight"] == (64,)   # RMS qk norm, 38 heads of 64
    assert t[f"{p}joint_blocks.0.x_block.adaLN_modulation.1.weight"] == (6 * h, h)
    assert t[f"{p}joint_blocks.37.context_block.adaLN_modulation.1.weight"] == (2 * h, h)
    assert f"{p}joint_blocks.37.context_block.mlp.fc1.weight" not in t
    assert t[f"{p}pos_embed"] == (1, 192 * 192, h)
    assert t[f"{p}context_embedder.weight"] == (h, 4096)


def test_sd35_large_families_and_params(tmp_path):
    comps = components(write_sd35_large(tmp_path, t5_layers=24))
    assert {k: family(c) for k, c in comps.items()} == {Kind.DIFFUSION: "sd3-large", Kind.TE: "sd3", Kind.VAE: "ae16"}
    rows = params("sd3-large")
    assert set(rows) == {"diffusion_model", "vae"}
    for name, size in rows.items():
        assert abs(comps[COMPONENT[name]].buffer_bytes - size) <= 0.005 * MiB + 1, name
    # medium is still medium
    assert family(components(write_sd3(tmp_path))[Kind.DIFFUSION]) == "sd3"


def test_wan14b_layout_by_hand():
    t = wan14b_dit_tensors()
    assert sum(1 for n in t if n.endswith("self_attn.q.weight")) == 40
    assert t["blocks.39.ffn.0.weight"] == (13824, 5120)
    assert t["blocks.0.cross_attn.k.weight"] == (5120, 5120)
    assert t["text_embedding.0.weight"] == (5120, 4096)
    assert t["patch_embedding.weight"] == (5120, 16, 1, 2, 2)
    assert set(wan_dit_tensors()) < set(t)   # the 1.3B's layout, 10 blocks more


def test_wan14b_families_and_params(tmp_path):
    comps = components(write_wan(tmp_path, "Q8_0", te_layers=24, size="14B"))
    assert {k: family(c) for k, c in comps.items()} == {Kind.DIFFUSION: "wan-14b", Kind.TE: "wan", Kind.VAE: "wan-vae"}
    rows = params("wan-14b")
    assert set(rows) == {"diffusion_model"}
    assert abs(comps[Kind.DIFFUSION].buffer_bytes - rows["diffusion_model"]) <= 0.005 * MiB + 1
    assert family(components(write_wan(tmp_path / "small", "Q8_0"))[Kind.DIFFUSION]) == "wan"
