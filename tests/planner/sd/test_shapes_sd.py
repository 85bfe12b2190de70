"""The shape-faithful SD checkpoints: parameter counts of the released models, and the components
sd-fit reads from them.

Expected counts are the published parameter counts (the Hugging Face diffusers/transformers
models of runwayml/stable-diffusion-v1-5 and stabilityai/stable-diffusion-xl-base-1.0, counted
with `sum(p.numel() for p in model.parameters())`): UNet2DConditionModel 859,520,964 (SD 1.5)
and 2,567,463,684 (SDXL), CLIPTextModel (ViT-L/14) 123,060,480, the OpenCLIP bigG text tower
694,659,840 (without logit_scale), AutoencoderKL 83,653,863.
"""
from __future__ import annotations

import math

import pytest

from planner.sd.components import TENSOR_OVERHEAD_BYTES, read_components
from planner.sd.roles import Kind, ModelSource
from planner.synth.shapes_sd import CHECKPOINTS, FLUX_FILES, write_checkpoint

COUNTS = {
    "sd15": {"model.diffusion_model.": 859_520_964, "cond_stage_model.": 123_060_480,
             "first_stage_model.": 83_653_863},
    "sdxl": {"model.diffusion_model.": 2_567_463_684, "conditioner.embedders.0.": 123_060_480,
             "conditioner.embedders.1.": 694_659_840, "first_stage_model.": 83_653_863},
    # SD 2.1: SD 1.5's UNet plus the 1024 - 768 wider to_k and to_v of its 16 cross attentions
    # (2 x 256 x (5 x 320 + 5 x 640 + 6 x 1280) = 6,389,760; its linear projections hold as many
    # parameters as the 1x1 convolutions); OpenCLIP ViT-H/14's text tower, derived: token and position
    # embeddings 49408 x 1024 + 77 x 1024, 24 blocks of 12,596,224 (in_proj 3 x 1024^2 + 3072, out_proj
    # 1024^2 + 1024, MLP 2 x 4 x 1024^2 + 4096 + 1024, two norms 2 x 2048), ln_final 2048, text_projection 1024^2
    "sd2": {"model.diffusion_model.": 859_520_964 + 6_389_760,
            "cond_stage_model.": 49408 * 1024 + 77 * 1024 + 24 * 12_596_224 + 2048 + 1024 * 1024,
            "first_stage_model.": 83_653_863},
}


@pytest.mark.parametrize("family", sorted(CHECKPOINTS))
def test_parameter_counts_are_the_released_models(family):
    tensors = CHECKPOINTS[family]()
    for prefix, count in COUNTS[family].items():
        assert sum(math.prod(s) for n, s in tensors.items() if n.startswith(prefix)) == count, prefix
    assert all(n.startswith(tuple(COUNTS[family])) for n in tensors)


def test_sd15_components_from_the_written_file(tmp_path):
    path = write_checkpoint("sd15", tmp_path / "sd15.safetensors")
    assert path.stat().st_blocks * 512 < 1024 * 1024   # sparse: only the header is on disk
    tensors = CHECKPOINTS["sd15"]()
    comps = {c.kind: c for c in read_components([ModelSource(str(path))])}
    for kind, prefix in ((Kind.DIFFUSION, "model.diffusion_model."), (Kind.TE, "cond_stage_model."),
                         (Kind.VAE, "first_stage_model.")):
        mine = [math.prod(s) * 2 + TENSOR_OVERHEAD_BYTES for n, s in tensors.items() if n.startswith(prefix)]
        assert comps[kind].params_bytes == sum(mine)
        assert comps[kind].largest_tensor_bytes == max(mine)


def test_flux_files_are_the_released_sizes():
    # FluxTransformer2DModel (FLUX.1-dev) 11,901,408,320 parameters; T5EncoderModel (t5-v1_1-xxl)
    # 4,762,310,656; AutoencoderKL (FLUX.1-dev/vae) 83,819,683; CLIPTextModelWithProjection
    # (ViT-L/14) 123,060,480 + a 768 x 768 projection
    counts = {"--diffusion-model": 11_901_408_320, "--t5xxl": 4_762_310_656, "--vae": 83_819_683,
              "--clip_l": 123_060_480 + 768 * 768}
    for flag, (make, _) in FLUX_FILES.items():
        assert sum(math.prod(s) for s in make().values()) == counts[flag], flag


@pytest.mark.parametrize("qtype,block_bytes", [("Q8_0", 34), ("Q4_0", 18)])
def test_flux_gguf_quantized(tmp_path, qtype, block_bytes):
    from planner.sd.roles import FileRole
    from planner.synth.shapes_sd import flux_tensors, write_flux_gguf

    path = write_flux_gguf(tmp_path / f"flux-{qtype}.gguf", qtype)
    comps = {c.kind: c for c in read_components([ModelSource(str(path), FileRole.DIFFUSION_MODEL)])}
    # a block of 32 weights is 34 bytes in Q8_0 (fp16 scale + 32 int8), 18 in Q4_0; 1-D tensors F32
    mine = [(math.prod(s) // 32 * block_bytes if len(s) > 1 else math.prod(s) * 4) + TENSOR_OVERHEAD_BYTES
            for s in flux_tensors().values()]
    assert comps[Kind.DIFFUSION].params_bytes == sum(mine)
