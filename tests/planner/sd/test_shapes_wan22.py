"""Wan2.2-TI2V-5B's files (planner/synth/shapes_wan.py): the layouts worked out by hand from the published
config (dim 3072, 30 blocks, 24 heads, FFN 14336, 48 channels in and out) and from the Wan2.2 VAE's
(encoder 160 / decoder 256 wide, z 48, 2x2 pixel patches), the families sd-fit tells them by (not the
2.1 1.3B's or VAE's), and the params buffers sd-fit sizes equal sd-cli's logged figures in the corpus."""
from __future__ import annotations

from planner.sd.components import read_components
from planner.sd.family import family
from planner.sd.roles import FileRole, Kind, ModelSource
from planner.sd.sd_compute import params_rows
from planner.synth.shapes_wan import wan22_dit_tensors, wan22_vae_tensors, wan_dit_tensors, write_wan, write_wan22

MiB = 1 << 20
ROLES = {"--diffusion-model": FileRole.DIFFUSION_MODEL, "--vae": FileRole.VAE, "--t5xxl": FileRole.T5XXL}
COMPONENT = {"diffusion_model": Kind.DIFFUSION, "text_encoders": Kind.TE, "vae": Kind.VAE}


def components(files):
    return {c.kind: c for c in read_components([ModelSource(str(p), ROLES[f]) for f, p in files.items()])}


def test_dit_layout_by_hand():
    t = wan22_dit_tensors()
    assert sum(1 for n in t if n.endswith("self_attn.q.weight")) == 30
    assert t["patch_embedding.weight"] == (3072, 48, 1, 2, 2)
    assert t["blocks.29.ffn.0.weight"] == (14336, 3072)
    assert t["head.head.weight"] == (48 * 4, 3072)
    assert t["blocks.0.modulation"] == (1, 6, 3072)
    assert set(t) == set(wan_dit_tensors())   # the 2.1 T2V layout, other widths


def test_vae_layout_by_hand():
    t = wan22_vae_tensors()
    assert t["decoder.conv1.weight"] == (1024, 48, 3, 3, 3)
    assert t["encoder.conv1.weight"] == (160, 12, 3, 3, 3)
    assert t["decoder.head.2.weight"] == (12, 256, 3, 3, 3)
    # the up-samplers keep their width; the time convolution doubles it at the first two levels
    assert t["decoder.upsamples.0.upsamples.3.resample.1.weight"] == (1024, 1024, 3, 3)
    assert t["decoder.upsamples.1.upsamples.3.time_conv.weight"] == (2048, 1024, 3, 1, 1)
    assert "decoder.upsamples.2.upsamples.3.time_conv.weight" not in t
    assert t["decoder.upsamples.2.upsamples.0.shortcut.weight"] == (512, 1024, 1, 1, 1)
    assert t["decoder.upsamples.3.upsamples.2.residual.6.weight"] == (256, 256, 3, 3, 3)
    assert not any(n.startswith("decoder.upsamples.3.upsamples.3.") for n in t)
    assert t["encoder.downsamples.1.downsamples.2.time_conv.weight"] == (320, 320, 3, 1, 1)
    assert t["conv2.weight"] == (48, 48, 1, 1, 1)


def test_families_and_params(tmp_path):
    comps = components(write_wan22(tmp_path, "Q8_0", te_layers=24))
    assert {k: family(c) for k, c in comps.items()} == {Kind.DIFFUSION: "wan22", Kind.TE: "wan", Kind.VAE: "wan22-vae"}
    rows = {r["component"]: r["bytes"] for r in params_rows() if r["family"] == "wan22"}
    assert set(rows) == {"diffusion_model", "vae"}
    for name, size in rows.items():
        assert abs(comps[COMPONENT[name]].buffer_bytes - size) <= 0.005 * MiB + 1, name
    # the 2.1 files are still 2.1's
    small = components(write_wan(tmp_path / "small", "Q8_0"))
    assert (family(small[Kind.DIFFUSION]), family(small[Kind.VAE])) == ("wan", "wan-vae")
