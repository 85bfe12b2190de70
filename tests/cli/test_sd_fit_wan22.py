"""`fitplan sd-fit` on Wan2.2-TI2V-5B (planner/synth/shapes_wan.py write_wan22): the DiT's and the VAE's
figures are simulated and equal the buffers sd-cli logged at a recorded point
(planner/sd/data/sd_cli_corpus.json, CPU), the params buffers are sd-cli's, 720p at 121 frames gets an
answer from the simulation, and a side that is not a multiple of 32 px is refused."""
from __future__ import annotations

import json

import pytest

from planner.cli import main
from planner.sd.sd_compute import CORPUS, params_rows
from planner.synth.shapes_wan import write_wan22

MiB = 1 << 20


def logged(n: int) -> str:
    return f"{n / MiB:.2f}"


def corpus(fam: str, **key) -> int:
    rows = [r for r in json.loads(CORPUS.read_text())["rows"]
            if r["family"] == fam and all(r.get(k, 1) == v for k, v in key.items())]
    assert len(rows) == 1, (fam, key)
    return rows[0]["bytes"]


def params(fam: str) -> dict[str, int]:
    return {p["component"]: p["bytes"] for p in params_rows() if p["family"] == fam}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> list[str]:
    f = write_wan22(tmp_path_factory.mktemp("wan22"), "Q8_0")
    return [a for flag, p in f.items() for a in (flag, str(p))]


def plan(capsys, files, *args) -> dict:
    code = main(["sd-fit", *files, *args, "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_recorded_point(capsys, files):
    got = plan(capsys, files, "--width", "320", "--height", "192", "--frames", "9", "--flash-attn", "off",
               "--backend", "cpu", "--ram", "64GiB")
    c = {c["module"]: c for c in got["components"]}
    assert c["diffusion"]["compute_source"].startswith("simulated")
    assert logged(c["diffusion"]["compute_reserve_bytes"]) == \
        logged(corpus("wan22", width=320, height=192, frames=9, flash_attn=False))
    want = params("wan22")
    assert logged(c["diffusion"]["params_buffer_bytes"]) == logged(want["diffusion_model"])
    assert logged(c["vae"]["params_buffer_bytes"]) == logged(want["vae"])


def test_720p_121_frames_on_24_gib(capsys, files):
    got = plan(capsys, files, "--width", "1280", "--height", "704", "--frames", "121", "--device", "CUDA0=24GiB",
               "--ram", "64GiB")
    c = {c["module"]: c for c in got["components"]}
    assert c["diffusion"]["compute_source"].startswith("simulated")
    assert c["vae"]["compute_source"].startswith("simulated")
    assert got["image"]["frames"] == 121


def test_a_side_off_the_32_px_grid_is_refused(capsys, files):
    code = main(["sd-fit", *files, "--width", "336", "--height", "192", "--backend", "cpu"])
    err = capsys.readouterr().err
    assert code == 2
    assert "multiples of 32" in err
