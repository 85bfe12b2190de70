"""Compute buffers of a video model (Wan2.1-T2V-1.3B) by size and frame count: the corpus curves
reproduce sd-cli's other recorded figures, and sizing takes the frame count as an input.

The rows are sd-cli's logged buffers (scripts/record_sd_corpus.py, groups wan-te, wan, wan-vae);
each curve is solved from its FIT_VIDEO rows, and every other row must come out within 3 % or
4 MiB.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from planner.core.errors import BadInput
from planner.sd.components import read_components
from planner.sd.family import family
from planner.sd.roles import FileRole, Kind, ModelSource
from planner.sd.sd_compute import (
    FIT_VIDEO,
    VIDEO_FAMILIES,
    WAN_DIT,
    Mode,
    corpus,
    latent_frames,
    params_rows,
    video_compute_bytes,
    video_corpus,
)
from planner.sd.sd_simulated import is_simulated
from planner.sd.sizing import Render, sized
from planner.synth.shapes_sd import write_checkpoint
from planner.synth.shapes_wan import write_wan

MiB = 1024 * 1024
CHECKS = [r for r in video_corpus() if not r.fit]
FA = Mode(flash_attn=True)


def _id(r) -> str:
    return f"{r.runner}-{r.width}x{r.height}x{r.frames}-{r.mode.key}{'-tiled' if r.tiled else ''}"


def test_video_rows_are_apart_from_the_image_rows():
    assert video_corpus() and all(r.family in VIDEO_FAMILIES for r in video_corpus())
    assert not any(r.family in VIDEO_FAMILIES for r in corpus())


def test_every_curve_has_check_rows_off_its_fit_points():
    curves = {(r.family, r.runner, r.mode) for r in video_corpus() if r.fit
              and len(FIT_VIDEO[(r.family, r.runner)]) > 1}
    checked = {(r.family, r.runner, r.mode) for r in CHECKS if not r.tiled}
    assert curves and curves <= checked
    assert any(r.tiled for r in CHECKS) and any(r.frames > 1 for r in CHECKS)


@pytest.mark.parametrize("row", CHECKS, ids=[_id(r) for r in CHECKS])
def test_checks_within_tolerance(row):
    est = video_compute_bytes(row.family, row.runner, row.width, row.height, row.frames, row.mode, tiled=row.tiled)
    assert est is not None
    assert abs(est - row.bytes) <= max(0.03 * row.bytes, 4 * MiB), (est / MiB, row.bytes / MiB)


def test_fit_rows_are_reproduced():
    """Each curve passes through its fit rows (simulated runners use no curve: tests/runtime/sd)."""
    for r in (r for r in video_corpus() if r.fit and not is_simulated(r.family, r.runner)):
        assert abs(video_compute_bytes(r.family, r.runner, r.width, r.height, r.frames, r.mode) - r.bytes) <= 1


def test_latent_frames():
    # 4 video frames per latent frame after the first: 1 -> 1, 5 -> 2, 17 -> 5, 81 -> 21
    assert [latent_frames(f) for f in (1, 5, 17, 81)] == [1, 2, 5, 21]


def test_frames_grow_the_dit_and_the_decode():
    dit = [video_compute_bytes("wan", WAN_DIT, 320, 192, f) for f in (1, 5, 9, 17)]
    vae = [video_compute_bytes("wan-vae", "wan_vae", 320, 192, f) for f in (1, 5, 9, 17)]
    assert dit == sorted(dit) and vae == sorted(vae) and dit[0] < dit[-1] and vae[0] < vae[-1]
    # the UMT5 encoder reads 512 tokens whatever the video
    assert video_compute_bytes("wan", "t5", 256, 256, 1) == video_compute_bytes("wan", "t5", 832, 480, 33)
    # flash attention drops the DiT's N^2 attention scores
    assert video_compute_bytes("wan", WAN_DIT, 416, 240, 17, FA) < video_compute_bytes("wan", WAN_DIT, 416, 240, 17)


def test_tiled_decode_is_one_tile_of_every_frame():
    # 32x32 latent tiles (the default --vae-tile-size), all frames in each tile's graph
    for frames in (1, 9):
        assert video_compute_bytes("wan-vae", "wan_vae", 832, 480, frames, tiled=True) \
            == video_compute_bytes("wan-vae", "wan_vae", 256, 256, frames)
        assert video_compute_bytes("wan-vae", "wan_vae", 832, 160, frames, tiled=True) \
            == video_compute_bytes("wan-vae", "wan_vae", 256, 160, frames)


@pytest.mark.parametrize("w,h,frames", [(320, 200, 5), (0, 256, 5), (256, 256, 4), (256, 256, 0), (256, 256, 6)])
def test_bad_video_requests(w, h, frames):
    with pytest.raises(BadInput):
        video_compute_bytes("wan", WAN_DIT, w, h, frames)


@pytest.fixture(scope="module")
def wan_components(tmp_path_factory):
    files = write_wan(tmp_path_factory.mktemp("wan"))
    roles = {"--diffusion-model": FileRole.DIFFUSION_MODEL, "--t5xxl": FileRole.T5XXL, "--vae": FileRole.VAE}
    comps = read_components([ModelSource(str(p), roles[flag]) for flag, p in files.items()])
    yield {c.kind: c for c in comps}
    for p in files.values():
        Path(p).unlink()


def test_sized_takes_frames(wan_components):
    assert [family(wan_components[k]) for k in Kind] == ["wan", "wan", "wan-vae"]
    render = Render(416, 240)   # flash attention auto: on for the CPU (seed 002)
    for kind, runner in ((Kind.DIFFUSION, WAN_DIT), (Kind.TE, "t5"), (Kind.VAE, "wan_vae")):
        comp = sized(wan_components[kind], render, (), False, "wan", frames=17)
        assert comp.compute_mode == "fa=on,conv_direct=off"
        assert comp.compute_bytes == video_compute_bytes(family(comp), runner, 416, 240, 17, FA)
        # default: one frame
        assert sized(wan_components[kind], render, (), False, "wan").compute_bytes \
            == video_compute_bytes(family(comp), runner, 416, 240, 1, FA)


def test_sized_rejects_frames_wan_cannot_make(wan_components):
    with pytest.raises(BadInput, match="4k\\+1"):
        sized(wan_components[Kind.DIFFUSION], Render(416, 240), (), False, "wan", frames=8)


def test_sized_rejects_frames_on_an_image_model(tmp_path):
    comps = read_components([ModelSource(str(write_checkpoint("sd15", tmp_path / "sd15.safetensors")))])
    unet = next(c for c in comps if c.kind is Kind.DIFFUSION)
    assert sized(unet, Render(512, 512), (), False, frames=1).compute_bytes is not None
    with pytest.raises(BadInput, match="images"):
        sized(unet, Render(512, 512), (), False, frames=5)


def test_params_buffers_equal_sd_clis(tmp_path):
    """The corpus's `wan` params rows are sd-cli's "total params memory size" figures (to 0.01 MB)
    for these files with the Q4_0 UMT5 encoder; sd-fit's params buffers equal them."""
    rows = [r for r in params_rows() if r["family"] == "wan"]
    assert {r["component"] for r in rows} == {"diffusion_model", "text_encoders", "vae"}
    files = write_wan(tmp_path, "Q4_0")
    roles = {"--diffusion-model": FileRole.DIFFUSION_MODEL, "--t5xxl": FileRole.T5XXL, "--vae": FileRole.VAE}
    comps = read_components([ModelSource(str(p), roles[flag]) for flag, p in files.items()])
    buffers = {c.kind: c.buffer_bytes for c in comps}
    kinds = {"diffusion_model": Kind.DIFFUSION, "text_encoders": Kind.TE, "vae": Kind.VAE}
    for r in rows:
        assert abs(buffers[kinds[r["component"]]] - r["bytes"]) <= 0.005 * MiB + 1, r
