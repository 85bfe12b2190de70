"""Which model a component is (planner/sd/family.py), on the shape-faithful checkpoints and
variants of them that the corpus does not cover."""
from __future__ import annotations

from planner.sd.components import read_components
from planner.sd.family import family
from planner.sd.roles import FileRole, Kind, ModelSource
from planner.synth.safetensors_factory import write_safetensors
from planner.synth.shapes_sd import CHECKPOINTS


def families(tmp_path, tensors):
    path = write_safetensors(tmp_path / "m.safetensors", {n: ("F16", s) for n, s in tensors.items()})
    return {c.kind: family(c) for c in read_components([ModelSource(str(path))]) if c.params_bytes}


def test_released_layouts(tmp_path):
    assert families(tmp_path, CHECKPOINTS["sd15"]()) == {Kind.DIFFUSION: "sd15", Kind.TE: "sd15", Kind.VAE: "kl-f8"}
    assert families(tmp_path, CHECKPOINTS["sdxl"]()) == {Kind.DIFFUSION: "sdxl", Kind.TE: "sdxl", Kind.VAE: "kl-f8"}


def test_a_1024_wide_context_is_not_sd15(tmp_path):
    # SD 2.x's cross attention reads a 1024-wide OpenCLIP context: not a model the corpus covers
    t = CHECKPOINTS["sd15"]()
    for name in [n for n in t if ".attn2.to_k." in n or ".attn2.to_v." in n]:
        t[name] = (t[name][0], 1024)
    assert families(tmp_path, t)[Kind.DIFFUSION] is None


def test_a_16_channel_vae_is_not_kl_f8(tmp_path):
    # SD3 / Flux VAEs decode 16 latent channels: the 16-channel autoencoder, not KL-f8
    t = CHECKPOINTS["sd15"]()
    t["first_stage_model.decoder.conv_in.weight"] = (512, 16, 3, 3)
    assert families(tmp_path, t)[Kind.VAE] == "ae16"


def test_flux_files(tmp_path):
    from planner.synth.shapes_sd import write_flux

    roles = {"--diffusion-model": FileRole.DIFFUSION_MODEL, "--t5xxl": FileRole.T5XXL, "--clip_l": FileRole.CLIP_L,
             "--vae": FileRole.VAE}
    sources = [ModelSource(str(p), roles[flag]) for flag, p in write_flux(tmp_path).items()]
    got = {c.kind: family(c) for c in read_components(sources)}
    # the 16-channel autoencoder: the decode graph SD3 and Z-Image share (planner/sd/family.py)
    assert got == {Kind.DIFFUSION: "flux", Kind.TE: "flux", Kind.VAE: "ae16"}
