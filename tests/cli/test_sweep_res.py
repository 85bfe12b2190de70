"""`fitplan sweep MODEL --vary res=...` on a stable-diffusion.cpp checkpoint: one sd-fit plan per
square image side, the sd-cli flags after `--`; each point's verdict and figures are sd-fit's own
at that size (planner/sd/res_sweep.py)."""
from __future__ import annotations

import csv
import io
import json

import pytest

from planner.cli import main
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
    (f"res={CORPUS_MAX_SIDE + 64}", "does not extrapolate"),
])
def test_bad_res_is_one_line_exit_2(capsys, sd15, vary, needle):
    code, _, err = run(capsys, "sweep", sd15, "--vary", vary, *DEVICES, *BASE)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_res_alone_and_with_devices(capsys, sd15):
    code, _, err = run(capsys, "sweep", sd15, "--vary", "res=512", "--vary", "np=1,2", *DEVICES)
    assert code == 2 and "varies res alone" in err
    code, _, err = run(capsys, "sweep", sd15, "--vary", "res=512")
    assert code == 2 and "--device" in err
    code, _, err = run(capsys, "sweep", sd15, "--vary", "res=512", *DEVICES, "--", "--bogus", "1")
    assert code == 2 and "--bogus" in err
