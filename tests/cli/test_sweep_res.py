"""`fitplan sweep MODEL --vary res=...` on a stable-diffusion.cpp checkpoint: one sd-fit plan per
square image side, the sd-cli flags after `--`; each point's verdict and figures are sd-fit's own
at that size (planner/sd/res_sweep.py)."""
from __future__ import annotations

import csv
import io
import json

import pytest

from planner.cli import main
from planner.sd import sd_simulated
from planner.sd.plan import SIMULATED_MAX_SIDE
from planner.sd.sd_compute import CORPUS_MAX_SIDE, Mode, compute_bytes
from planner.synth.shapes_sd import write_checkpoint

DEVICES = ["--device", "CUDA0=4GiB", "--ram", "64GiB"]
BASE = ["--", "--auto-fit", "off", "--flash-attn", "off", "--conv-direct", "off"]


@pytest.fixture(scope="module")
def sd15(tmp_path_factory):
    return str(write_checkpoint("sd15", tmp_path_factory.mktemp("res") / "sd15.safetensors"))


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_each_point_is_sd_fit_at_that_side(capsys, sd15):
    code, out, err = run(capsys, "sweep", sd15, "--vary", "res=512..1024:256", *DEVICES, "--format", "json", *BASE)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["axes"] == {"res": [512, 768, 1024]}
    for point in doc["points"]:
        side = point["width"]
        code, one, err = run(capsys, "sd-fit", sd15, *DEVICES, "-W", str(side), "-H", str(side), *BASE[1:],
                             "--format", "json")
        assert code == 0, err
        plan = json.loads(one)
        assert point["verdict"] == plan["verdict"] and point["flags"] == plan["flags"]
        assert point["devices"] == [{k: d[k] for k in ("name", "weights_bytes", "compute_bytes", "need_bytes",
                                                       "cap_bytes", "fits")} for d in plan["per_device"]]
    # without flash attention the UNet's buffer grows with the square of the latent: 4 GiB holds
    # 512 px, not 1024 px (the figures are sd-cli's: the corpus curve at each size)
    assert [p["fits"] for p in doc["points"]][::2] == [True, False]
    unet_1024 = compute_bytes("sd15", "unet", 1024, 1024, Mode(False, False))
    assert doc["points"][2]["devices"][0]["compute_bytes"] >= unet_1024


def test_csv_has_a_row_per_point_and_device(capsys, sd15):
    code, out, err = run(capsys, "sweep", sd15, "--vary", "res=512,768", *DEVICES, *BASE)
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [(r["res"], r["device"]) for r in rows] == [("512", "CUDA0"), ("512", "RAM"), ("768", "CUDA0"),
                                                       ("768", "RAM")]
    assert all(int(r["need_bytes"]) == int(r["weights_bytes"]) + int(r["compute_bytes"]) for r in rows)


@pytest.mark.parametrize("vary,needle", [
    ("res=500", "multiples of 64"),
    (f"res={SIMULATED_MAX_SIDE + 64}", f"up to {SIMULATED_MAX_SIDE}x{SIMULATED_MAX_SIDE}"),
])
def test_bad_res_is_one_line_exit_2(capsys, sd15, vary, needle):
    code, _, err = run(capsys, "sweep", sd15, "--vary", vary, *DEVICES, *BASE)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_a_simulated_model_is_swept_past_the_corpus(capsys, sd15):
    """SD 1.5's runners are all simulated (runtime/sd): sizes above the corpus's largest are sized too."""
    side = CORPUS_MAX_SIDE + 256
    code, out, err = run(capsys, "sweep", sd15, "--vary", f"res=512,{side}", *DEVICES, "--format", "json", *BASE)
    assert code == 0, err
    point = json.loads(out)["points"][1]
    assert point["width"] == side
    assert point["devices"][0]["compute_bytes"] >= compute_bytes("sd15", "unet", side, side, Mode(False, False))


def test_a_curve_is_not_extrapolated(capsys, sd15, monkeypatch):
    """With the UNet's figure from its corpus curve (its simulation taken away), sizes above the
    corpus's largest are refused."""
    monkeypatch.delitem(sd_simulated.SIMULATED, ("sd15", "unet"))
    sd_simulated.simulated_bytes.cache_clear()
    try:
        code, _, err = run(capsys, "sweep", sd15, "--vary", f"res={CORPUS_MAX_SIDE + 64}", *DEVICES, *BASE)
    finally:
        sd_simulated.simulated_bytes.cache_clear()
    assert code == 2 and "does not extrapolate" in err and len(err.strip().splitlines()) == 1


def test_res_alone_and_with_devices(capsys, sd15):
    code, _, err = run(capsys, "sweep", sd15, "--vary", "res=512", "--vary", "np=1,2", *DEVICES)
    assert code == 2 and "varies res alone" in err
    code, _, err = run(capsys, "sweep", sd15, "--vary", "res=512")
    assert code == 2 and "--device" in err
    code, _, err = run(capsys, "sweep", sd15, "--vary", "res=512", *DEVICES, "--", "--bogus", "1")
    assert code == 2 and "--bogus" in err
