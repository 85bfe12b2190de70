"""LTX-2's video VAE decode simulated (runtime/sd/ltx_vae_decoder.py) against the compute buffers sd-cli
logged for the shape-faithful VAE (planner/synth/shapes_ltx.py; planner/sd/data/sd_cli_corpus.json, family
ltx2-vae), whole and with --temporal-tiling, at the 0.01 MB the log prints."""
from __future__ import annotations

import json

import pytest

from planner.sd.sd_compute import CORPUS
from runtime.sd.ltx_vae_decoder import Tile, tiles
from runtime.sd.sd_reserve import ltx_vae_decode_bytes
from tests.support.sd_corpus import logged

ROWS = [r for r in json.loads(CORPUS.read_text())["rows"] if r["family"] == "ltx2-vae"]
SCALE = 32   # src/model/vae/vae.hpp get_scale_factor, VERSION_LTXAV


def latent_frames(frames: int) -> int:
    return (frames - 1) // 8 + 1   # src/stable-diffusion.cpp video_frames_to_latent_frames, VERSION_LTXAV


def _id(r: dict) -> str:
    return f"{r['width']}x{r['height']}x{r['frames']}f{'-temporal' if r['temporal_tiling'] else ''}"


@pytest.mark.parametrize("row", ROWS, ids=[_id(r) for r in ROWS])
def test_ltx2_vae_decode_equals_sd_cli(row: dict):
    got = ltx_vae_decode_bytes(row["width"] // SCALE, row["height"] // SCALE, latent_frames(row["frames"]),
                               row["temporal_tiling"])
    assert logged(got) == logged(row["bytes"])


def test_the_rows_cover_whole_and_tiled_decodes_of_one_and_several_tiles():
    assert {r["temporal_tiling"] for r in ROWS} == {True, False}
    assert {len(tiles(latent_frames(r["frames"]))) for r in ROWS if r["temporal_tiling"]} >= {1, 2}


def test_the_tiles_follow_resolve_temporal_tile_plan():
    # 4 latent frames a tile, one overlapping the next (ltx_vae.hpp DEFAULT_TEMPORAL_TILE_FRAMES / _OVERLAP):
    # 6 frames are [0, 4) cut by one, then [3, 6); 2 frames one tile; 7 frames [0, 4), [3, 7)
    assert tiles(6) == (Tile(0, 4, 1), Tile(3, 3, 0))
    assert tiles(2) == (Tile(0, 2, 0),)
    assert tiles(7) == (Tile(0, 4, 1), Tile(3, 4, 0))
