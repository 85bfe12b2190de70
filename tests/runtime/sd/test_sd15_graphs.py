"""SD 1.5's runners simulated (runtime/sd) against the compute buffers sd-cli logged for them.

The expected figures are sd-cli's own (planner/sd/data/sd_cli_corpus.json, recorded by
scripts/record_sd_corpus.py from `sd-cli -v` runs of the shape-faithful SD 1.5 checkpoint), compared at
the 0.01 MB the log prints (tests/support/sd_corpus.py).
"""
from __future__ import annotations

import pytest

from planner.sd.sd_compute import Mode, Row
from runtime.sd import clip_text
from runtime.sd.sd_reserve import LATENT_FACTOR, SdMode, clip_text_bytes, unet_bytes, vae_decode_bytes
from tests.support.sd_corpus import logged, row_id, rows

VAE_ROWS = rows("kl-f8", "vae")


@pytest.mark.parametrize("row", VAE_ROWS, ids=[row_id(r) for r in VAE_ROWS])
def test_vae_decode_equals_sd_cli(row: Row):
    mode = SdMode(row.mode.flash_attn, row.mode.conv_direct)
    got = vae_decode_bytes(row.width // LATENT_FACTOR, row.height // LATENT_FACTOR, mode, tiled=row.tiled)
    assert logged(got) == logged(row.bytes)


def test_the_corpus_covers_what_the_vae_rows_claim():
    """Tiled and untiled, direct convolution on and off, several sizes: the comparison is not vacuous."""
    assert {r.tiled for r in VAE_ROWS} == {True, False}
    assert {r.mode.conv_direct for r in VAE_ROWS} == {True, False}
    assert len({(r.width, r.height) for r in VAE_ROWS if not r.tiled}) >= 3


def test_a_tiled_decode_reserves_one_tiles_graph():
    """vae.hpp get_tile_sizes: 32-latent-pixel tiles; a latent no larger than a tile is decoded whole."""
    assert vae_decode_bytes(96, 96, tiled=True) == vae_decode_bytes(32, 32)
    assert vae_decode_bytes(24, 40, tiled=True) == vae_decode_bytes(24, 32)


CLIP_ROWS = rows("sd15", "clip")


@pytest.mark.parametrize("row", CLIP_ROWS, ids=[row_id(r) for r in CLIP_ROWS])
def test_clip_l_equals_sd_cli(row: Row):
    """SD 1.x's CLIP-L over one 77-token chunk; MultiheadAttention never takes flash attention, so --fa does
    not change it (both modes are recorded)."""
    got = clip_text_bytes(mode=SdMode(row.mode.flash_attn, row.mode.conv_direct))
    assert logged(got) == logged(row.bytes)


UNET_ROWS = rows("sd15", "unet")


def _context(prompt_tokens: int | None) -> int:
    """The UNet's text context: 77 for the corpus's `a cat`, else CLIP's 77 per chunk of the prompt."""
    return clip_text.N_TOKEN if prompt_tokens is None else clip_text.context_tokens(prompt_tokens)


@pytest.mark.parametrize("row", UNET_ROWS, ids=[row_id(r) for r in UNET_ROWS])
def test_unet_equals_sd_cli(row: Row):
    mode = SdMode(row.mode.flash_attn, row.mode.conv_direct)
    got = unet_bytes(row.width // LATENT_FACTOR, row.height // LATENT_FACTOR, mode,
                     n_context=_context(row.prompt_tokens))
    assert logged(got) == logged(row.bytes)


def test_a_long_prompt_is_cut_into_77_token_chunks():
    """BOS + 75 prompt tokens + EOS fill one chunk; a 76th token opens a second (tokenizer.cpp pad_tokens):
    "cat" x N is N BPE tokens, so the recorded rows at 75, 76, 120, 200 and 300 words are 1, 2, 2, 3 and 4
    chunks."""
    assert [clip_text.context_tokens(n) for n in (0, 75, 76, 120, 150, 151, 200, 300)] == \
        [77, 77, 154, 154, 154, 231, 231, 308]


def test_the_long_prompt_rows_move_the_unet_and_not_clip():
    """At 256x256 without flash attention: the 75-token row is the short prompt's buffer, 76 and 200
    tokens grow it (the cross-attention's K, V and KQ over 154 and 231 context tokens); CLIP-L's buffer
    is one chunk's in every row."""
    def at(runner: str, tokens: int | None) -> int:
        return next(r.bytes for r in rows("sd15", runner) if (r.width, r.height, r.prompt_tokens) == (256, 256, tokens)
                    and r.mode == Mode() and r.batch == 1 and r.backend == "cpu")
    assert at("unet", 75) == at("unet", None) < at("unet", 76) < at("unet", 200)
    assert {r.bytes for r in rows("sd15", "clip")} == {at("clip", None)}


def test_the_unet_rows_cover_both_switches():
    assert {(r.mode.flash_attn, r.mode.conv_direct) for r in UNET_ROWS} == {(False, False), (True, False),
                                                                            (False, True), (True, True)}
    assert len({(r.width, r.height) for r in UNET_ROWS}) >= 3


def test_above_the_curves_range_the_simulation_equals_sd_cli():
    """sd-fit searches simulated models past 1024 px: one recorded row there grounds it (SD 1.5's UNet at
    1280x1280 with flash attention, which sd-cli logged as 768.00 MB), and sd-fit's own figure is that one."""
    from planner.sd.sd_compute import Mode, compute_bytes

    (row,) = [r for r in UNET_ROWS if r.width == r.height == 1280]
    assert row.mode.flash_attn and not row.mode.conv_direct
    assert logged(compute_bytes("sd15", "unet", 1280, 1280, Mode(True, False))) == logged(row.bytes)
