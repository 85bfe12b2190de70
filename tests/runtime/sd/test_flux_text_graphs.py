"""FLUX.1's text encoders simulated (runtime/sd) against the compute buffers sd-cli logged for the
shape-faithful clip_l and t5xxl files (planner/sd/data/sd_cli_corpus.json), at the 0.01 MB the log prints."""
from __future__ import annotations

import pytest

from planner.sd.sd_compute import Row
from runtime.sd.sd_reserve import SdMode, flux_clip_bytes, t5_bytes
from tests.support.sd_corpus import logged, row_id, rows

FLUX_CHUNK = 256   # conditioner.hpp FluxCLIPEmbedder::chunk_len: T5 sees 256-token chunks

CLIP_ROWS = rows("flux", "clip")
T5_ROWS = rows("flux", "t5")


@pytest.mark.parametrize("row", CLIP_ROWS, ids=[row_id(r) for r in CLIP_ROWS])
def test_clip_l_pooled_equals_sd_cli(row: Row):
    assert logged(flux_clip_bytes(SdMode(row.mode.flash_attn, row.mode.conv_direct))) == logged(row.bytes)


@pytest.mark.parametrize("row", T5_ROWS, ids=[row_id(r) for r in T5_ROWS])
def test_t5_xxl_equals_sd_cli(row: Row):
    """T5Attention never takes flash attention: both recorded modes read the same."""
    assert logged(t5_bytes(FLUX_CHUNK, mode=SdMode(row.mode.flash_attn, row.mode.conv_direct))) == logged(row.bytes)
