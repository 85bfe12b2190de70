"""SD 2.x's runners simulated (runtime/sd) against the compute buffers sd-cli logged for the shape-faithful
SD 2.1 768-v checkpoint (planner/synth/shapes_sd.py `sd2`, F32 as released; planner/sd/data/sd_cli_corpus.json,
recorded by scripts/record_sd_corpus.py), at the 0.01 MB the log prints (tests/support/sd_corpus.py).

sd-cli logs "Version: SD 2.x" for that file; its VAE is SD 1.x's KL-f8 network, decoded with the same graph
(the "kl-f8" rows, tests/runtime/sd/test_sd15_graphs.py)."""
from __future__ import annotations

import pytest

from planner.sd.sd_compute import Mode, Row, compute_bytes
from runtime.sd import clip_text, unet
from runtime.sd.sd_reserve import LATENT_FACTOR, SdMode, clip_text_bytes, unet_bytes
from tests.support.sd_corpus import logged, row_id, rows

UNET_ROWS = rows("sd2", "unet")
CLIP_ROWS = rows("sd2", "clip")


@pytest.mark.parametrize("row", UNET_ROWS, ids=[row_id(r) for r in UNET_ROWS])
def test_unet_equals_sd_cli(row: Row):
    mode = SdMode(row.mode.flash_attn, row.mode.conv_direct)
    # a long prompt's rows: OpenCLIP-H's chunks of 77 (conditioner.hpp, as SD 1.x's CLIP-L)
    n_context = clip_text.N_TOKEN if row.prompt_tokens is None else clip_text.context_tokens(row.prompt_tokens)
    got = unet_bytes(row.width // LATENT_FACTOR, row.height // LATENT_FACTOR, mode, unet.SD2, n_context)
    assert logged(got) == logged(row.bytes)


@pytest.mark.parametrize("row", UNET_ROWS, ids=[row_id(r) for r in UNET_ROWS])
def test_sd_fit_asks_the_simulation(row: Row):
    """sd-fit's figure for the family "sd2" (planner/sd/sd_simulated.py) is the row's."""
    got = compute_bytes("sd2", "unet", row.width, row.height, Mode(row.mode.flash_attn, row.mode.conv_direct),
                        prompt_tokens=row.prompt_tokens)
    assert logged(got) == logged(row.bytes)


def test_the_unet_rows_cover_both_switches_at_three_sizes():
    assert {(r.mode.flash_attn, r.mode.conv_direct) for r in UNET_ROWS} == {(False, False), (True, False),
                                                                            (False, True), (True, True)}
    squares = {r.width for r in UNET_ROWS if r.width == r.height}
    assert len(squares) >= 3 and 768 in squares   # up to the 768-v model's native size
    assert any(r.width != r.height for r in UNET_ROWS)


def test_the_v_prediction_probe_is_smaller_than_any_image():
    """SD 2.x's UNet runner first reserves is_using_v_parameterization_for_sd2's graph: an 8x8 latent with a
    2-token context. sd-cli logged it as "unet compute buffer size: 2.04 MB(RAM)" without flash attention or
    direct convolution and as 1.66 MB with --fa --diffusion-conv-direct; the corpus keeps the runner's
    largest line, the image's."""
    assert logged(unet_bytes(8, 8, SdMode(), unet.SD2, n_context=2)) == "2.04"
    assert logged(unet_bytes(8, 8, SdMode(True, True), unet.SD2, n_context=2)) == "1.66"
    assert all(r.bytes > 2.04 * (1 << 20) for r in UNET_ROWS)


@pytest.mark.parametrize("row", CLIP_ROWS, ids=[row_id(r) for r in CLIP_ROWS])
def test_open_clip_h_equals_sd_cli(row: Row):
    """OpenCLIP ViT-H/14 over one 77-token chunk to its penultimate layer, then the final norm; its attention
    never takes flash attention, so both modes log the same."""
    got = clip_text_bytes(clip_text.SD2_CLIP_H, SdMode(row.mode.flash_attn, row.mode.conv_direct),
                          clip_text.SD2_CLIP_SKIP)
    assert logged(got) == logged(row.bytes)



def test_the_clip_rows_cover_both_modes():
    assert {r.mode.flash_attn for r in CLIP_ROWS} == {True, False}
