"""Wan2.2-TI2V-5B simulated (runtime/sd) against the compute buffers sd-cli logged for the shape-faithful
files (planner/synth/shapes_wan.py write_wan22; planner/sd/data/sd_cli_corpus.json), at the 0.01 MB the
log prints: its DiT (one timestep per latent frame) by size, frame count and flash attention, and its
48-channel VAE's decode (16 image pixels per latent pixel), whole and tiled."""
from __future__ import annotations

from dataclasses import replace

import pytest

from planner.sd.sd_compute import WAN22_DIT, Mode, Row, video_compute_bytes
from runtime.sd.sd_reserve import SdMode, wan_dit_bytes, wan_latent_frames, wan_vae_decode_bytes
from runtime.sd.wan_dit import WAN22_TI2V_5B
from runtime.sd.wan_vae_decoder import WAN22_VAE
from tests.support.sd_corpus import logged, row_id, video_rows

SCALE = 16   # the Wan2.2 VAE's image pixels per latent pixel
DIT_ROWS = video_rows("wan22", WAN22_DIT)
VAE_ROWS = video_rows("wan22-vae", "wan_vae")


@pytest.mark.parametrize("row", DIT_ROWS, ids=[row_id(r) for r in DIT_ROWS])
def test_wan22_dit_equals_sd_cli(row: Row):
    mode = SdMode(row.mode.flash_attn, row.mode.conv_direct)
    got = wan_dit_bytes(row.width // SCALE, row.height // SCALE, wan_latent_frames(row.frames), mode, WAN22_TI2V_5B)
    assert logged(got) == logged(row.bytes)


@pytest.mark.parametrize("row", VAE_ROWS, ids=[row_id(r) for r in VAE_ROWS])
def test_wan22_vae_decode_equals_sd_cli(row: Row):
    mode = SdMode(row.mode.flash_attn, row.mode.conv_direct)
    got = wan_vae_decode_bytes(row.width // SCALE, row.height // SCALE, wan_latent_frames(row.frames), mode,
                               row.tiled, WAN22_VAE)
    assert logged(got) == logged(row.bytes)


def test_the_rows_cover_sizes_frames_and_flash_attention():
    assert {r.mode.flash_attn for r in DIT_ROWS} == {True, False}
    assert len({r.frames for r in DIT_ROWS}) >= 3
    assert len({(r.width, r.height) for r in DIT_ROWS}) >= 3
    assert len([r for r in VAE_ROWS if not r.tiled]) >= 3


def test_per_frame_timesteps_reach_the_dit_only_past_one_latent_frame():
    """One latent frame: one timestep, so the 2.1 graph at 2.2's widths (wan.hpp's modulation takes its
    per-frame branch only for a three-dimensional vector)."""
    shared = replace(WAN22_TI2V_5B, per_frame_time=False)
    assert wan_dit_bytes(8, 8, 1, cfg=shared) == wan_dit_bytes(8, 8, 1, cfg=WAN22_TI2V_5B)


def test_sd_fit_asks_the_simulation():
    """video_compute_bytes answers with the simulated graphs at 16 px per latent pixel, also past the rows."""
    assert video_compute_bytes("wan22", WAN22_DIT, 640, 352, 33, Mode()) == \
        wan_dit_bytes(40, 22, 9, cfg=WAN22_TI2V_5B)
    assert video_compute_bytes("wan22-vae", "wan_vae", 256, 128, 9, Mode()) == \
        wan_vae_decode_bytes(16, 8, 3, cfg=WAN22_VAE)
