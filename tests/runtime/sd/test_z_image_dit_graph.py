"""Z-Image-Turbo's DiT and its Qwen3-4B text encoder simulated (runtime/sd) against the compute buffers
sd-cli logged for the shape-faithful files (planner/sd/data/sd_cli_corpus.json), at the 0.01 MB the log
prints."""
from __future__ import annotations

import pytest

from planner.sd.sd_compute import Row
from runtime.sd.sd_reserve import (
    LATENT_FACTOR,
    Z_IMAGE_PROMPT_TOKENS,
    Z_IMAGE_TEMPLATE_TOKENS,
    SdMode,
    llm_text_bytes,
    z_image_bytes,
)
from runtime.sd.z_image_dit import pad_to
from tests.support.sd_corpus import logged, row_id, rows

DIT_ROWS = rows("zimage", "z_image")


def _tokens(prompt_tokens: int | None) -> int:
    """Qwen3's tokens: the chat template's 8 and the prompt's ("a cat" is 2: a, ' cat'; "cat" x N is N:
    cat, then ' cat')."""
    return Z_IMAGE_PROMPT_TOKENS if prompt_tokens is None else Z_IMAGE_TEMPLATE_TOKENS + prompt_tokens


def test_the_template_is_eight_tokens():
    assert Z_IMAGE_TEMPLATE_TOKENS + 2 == Z_IMAGE_PROMPT_TOKENS == 10


@pytest.mark.parametrize("row", DIT_ROWS, ids=[row_id(r) for r in DIT_ROWS])
def test_z_image_equals_sd_cli(row: Row):
    mode = SdMode(row.mode.flash_attn, row.mode.conv_direct)
    got = z_image_bytes(row.width // LATENT_FACTOR, row.height // LATENT_FACTOR, mode,
                        n_txt=_tokens(row.prompt_tokens))
    assert logged(got) == logged(row.bytes)


def test_the_rows_cover_padding_flash_attention_and_sizes():
    assert {r.mode.flash_attn for r in DIT_ROWS} == {True, False}
    # 576x832: 36 x 52 = 1872 image tokens, padded by 16 to a multiple of 32
    assert any(pad_to((r.width // 16) * (r.height // 16)) for r in DIT_ROWS)
    assert len({(r.width, r.height) for r in DIT_ROWS}) >= 3


QWEN_ROWS = rows("zimage", "qwen3")


@pytest.mark.parametrize("row", QWEN_ROWS, ids=[row_id(r) for r in QWEN_ROWS])
def test_qwen3_equals_sd_cli(row: Row):
    """Qwen3-4B up to layer 35 over "<|im_start|>user\\na cat<|im_end|>\\n<|im_start|>assistant\\n": 10 tokens
    (<|im_start|>, user, \\n, a, ' cat', <|im_end|>, \\n, <|im_start|>, assistant, \\n); a long prompt's rows
    add its tokens, unchunked."""
    assert Z_IMAGE_PROMPT_TOKENS == 10
    got = llm_text_bytes(_tokens(row.prompt_tokens), SdMode(row.mode.flash_attn, row.mode.conv_direct))
    assert logged(got) == logged(row.bytes)
