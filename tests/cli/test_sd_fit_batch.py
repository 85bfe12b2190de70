"""`fitplan sd-fit --batch N` (sd-cli's -b / --batch-count) on the shape-faithful SD 1.5 checkpoint:
sd-cli makes a batch's images one at a time (planner/sd/fit.py `_check_batch`), so the plan at N is the
plan at 1 — each component's compute figure is the one sd-cli logged for every image of a recorded
-b 4 run, at the 0.01 MB sd-cli prints — and the flags carry -b N."""
from __future__ import annotations

import pytest

from planner.cli import main
from planner.sd.sd_compute import corpus
from tests.support.sd_corpus import logged
from tests.support.sd_fit import sd_fit_json as plan

CPU = ["--backend", "cpu", "--ram", "64GiB", "--flash-attn", "off", "--conv-direct", "off"]


def test_batch_plans_each_image_as_sd_cli_does(capsys, sd15):
    size = ["-W", "320", "-H", "448"]
    one = plan(capsys, sd15, *CPU, *size)
    four = plan(capsys, sd15, *CPU, *size, "--batch", "4")
    recorded = {r.runner: logged(r.bytes) for r in corpus() if r.batch == 4 and (r.width, r.height) == (320, 448)}
    got = {c["module"]: logged(c["compute_reserve_bytes"]) for c in four["components"]}
    assert got == {"diffusion": recorded["unet"], "te": recorded["clip"], "vae": recorded["vae"]}
    assert four["image"]["batch"] == 4 and four["flags"].endswith("-b 4")
    assert {**four, "image": one["image"], "flags": one["flags"], "argv": one["argv"]} == one
    # sd-cli's own spellings, and the text answer says why nothing grows
    assert plan(capsys, sd15, *CPU, *size, "-b", "4") == plan(capsys, sd15, *CPU, *size, "--batch-count", "4") == four
    assert main(["sd-fit", sd15, *CPU, *size, "-b", "4"]) == 0
    out, _ = capsys.readouterr()
    assert "batch of 4: sd-cli samples and decodes the images one at a time" in out


@pytest.mark.parametrize("value,needle", [("0", "--batch 0: expected 1 or more"),
                                          ("-2", "--batch -2: expected 1 or more"),
                                          ("two", "Invalid value for '--batch'")])
def test_bad_batch_is_one_line_exit_2(capsys, sd15, value, needle):
    code = main(["sd-fit", sd15, *CPU, "--batch", value])
    _, err = capsys.readouterr()
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1
