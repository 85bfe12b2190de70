"""SDXL's runners simulated (runtime/sd) against the compute buffers sd-cli logged for the shape-faithful
sd_xl_base checkpoint (planner/sd/data/sd_cli_corpus.json), at the 0.01 MB the log prints."""
from __future__ import annotations

import pytest

from planner.sd.sd_compute import Row
from runtime.sd import clip_text, unet
from runtime.sd.sd_reserve import (
    LATENT_FACTOR,
    SDXL_VAE_CONV_SCALE,
    SdMode,
    sdxl_clip_bytes,
    unet_bytes,
    vae_decode_bytes,
)
from tests.support.sd_corpus import logged, row_id, rows

UNET_ROWS = rows("sdxl", "unet")
VAE_ROWS = rows("kl-f8-sdxl", "vae")
CLIP_ROWS = rows("sdxl", "clip")


@pytest.mark.parametrize("row", UNET_ROWS, ids=[row_id(r) for r in UNET_ROWS])
def test_unet_equals_sd_cli(row: Row):
    mode = SdMode(row.mode.flash_attn, row.mode.conv_direct)
    # a long prompt's rows: CLIP-L's and bigG's chunks of 77, side by side per token (conditioner.hpp)
    n_context = clip_text.N_TOKEN if row.prompt_tokens is None else clip_text.context_tokens(row.prompt_tokens)
    got = unet_bytes(row.width // LATENT_FACTOR, row.height // LATENT_FACTOR, mode, unet.SDXL, n_context)
    assert logged(got) == logged(row.bytes)


@pytest.mark.parametrize("row", VAE_ROWS, ids=[row_id(r) for r in VAE_ROWS])
def test_vae_decode_with_the_conv_scale_equals_sd_cli(row: Row):
    """SDXL's own VAE runs every Conv2d between a 1/32 scale and its inverse (stable-diffusion.cpp)."""
    mode = SdMode(row.mode.flash_attn, row.mode.conv_direct)
    got = vae_decode_bytes(row.width // LATENT_FACTOR, row.height // LATENT_FACTOR, mode, row.tiled,
                           conv_scale=SDXL_VAE_CONV_SCALE)
    assert logged(got) == logged(row.bytes)


@pytest.mark.parametrize("row", CLIP_ROWS, ids=[row_id(r) for r in CLIP_ROWS])
def test_text_encoders_equal_sd_cli(row: Row):
    """The largest of CLIP-L's, bigG's and bigG's pooled reserve (the log's largest "clip" line)."""
    assert logged(sdxl_clip_bytes(SdMode(row.mode.flash_attn, row.mode.conv_direct))) == logged(row.bytes)


def test_the_conv_scale_costs_memory():
    """Two SCALE nodes per convolution: the scaled decode needs more than the plain one (the corpus: ~15 %)."""
    assert vae_decode_bytes(32, 32, conv_scale=SDXL_VAE_CONV_SCALE) > vae_decode_bytes(32, 32)
