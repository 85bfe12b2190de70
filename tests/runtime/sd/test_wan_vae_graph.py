"""The Wan 2.1 VAE's decode simulated (runtime/sd) against the compute buffers sd-cli logged for the
shape-faithful VAE by size and frame count, tiled and not (planner/sd/data/sd_cli_corpus.json), at the
0.01 MB the log prints."""
from __future__ import annotations

import pytest

from planner.sd.sd_compute import Mode, Row, video_compute_bytes
from runtime.sd.sd_reserve import LATENT_FACTOR, SdMode, wan_latent_frames, wan_vae_decode_bytes
from tests.support.sd_corpus import logged, row_id, video_rows

VAE_ROWS = video_rows("wan-vae", "wan_vae")


@pytest.mark.parametrize("row", VAE_ROWS, ids=[row_id(r) for r in VAE_ROWS])
def test_wan_vae_decode_equals_sd_cli(row: Row):
    mode = SdMode(row.mode.flash_attn, row.mode.conv_direct)
    got = wan_vae_decode_bytes(row.width // LATENT_FACTOR, row.height // LATENT_FACTOR,
                               wan_latent_frames(row.frames), mode, row.tiled)
    assert logged(got) == logged(row.bytes)


def test_the_rows_cover_frames_sizes_tiling_and_flash_attention():
    assert {r.tiled for r in VAE_ROWS} == {True, False}
    assert {r.mode.flash_attn for r in VAE_ROWS} == {True, False}
    assert len({r.frames for r in VAE_ROWS}) >= 5
    assert len({(r.width, r.height) for r in VAE_ROWS}) >= 3


def test_sd_fit_asks_the_simulation():
    assert video_compute_bytes("wan-vae", "wan_vae", 256, 128, 41, Mode()) == wan_vae_decode_bytes(32, 16, 11)
