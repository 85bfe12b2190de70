"""sd-fit against the built sd-cli (scripts/build_sd_cpp.sh, built on first use): on the
shape-faithful SD 1.5 and SDXL checkpoints (planner/synth/shapes_sd.py), sd-fit's params buffers
equal what sd-cli allocates, and its compute buffers are within 3 % or 4 MiB of sd-cli's (never
more than 1 MiB below) at image sizes and modes outside the corpus rows the curves are solved from.

Each sd-cli run is one step with cfg-scale 1 and is stopped once the buffers compared are logged
(the UNet's and the text encoder's before any sampling; the VAE's after one step).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cli import main
from planner.sd.compute import FIT_SIZES
from planner.sd.sd_cli import ensure_sd_cli, run_sd_cli
from planner.synth.shapes_sd import write_checkpoint

pytestmark = pytest.mark.peer

MiB = 1024 * 1024
LOG_STEP = round(0.005 * MiB) + 1     # the log prints MB with two decimals
COMPONENT = {"diffusion": "diffusion_model", "te": "text_encoders", "vae": "vae"}
RUNNER = {"unet": "diffusion", "clip": "te", "vae": "vae"}


@pytest.fixture(scope="session")
def sd_cli() -> Path:
    return ensure_sd_cli()


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Written on first use: one sparse file per family for the whole session."""
    return {"dir": tmp_path_factory.mktemp("sd")}


def checkpoint(checkpoints: dict, family: str) -> Path:
    if family not in checkpoints:
        checkpoints[family] = write_checkpoint(family, checkpoints["dir"] / f"{family}.safetensors")
    return checkpoints[family]


def sd_fit(capsys, model: Path, width: int, height: int, fa: bool, conv: bool, tiled: bool) -> dict:
    args = ["sd-fit", str(model), "--backend", "cpu", "--ram", "64GiB", "-W", str(width), "-H", str(height),
            "--flash-attn", "on" if fa else "off", "--conv-direct", "on" if conv else "off", "--format", "json"]
    code = main(args + (["--vae-tiling"] if tiled else []))
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def sd_cli_log(exe: Path, model: Path, width: int, height: int, fa: bool, conv: bool, tiled: bool,
               runners: list[str]):
    args = ["-m", str(model), "-p", "a cat", "-W", str(width), "-H", str(height), "--steps", "1",
            "--cfg-scale", "1", "-t", "2", "--seed", "1", "-o", str(model.with_suffix(".png"))]
    args += ["--fa"] if fa else []
    args += ["--diffusion-conv-direct", "--vae-conv-direct"] if conv else []
    args += ["--vae-tiling"] if tiled else []
    return run_sd_cli(args, exe=exe, stop_when=runners, timeout_s=1800)


def close(estimate: int, truth: int) -> bool:
    return abs(estimate - truth) <= max(0.03 * truth, 4 * MiB) and estimate >= truth - MiB


def test_sizes_are_outside_the_fit_rows():
    fit_sizes = {size for sizes in FIT_SIZES.values() for size in sizes}
    assert not fit_sizes & {(w, h) for _, w, h, *_ in CASES}


CASES = [
    # family, width, height, flash attention, direct convolution, VAE tiling, runners compared
    ("sd15", 448, 448, False, False, False, ["clip", "unet"]),
    ("sd15", 576, 320, True, False, False, ["clip", "unet"]),
    ("sd15", 448, 704, False, True, False, ["unet"]),
    ("sd15", 704, 512, True, True, False, ["unet"]),
    ("sd15", 320, 320, False, False, False, ["vae"]),
    ("sd15", 384, 320, False, False, True, ["vae"]),
]


@pytest.mark.parametrize("family,width,height,fa,conv,tiled,runners", CASES,
                         ids=[f"{c[0]}-{c[1]}x{c[2]}-fa{int(c[3])}-cd{int(c[4])}{'-tiled' * c[5]}-{'+'.join(c[6])}"
                              for c in CASES])
def test_buffers_equal_sd_cli(capsys, sd_cli, checkpoints, family, width, height, fa, conv, tiled, runners):
    model = checkpoint(checkpoints, family)
    truth = sd_cli_log(sd_cli, model, width, height, fa, conv, tiled, runners)
    plan = sd_fit(capsys, model, width, height, fa, conv, tiled)
    comps = {c["module"]: c for c in plan["components"]}
    for module, name in COMPONENT.items():   # params: what sd-cli allocates, to the log's 0.01 MB
        assert abs(comps[module]["params_buffer_bytes"] - dict(truth.totals)[name]) <= LOG_STEP, module
    for runner in runners:
        est, got = comps[RUNNER[runner]]["compute_reserve_bytes"], truth.compute_of(runner)
        assert comps[RUNNER[runner]]["compute_source"].startswith("sd-cli"), runner
        assert close(est, got), f"{runner}: sd-fit {est / MiB:.2f} MiB, sd-cli {got / MiB:.2f} MiB"
