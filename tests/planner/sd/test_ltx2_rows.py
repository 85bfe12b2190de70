"""LTX-2's video VAE as sd-cli logged it (planner/synth/shapes_ltx.py, scripts/record_sd_corpus.py
group ltx2-vae): the params buffer of the shape-faithful VAE, and the decode's compute buffer whole
and with --temporal-tiling, the figures behind the retry order planner/sd/vae_retry.py follows (the
simulation's check against them: tests/runtime/sd/test_ltx2_vae_graph.py). The rows stay out of the
curves' (sd_compute.APART_FAMILIES)."""
from __future__ import annotations

import json

from planner.core.units import MiB
from planner.sd.components import read_components
from planner.sd.family import family
from planner.sd.roles import Kind, ModelSource
from planner.sd.sd_compute import CORPUS, corpus, video_corpus
from planner.synth.shapes_ltx import write_ltx2

DATA = json.loads(CORPUS.read_text())
ROWS = [r for r in DATA["rows"] if r["family"] == "ltx2-vae"]
TILE_FRAMES = 4   # ltx_vae.hpp DEFAULT_TEMPORAL_TILE_FRAMES: latent frames per temporal tile (one overlapping)


def latent_frames(frames: int) -> int:
    # src/stable-diffusion.cpp:3005-3006 video_frames_to_latent_frames, VERSION_LTXAV
    return (frames - 1) // 8 + 1


def test_the_checkpoint_reads_as_ltx2_and_its_vae_params_equal_sd_clis(tmp_path):
    comps = read_components([ModelSource(str(write_ltx2(tmp_path / "ltx2.safetensors")))])
    assert {c.kind: family(c) for c in comps if c.params_bytes} == \
        {Kind.DIFFUSION: "ltx2", Kind.TE: None, Kind.VAE: "ltx2-vae"}
    logged = [p["bytes"] for p in DATA["params"] if p["family"] == "ltx2-vae" and p["component"] == "vae"]
    assert len(logged) == 1
    vae = next(c for c in comps if c.kind is Kind.VAE)
    assert abs(vae.buffer_bytes - logged[0]) <= 0.005 * MiB + 1


def test_every_point_is_recorded_whole_and_tiled_in_time():
    points = {(r["width"], r["height"], r["frames"]) for r in ROWS}
    assert len(points) >= 3 and any(latent_frames(f) > TILE_FRAMES for _, _, f in points)
    assert {(w, h, f, r["temporal_tiling"]) for r in ROWS for w, h, f in [(r["width"], r["height"], r["frames"])]} \
        == {(*p, t) for p in points for t in (False, True)}
    assert not any(r.family == "ltx2-vae" for r in corpus() + video_corpus())


def test_tiling_in_time_pays_once_a_video_outgrows_one_tile():
    # sd-cli's own figures: one tile holds 4 latent frames; a video of more is decoded a tile at a
    # time and reserves less than whole, one that fits a tile costs the frame caches on top
    whole = {(r["width"], r["height"], r["frames"]): r["bytes"] for r in ROWS if not r["temporal_tiling"]}
    for r in (r for r in ROWS if r["temporal_tiling"]):
        at = (r["width"], r["height"], r["frames"])
        if latent_frames(r["frames"]) > TILE_FRAMES:
            assert r["bytes"] < whole[at], at
        else:
            assert r["bytes"] >= whole[at], at
