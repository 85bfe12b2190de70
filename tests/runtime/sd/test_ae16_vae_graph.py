"""The 16-channel autoencoder's decode (SD3, FLUX.1, Z-Image: one graph) simulated (runtime/sd) against
the compute buffers sd-cli logged for it (planner/sd/data/sd_cli_corpus.json), at the 0.01 MB the log
prints."""
from __future__ import annotations

import pytest

from planner.sd.sd_compute import Row
from runtime.sd.sd_reserve import LATENT_FACTOR, SdMode, vae_decode_bytes
from runtime.sd.vae_decoder import AE16
from tests.support.sd_corpus import logged, row_id, rows

AE16_ROWS = rows("ae16", "vae")


@pytest.mark.parametrize("row", AE16_ROWS, ids=[row_id(r) for r in AE16_ROWS])
def test_ae16_decode_equals_sd_cli(row: Row):
    mode = SdMode(row.mode.flash_attn, row.mode.conv_direct)
    got = vae_decode_bytes(row.width // LATENT_FACTOR, row.height // LATENT_FACTOR, mode, row.tiled, AE16)
    assert logged(got) == logged(row.bytes)


def test_the_rows_cover_modes_tiling_and_sizes():
    assert {r.tiled for r in AE16_ROWS} == {True, False}
    assert {r.mode.flash_attn for r in AE16_ROWS} == {True, False}
    assert len({(r.width, r.height) for r in AE16_ROWS if not r.tiled}) >= 3
