"""The Wan2.1-T2V-1.3B and 14B DiTs and its UMT5-XXL encoder simulated (runtime/sd) against the compute buffers
sd-cli logged for the shape-faithful files, the DiT by size and frame count
(planner/sd/data/sd_cli_corpus.json), at the 0.01 MB the log prints."""
from __future__ import annotations

import pytest

from planner.sd.sd_compute import WAN14_DIT, WAN_DIT, Mode, Row, video_compute_bytes
from planner.sd.sd_simulated import WAN_T5_TOKENS
from runtime.sd.sd_reserve import LATENT_FACTOR, SdMode, t5_bytes, wan_dit_bytes, wan_latent_frames
from runtime.sd.t5_encoder import UMT5_XXL
from runtime.sd.wan_dit import WAN21_T2V_14B
from tests.support.sd_corpus import logged, row_id, video_rows

DIT_ROWS = video_rows("wan", WAN_DIT)


@pytest.mark.parametrize("row", DIT_ROWS, ids=[row_id(r) for r in DIT_ROWS])
def test_wan_dit_equals_sd_cli(row: Row):
    mode = SdMode(row.mode.flash_attn, row.mode.conv_direct)
    got = wan_dit_bytes(row.width // LATENT_FACTOR, row.height // LATENT_FACTOR, wan_latent_frames(row.frames), mode)
    assert logged(got) == logged(row.bytes)


def test_the_rows_cover_frames_sizes_and_flash_attention():
    assert {r.mode.flash_attn for r in DIT_ROWS} == {True, False}
    assert len({r.frames for r in DIT_ROWS}) >= 3
    assert len({(r.width, r.height) for r in DIT_ROWS}) >= 3


def test_sd_fit_asks_the_simulation():
    """video_compute_bytes answers with the simulated graph, also past the recorded frame counts."""
    assert video_compute_bytes("wan", WAN_DIT, 416, 240, 33, Mode()) == wan_dit_bytes(52, 30, 9)


UMT5_ROWS = video_rows("wan", "t5")


@pytest.mark.parametrize("row", UMT5_ROWS, ids=[row_id(r) for r in UMT5_ROWS])
def test_umt5_equals_sd_cli(row: Row):
    """UMT5-XXL: one masked 512-token chunk, a relative-position bias in every block, whatever the video."""
    got = t5_bytes(WAN_T5_TOKENS, UMT5_XXL, SdMode(row.mode.flash_attn, row.mode.conv_direct), masked=True)
    assert logged(got) == logged(row.bytes)


DIT14_ROWS = video_rows("wan-14b", WAN14_DIT)


@pytest.mark.parametrize("row", DIT14_ROWS, ids=[row_id(r) for r in DIT14_ROWS])
def test_wan14b_dit_equals_sd_cli(row: Row):
    """Wan2.1-T2V-14B: the 1.3B's graph at width 5120, 40 heads, FFN 13824, 40 blocks."""
    mode = SdMode(row.mode.flash_attn, row.mode.conv_direct)
    got = wan_dit_bytes(row.width // LATENT_FACTOR, row.height // LATENT_FACTOR, wan_latent_frames(row.frames), mode,
                        WAN21_T2V_14B)
    assert logged(got) == logged(row.bytes)


def test_the_14b_rows_cover_frames_sizes_and_flash_attention():
    assert {r.mode.flash_attn for r in DIT14_ROWS} == {True, False}
    assert len({r.frames for r in DIT14_ROWS}) >= 3
    assert len({(r.width, r.height) for r in DIT14_ROWS}) >= 3


def test_sd_fit_asks_the_14b_simulation():
    assert video_compute_bytes("wan-14b", WAN14_DIT, 416, 240, 33, Mode()) == \
        wan_dit_bytes(52, 30, 9, cfg=WAN21_T2V_14B)
