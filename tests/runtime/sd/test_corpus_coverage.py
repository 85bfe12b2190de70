"""What the recorded sd-cli corpus (planner/sd/data/sd_cli_corpus.json) covers: every model family's
denoiser and VAE at three or more sizes with flash attention off and on and direct convolution off and
on, and every VAE's tiled decode at three or more sizes. The other tests in tests/runtime/sd check each
row against the simulation; these check that the rows are there.

Direct convolution switches only ggml_conv_2d (src/core/ggml_extend.hpp Conv2d::forward; Conv3d has no
direct variant), and sd-cli hands --diffusion-conv-direct to the UNet runner alone
(src/stable-diffusion.cpp; --vae-conv-direct to every VAE). So the DiTs' rows with the flag must
equal those without at the same size: SD3's MMDiT (whose patch embedding is a Conv2d the flag never
reaches), FLUX.1's DiT (img_in is a Linear on patchified latents, flux.hpp), Z-Image's (a Linear
x_embedder, z_image.hpp) and Wan's (a Conv3d patch embedding, wan.hpp).

The text encoders (CLIP, T5, UMT5, Qwen3) see the prompt only, never the image: their graph has no
size input (planner/sd/sd_simulated.py): sd-cli logs one figure per mode at every size.
"""
from __future__ import annotations

import pytest

from planner.sd.sd_compute import WAN_DIT, Row, corpus, video_corpus

# (family, runner) -> whether sd-cli's conv-direct flag switches any of its convolutions
DENOISERS = {("sd15", "unet"): True, ("sd2", "unet"): True, ("sdxl", "unet"): True, ("sd3", "mmdit"): False,
             ("flux", "flux"): False, ("zimage", "z_image"): False, ("wan", WAN_DIT): False}
VAES = (("kl-f8", "vae"), ("kl-f8-sdxl", "vae"), ("ae16", "vae"), ("wan-vae", "wan_vae"))
TEXT_ENCODERS = (("sd15", "clip"), ("sdxl", "clip"), ("flux", "clip"), ("flux", "t5"), ("sd3", "clip"),
                 ("sd3", "t5"), ("zimage", "qwen3"), ("wan", "t5"))
MIN_SIZES = 3


def _rows(family: str, runner: str) -> list[Row]:
    return [r for r in (*corpus(), *video_corpus()) if r.family == family and r.runner == runner]


def _sizes(rows: list[Row]) -> set[tuple[int, int, int]]:
    return {(r.width, r.height, r.frames) for r in rows}


@pytest.mark.parametrize("family,runner", [*DENOISERS, *VAES], ids=lambda x: str(x))
def test_each_switch_off_and_on_at_three_sizes(family: str, runner: str):
    untiled = [r for r in _rows(family, runner) if not r.tiled]
    for switch in ("flash_attn", "conv_direct"):
        for on in (False, True):
            got = _sizes([r for r in untiled if getattr(r.mode, switch) is on])
            assert len(got) >= MIN_SIZES, f"{family} {runner} {switch}={on}: {sorted(got)}"


@pytest.mark.parametrize("family,runner", VAES, ids=lambda x: str(x))
def test_each_vae_decodes_tiled_at_three_sizes(family: str, runner: str):
    assert len(_sizes([r for r in _rows(family, runner) if r.tiled])) >= MIN_SIZES


@pytest.mark.parametrize("family,runner", [k for k, conv in DENOISERS.items() if not conv], ids=lambda x: str(x))
def test_where_the_flag_reaches_no_convolution_it_changes_nothing(family: str, runner: str):
    rows = [r for r in _rows(family, runner) if not r.tiled]
    by_point = {(r.width, r.height, r.frames, r.mode.flash_attn, r.mode.conv_direct): r.bytes for r in rows}
    pairs = [(b, by_point.get((*p[:4], False))) for p, b in by_point.items() if p[4]]
    compared = [(on, off) for on, off in pairs if off is not None]
    assert compared, f"{family} {runner}: no size recorded with conv-direct both off and on"
    assert all(on == off for on, off in compared)


@pytest.mark.parametrize("family,runner", TEXT_ENCODERS, ids=lambda x: str(x))
def test_each_text_encoder_with_flash_attention_off_and_on(family: str, runner: str):
    assert {r.mode.flash_attn for r in _rows(family, runner)} == {False, True}


@pytest.mark.parametrize("family,runner", TEXT_ENCODERS, ids=lambda x: str(x))
def test_each_text_encoder_logs_one_figure_whatever_the_size(family: str, runner: str):
    rows = _rows(family, runner)
    assert len(_sizes(rows)) >= MIN_SIZES
    for fa in (False, True):
        assert len({r.bytes for r in rows if r.mode.flash_attn is fa}) == 1


# sd-cli aligns -W/-H up to 8 (the VAE) times the diffusion model's down factor: 8 for a UNet, 2 for
# Wan's DiT, 1 for the image DiTs (src/stable-diffusion.cpp align_image_size,
# get_diffusion_model_down_factor); the KL-f8 rows are decoded after a UNet
SPATIAL_MULTIPLE = {"sd15": 64, "sdxl": 64, "sd2": 64, "kl-f8": 64, "kl-f8-sdxl": 64, "wan": 16, "wan-vae": 16,
                    "wan-14b": 16}


def test_every_row_names_the_size_sd_cli_ran():
    """A size sd-cli would align up is not the size its buffers are for."""
    for r in (*corpus(), *video_corpus()):
        multiple = SPATIAL_MULTIPLE.get(r.family, 8)
        assert r.width % multiple == 0 and r.height % multiple == 0, r
