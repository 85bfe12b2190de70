"""`fitplan sd-fit` on SD3.5 large and Wan2.1-T2V-14B (the shape-faithful files of
planner/synth/shapes_sd3.py and shapes_wan.py): the DiT's figure is simulated and equals the buffer
sd-cli logged at a recorded point (planner/sd/data/sd_cli_corpus.json, CPU: flash attention off);
the params buffers are sd-cli's too."""
from __future__ import annotations

import json

import pytest

from planner.cli import main
from planner.sd.sd_compute import CORPUS
from planner.synth.shapes_sd3 import write_sd35_large
from planner.synth.shapes_wan import write_wan

MiB = 1 << 20


def logged(n: int) -> str:
    return f"{n / MiB:.2f}"


def corpus(fam: str, **key) -> dict:
    data = json.loads(CORPUS.read_text())
    rows = [r for r in data["rows"] if r["family"] == fam and all(r.get(k, 1) == v for k, v in key.items())]
    assert len(rows) == 1, (fam, key)
    return {"row": rows[0]["bytes"], **{p["component"]: p["bytes"] for p in data["params"] if p["family"] == fam}}


def plan(capsys, *args) -> dict:
    code = main(["sd-fit", *args, "--backend", "cpu", "--ram", "64GiB", "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return {c["module"]: c for c in json.loads(out)["components"]}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("big")
    sd3 = write_sd35_large(d / "sd3", t5_layers=24)
    wan = write_wan(d / "wan", "Q4_0", size="14B")
    # sd-cli's -m file is sd-fit's positional model
    return {name: [a for flag, p in f.items() for a in ((flag, str(p)) if flag != "-m" else (str(p),))]
            for name, f in (("sd3", sd3), ("wan", wan))}


def test_sd35_large(capsys, files):
    c = plan(capsys, *files["sd3"], "--width", "512", "--height", "512", "--flash-attn", "off")
    want = corpus("sd3-large", runner="mmdit", width=512, height=512, flash_attn=False)
    assert c["diffusion"]["compute_source"].startswith("simulated")
    assert logged(c["diffusion"]["compute_reserve_bytes"]) == logged(want["row"])
    assert logged(c["diffusion"]["params_buffer_bytes"]) == logged(want["diffusion_model"])


def test_wan_14b(capsys, files):
    c = plan(capsys, *files["wan"], "--width", "256", "--height", "256", "--frames", "5", "--flash-attn", "off")
    want = corpus("wan-14b", width=256, height=256, frames=5, flash_attn=False)
    assert c["diffusion"]["compute_source"].startswith("simulated")
    assert logged(c["diffusion"]["compute_reserve_bytes"]) == logged(want["row"])
    assert logged(c["diffusion"]["params_buffer_bytes"]) == logged(want["diffusion_model"])
