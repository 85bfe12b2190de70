"""Compute buffers by image size: the corpus curves reproduce sd-cli's other recorded figures.

The rows of planner/sd/data/sd_cli_corpus.json are sd-cli's logged buffers
(scripts/record_sd_corpus.py); each curve is solved from its three `fit` rows, and every other
row must come out within 3 % or 4 MiB.
"""
from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from planner.core.errors import BadInput
from planner.sd.sd_compute import FIT_SIZES, SQUARE_ONLY, Mode, _solve, compute_bytes, corpus, latent_pixels
from planner.sd.sd_simulated import is_simulated

MiB = 1024 * 1024
CHECKS = [r for r in corpus() if not r.fit]


def test_solve_recovers_a_quadratic():
    # 7 + 3n + 2n^2 through n = 1, 2, 5: 12, 21, 72
    assert _solve([(1, 12), (2, 21), (5, 72)]) == (Fraction(7), Fraction(3), Fraction(2))


def test_the_corpus_has_check_rows_for_every_curve():
    curves = {(r.family, r.runner, r.mode) for r in corpus() if r.fit and len(FIT_SIZES[(r.family, r.runner)]) > 1}
    checked = {(r.family, r.runner, r.mode) for r in CHECKS if not r.tiled}
    assert curves and curves <= checked
    assert any(r.tiled for r in CHECKS)


@pytest.mark.parametrize("row", CHECKS, ids=[f"{r.family}-{r.runner}-{r.width}x{r.height}-{r.mode.key}"
                                             f"{'-tiled' if r.tiled else ''}" for r in CHECKS])
def test_checks_within_tolerance(row):
    est = compute_bytes(row.family, row.runner, row.width, row.height, row.mode, tiled=row.tiled,
                        prompt_tokens=row.prompt_tokens)
    if row.width != row.height and (row.family, row.runner, row.mode) in SQUARE_ONLY \
            and not is_simulated(row.family, row.runner):
        assert est is None   # a curve of square sizes claims nothing here
        return
    assert est is not None
    assert abs(est - row.bytes) <= max(0.03 * row.bytes, 4 * MiB), (est / MiB, row.bytes / MiB)


def test_fit_rows_are_reproduced():
    """Each curve passes through its fit rows (simulated runners use no curve: tests/runtime/sd)."""
    for r in (r for r in corpus() if r.fit and not is_simulated(r.family, r.runner)):
        assert abs(compute_bytes(r.family, r.runner, r.width, r.height, r.mode) - r.bytes) <= 1


def test_tiled_decode_is_one_tile():
    # a tiled decode of any image at least 256x256 reserves what an untiled 256x256 decode does
    # (32x32 latent tiles), and a smaller side is not tiled further
    whole = compute_bytes("kl-f8", "vae", 256, 256)
    assert compute_bytes("kl-f8", "vae", 1024, 768, tiled=True) == whole
    assert compute_bytes("kl-f8", "vae", 1024, 128, tiled=True) == compute_bytes("kl-f8", "vae", 256, 128)


def test_clip_is_constant_and_unknown_models_have_no_curve():
    assert compute_bytes("sd15", "clip", 256, 256) == compute_bytes("sd15", "clip", 1024, 1024)
    assert compute_bytes("sd35-large", "mmdit", 512, 512) is None
    assert compute_bytes("sd15", "unet", 512, 512, Mode(flash_attn=True)) < compute_bytes("sd15", "unet", 512, 512)


@pytest.mark.parametrize("w,h", [(0, 512), (500, 512), (512, -64)])
def test_bad_sizes(w, h):
    with pytest.raises(BadInput):
        compute_bytes("sd15", "unet", w, h)


def test_latent_pixels():
    assert latent_pixels(1024, 768) == 128 * 96


COMPONENT = {"diffusion_model": 0, "text_encoders": 1, "vae": 2}   # sd-cli's names -> Kind values


def test_params_buffers_equal_sd_clis(tmp_path):
    """The corpus's `params` rows are sd-cli's "total params memory size" figures per component
    (printed to 0.01 MB) for the shape-faithful checkpoints; sd-fit's params buffers equal them."""
    from planner.sd.components import read_components
    from planner.sd.roles import FileRole, Kind, ModelSource
    from planner.sd.sd_compute import params_rows
    from planner.synth.shapes_sd import write_checkpoint, write_flux
    from planner.synth.shapes_sd3 import write_sd3, write_z_image

    roles = {"--diffusion-model": FileRole.DIFFUSION_MODEL, "--t5xxl": FileRole.T5XXL, "--clip_l": FileRole.CLIP_L,
             "--vae": FileRole.VAE, "-m": FileRole.MODEL, "--clip_g": FileRole.CLIP_G, "--llm": FileRole.LLM}
    released = {"flux": write_flux, "sd3": write_sd3, "zimage": write_z_image}   # files by sd-cli flag
    rows = params_rows()   # the CPU build's
    assert {r["family"] for r in rows} >= {"sd15", "sdxl", "flux"}
    # the video models' rows: tests/planner/sd/test_compute_video.py, tests/planner/sd/test_ltx2_rows.py;
    # SD3.5 large's and Wan 14B's: tests/planner/sd/test_shapes_big.py; Wan2.2's: test_shapes_wan22.py
    for family in sorted({r["family"] for r in rows} - {"wan", "ltx2-vae", "sd3-large", "wan-14b", "wan22"}):
        if family in released:
            sources = [ModelSource(str(p), roles[flag]) for flag, p in released[family](tmp_path).items()]
        else:
            sources = [ModelSource(str(write_checkpoint(family, tmp_path / f"{family}.safetensors")))]
        buffers = {c.kind: c.buffer_bytes for c in read_components(sources)}
        for r in (r for r in rows if r["family"] == family):
            assert abs(buffers[Kind(COMPONENT[r["component"]])] - r["bytes"]) <= 0.005 * MiB + 1, (family, r)
        for source in sources:
            Path(source.path).unlink()
