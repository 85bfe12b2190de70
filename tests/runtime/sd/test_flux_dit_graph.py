"""The FLUX.1 DiT simulated (runtime/sd) against the compute buffers sd-cli logged for the shape-faithful
FLUX.1 [dev] DiT (planner/sd/data/sd_cli_corpus.json), at the 0.01 MB the log prints."""
from __future__ import annotations

import pytest

from planner.sd.sd_compute import Row
from runtime.sd import t5_encoder
from runtime.sd.sd_reserve import LATENT_FACTOR, SdMode, flux_bytes
from tests.support.sd_corpus import logged, row_id, rows

DIT_ROWS = rows("flux", "flux")


@pytest.mark.parametrize("row", DIT_ROWS, ids=[row_id(r) for r in DIT_ROWS])
def test_flux_dit_equals_sd_cli(row: Row):
    mode = SdMode(row.mode.flash_attn, row.mode.conv_direct)
    n_txt = 256 if row.prompt_tokens is None else t5_encoder.chunked_tokens(row.prompt_tokens, 256)
    got = flux_bytes(row.width // LATENT_FACTOR, row.height // LATENT_FACTOR, mode, n_txt=n_txt)
    assert logged(got) == logged(row.bytes)


def test_t5_cuts_a_long_prompt_into_256_token_chunks():
    """FluxCLIPEmbedder pads T5's tokens to 256 with EOS while prompt + EOS fit, else cuts chunks of 255
    + EOS (tokenizer.cpp pad_tokens): "cat" x N is N T5 tokens, so the rows at 255, 256 and 600 words are
    1, 2 and 3 chunks, and the DiT's text stream is 256, 512 and 768 tokens."""
    assert [t5_encoder.chunked_tokens(n, 256) for n in (0, 255, 256, 510, 511, 600)] == [256, 256, 512, 512, 768, 768]


def test_the_long_prompt_rows_grow_the_dit():
    """At 256x256 without flash attention: 255 tokens is the short prompt's buffer, 256 a second chunk."""
    def at(tokens: int | None) -> int:
        return next(r.bytes for r in DIT_ROWS if (r.width, r.height, r.prompt_tokens) == (256, 256, tokens)
                    and not r.mode.flash_attn)
    assert at(255) == at(None) < at(256)


def test_the_rows_cover_flash_attention_and_sizes():
    assert {r.mode.flash_attn for r in DIT_ROWS} == {True, False}
    assert len({(r.width, r.height) for r in DIT_ROWS}) >= 3
