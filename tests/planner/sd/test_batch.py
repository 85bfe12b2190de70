"""sd-cli's -b N against its recorded buffers (planner/sd/data/sd_cli_corpus.json, rows with a `batch`
field, recorded by scripts/record_sd_corpus.py BATCH_GROUPS): every runner's compute buffer at -b 2 and
-b 4 is the one sd-cli logs at -b 1, logged again, the same, for each image the run reached — sd-cli
samples and decodes a batch one image at a time (planner/sd/fit.py `_check_batch`)."""
from __future__ import annotations

import json

import pytest

from planner.sd.sd_compute import CORPUS, Row, compute_bytes, corpus
from tests.support.sd_corpus import logged

BATCH_ROWS = [r for r in json.loads(CORPUS.read_text())["rows"] if r.get("batch", 1) != 1]


def _same_run(row: Row) -> tuple:
    return row.family, row.runner, row.width, row.height, row.mode, row.tiled, row.frames, row.prompt_tokens


def test_the_corpus_covers_batch_sizes():
    """SD 1.5's UNet and the KL-f8 decode at three sizes and Z-Image's DiT, each at -b 2 and 4."""
    done = {(r["family"], r["runner"], r["width"], r["height"], r["batch"]) for r in BATCH_ROWS}
    for family, runner, sizes in (("sd15", "unet", 3), ("kl-f8", "vae", 3), ("sd15", "clip", 1),
                                  ("zimage", "z_image", 1)):
        for batch in (2, 4):
            assert len({(w, h) for f, r, w, h, b in done if (f, r, b) == (family, runner, batch)}) >= sizes, \
                (family, runner, batch)


@pytest.mark.parametrize("raw", BATCH_ROWS, ids=lambda r: f"{r['family']}-{r['runner']}-{r['width']}x{r['height']}"
                                                       f"-b{r['batch']}")
def test_each_image_reserves_the_same_buffer(raw):
    """The runner logged its buffer once per image the run reached (a text encoder once: the
    conditioning is computed once for the batch), every time the same."""
    logged = raw["logged"]
    assert logged and all(b == raw["bytes"] for b in logged)
    assert len(logged) <= (1 if raw["runner"] in ("clip", "qwen3") else raw["batch"])


def test_images_past_the_first_were_reached():
    # the recorder ran each diffusion model's batch to its last image, and SD 1.5's decode to the last
    # latent at 256x256: a buffer that changed after the first image would show here
    for raw in BATCH_ROWS:
        if raw["runner"] in ("unet", "z_image") or (raw["runner"] == "vae" and raw["width"] == 256):
            assert len(raw["logged"]) == raw["batch"], raw


@pytest.mark.parametrize("row", [r for r in corpus() if r.batch != 1],
                         ids=lambda r: f"{r.family}-{r.runner}-{r.width}x{r.height}-b{r.batch}")
def test_a_batch_row_equals_the_single_image_figure(row):
    """The -b N figure equals sd-cli's -b 1 figure of the same run where the corpus recorded one, and
    sd-fit's figure (the simulation) either way, at the 0.01 MB sd-cli prints."""
    single = [r.bytes for r in corpus() if r.batch == 1 and _same_run(r) == _same_run(row)]
    if row.runner in ("clip", "qwen3"):   # a text encoder sees the prompt, not the image size
        single += [r.bytes for r in corpus() if r.batch == 1 and (r.family, r.runner, r.mode, r.prompt_tokens) ==
                   (row.family, row.runner, row.mode, row.prompt_tokens)]
    assert single and set(single) == {row.bytes}
    assert logged(compute_bytes(row.family, row.runner, row.width, row.height, row.mode)) == logged(row.bytes)
