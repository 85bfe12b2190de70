"""The FLUX.1 DiT simulated (runtime/sd) against the compute buffers sd-cli logged for the shape-faithful
FLUX.1 [dev] DiT (planner/sd/data/sd_cli_corpus.json), at the 0.01 MB the log prints."""
from __future__ import annotations

import pytest

from planner.sd.sd_compute import Row
from runtime.sd.sd_reserve import LATENT_FACTOR, SdMode, flux_bytes
from tests.support.sd_corpus import logged, row_id, rows

DIT_ROWS = rows("flux", "flux")


@pytest.mark.parametrize("row", DIT_ROWS, ids=[row_id(r) for r in DIT_ROWS])
def test_flux_dit_equals_sd_cli(row: Row):
    mode = SdMode(row.mode.flash_attn, row.mode.conv_direct)
    got = flux_bytes(row.width // LATENT_FACTOR, row.height // LATENT_FACTOR, mode)
    assert logged(got) == logged(row.bytes)


def test_the_rows_cover_flash_attention_and_sizes():
    assert {r.mode.flash_attn for r in DIT_ROWS} == {True, False}
    assert len({(r.width, r.height) for r in DIT_ROWS}) >= 3
