"""SD3.5 medium's and large's MMDiTs simulated (runtime/sd) against the compute buffers sd-cli logged for the
shape-faithful checkpoint (planner/sd/data/sd_cli_corpus.json), at the 0.01 MB the log prints."""
from __future__ import annotations

import pytest

from planner.sd.sd_compute import Row
from planner.sd.sd_simulated import SD3_T5_TOKENS, sd3_context_tokens
from runtime.sd.sd3_mmdit import SD35_LARGE
from runtime.sd.sd_reserve import LATENT_FACTOR, SdMode, mmdit_bytes, sd3_clip_bytes, t5_bytes
from tests.support.sd_corpus import logged, row_id, rows

MMDIT_ROWS = rows("sd3", "mmdit")
# the recorded long prompts ("cat" x N: N CLIP tokens and N T5 tokens) by hand: 100 tokens are 2 CLIP
# chunks of 75 and 2 T5 chunks of 76, 200 tokens 3 and 3; each chunk is CLIP-L/G's 77 tokens, then T5's 77
CONTEXT = {None: 154, 100: 2 * 154, 200: 3 * 154}


@pytest.mark.parametrize("row", MMDIT_ROWS, ids=[row_id(r) for r in MMDIT_ROWS])
def test_mmdit_equals_sd_cli(row: Row):
    mode = SdMode(row.mode.flash_attn, row.mode.conv_direct)
    got = mmdit_bytes(row.width // LATENT_FACTOR, row.height // LATENT_FACTOR, mode,
                      n_context=CONTEXT[row.prompt_tokens])
    assert logged(got) == logged(row.bytes)


def test_sd3_cuts_the_prompt_as_the_longer_of_clip_and_t5():
    assert [sd3_context_tokens(n) for n in (0, 75, 100, 150, 200)] == [154, 154, 308, 308, 462]
    assert sd3_context_tokens(76) == 308   # CLIP cuts 2 chunks, T5 one: sd-cli takes CLIP's count


def test_the_rows_cover_modes_and_non_square_sizes():
    assert {r.mode.flash_attn for r in MMDIT_ROWS} == {True, False}
    assert {r.mode.conv_direct for r in MMDIT_ROWS} == {True, False}
    assert any(r.width != r.height for r in MMDIT_ROWS)
    assert len({(r.width, r.height) for r in MMDIT_ROWS}) >= 3


T5_ROWS = rows("sd3", "t5")


@pytest.mark.parametrize("row", T5_ROWS, ids=[row_id(r) for r in T5_ROWS])
def test_sd3_t5_equals_sd_cli(row: Row):
    """SD3's T5-XXL encodes one 77-token chunk, whatever the image size."""
    got = t5_bytes(SD3_T5_TOKENS, mode=SdMode(row.mode.flash_attn, row.mode.conv_direct))
    assert logged(got) == logged(row.bytes)


CLIP_ROWS = rows("sd3", "clip")


@pytest.mark.parametrize("row", CLIP_ROWS, ids=[row_id(r) for r in CLIP_ROWS])
def test_sd3_clip_equals_sd_cli(row: Row):
    """The largest of CLIP-L's and CLIP-G's buffers (hidden states, then pooled), whatever the image size."""
    assert logged(sd3_clip_bytes(SdMode(row.mode.flash_attn, row.mode.conv_direct))) == logged(row.bytes)


LARGE_ROWS = rows("sd3-large", "mmdit")


@pytest.mark.parametrize("row", LARGE_ROWS, ids=[row_id(r) for r in LARGE_ROWS])
def test_sd35_large_mmdit_equals_sd_cli(row: Row):
    """SD3.5 large: the same graph at depth 38, width 2432, no second self-attention, a 192-wide table."""
    mode = SdMode(row.mode.flash_attn, row.mode.conv_direct)
    got = mmdit_bytes(row.width // LATENT_FACTOR, row.height // LATENT_FACTOR, mode, SD35_LARGE)
    assert logged(got) == logged(row.bytes)


def test_the_large_rows_cover_three_sizes_with_and_without_flash_attention():
    sizes = {(fa, s) for fa in (False, True) for s in (256, 384, 512)}
    assert {(r.mode.flash_attn, r.width) for r in LARGE_ROWS} >= sizes
    assert any(r.width != r.height for r in LARGE_ROWS)


def test_sd_fit_asks_the_large_simulation():
    from planner.sd.sd_compute import compute_bytes
    assert compute_bytes("sd3-large", "mmdit", 1024, 768) == mmdit_bytes(128, 96, cfg=SD35_LARGE)
    assert compute_bytes("sd3-large", "mmdit", 512, 512) != compute_bytes("sd3", "mmdit", 512, 512)
