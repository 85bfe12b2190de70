"""The KL-f8 VAE's encode graph (runtime/sd/vae_encoder.py) against sd-cli's own log of an img2img run
(tests/runtime/sd/data/vae_encode_sd_cli.json: the command and the logged figure), at the 0.01 MB it prints.
sd-fit plans no img2img, so the planner does not use this graph; the corpus has no encode rows."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.ggml.backend import UNLIMITED, make_cpu
from runtime.ggml.graph import GGMLType, Graph, Op, Tensor
from runtime.sd.sd_blocks import Blocks
from runtime.sd.sd_reserve import SdMode, vae_encode_bytes
from runtime.sd.vae_encoder import encode
from tests.support.sd_corpus import logged

ROWS = json.loads((Path(__file__).parent / "data" / "vae_encode_sd_cli.json").read_text())["rows"]


@pytest.mark.parametrize("row", ROWS, ids=[f"{r['width']}x{r['height']}-cd{int(r['conv_direct'])}" for r in ROWS])
def test_vae_encode_equals_sd_cli(row: dict):
    got = vae_encode_bytes(row["width"], row["height"], SdMode(row["flash_attn"], row["conv_direct"]))
    assert logged(got) == row["logged_mb"]


def test_the_encoder_pads_before_each_strided_convolution():
    """DownSampleBlock (vae_downsample): one PAD to the right and bottom, then a stride-2 3x3 convolution without
    padding: a 64-pixel side halves three times to the 8-pixel latent."""
    z = encode(Blocks(make_cpu(UNLIMITED).buffer_type), Tensor(GGMLType.F32, (64, 64, 3, 1)))
    assert z.ne == (8, 8, 8, 1)    # 2 * z_channels moments after quant_conv
    assert sum(n.op is Op.PAD for n in Graph.build(z).nodes) == 3
