"""Wan2.1-T2V-1.3B sizing against the built sd-cli (scripts/build_sd_cpp.sh, built on first use):
on the shape-faithful files of planner/synth/shapes_wan.py, the params buffers sd-fit counts equal
what sd-cli allocates, and the compute buffers its sizing gives (planner.sd.sizing.sized with a
frame count) are within 3 % or 4 MiB of sd-cli's at (size, frames) points off the curves' fit
points, with flash attention off and on and with the VAE decode tiled.

Most rows compare against figures sd-cli logged when the corpus was recorded (the `argv` of each
row in planner/sd/data/sd_cli_corpus.json reruns it); a few run sd-cli live. A live run is one
step with cfg-scale 1, the weights memory-mapped, and is stopped once the compared buffer is
logged: the text encoder's and the DiT's before any compute (behind a one-block UMT5 stand-in
whose 512 x 4096 output is the DiT's context, as in the corpus), the VAE's after one DiT step.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from planner.sd.components import Component, read_components
from planner.sd.modes import Feature, ModeSpec, parse_modes
from planner.sd.roles import FileRole, Kind, ModelSource
from planner.sd.sd_cli import run_sd_cli
from planner.sd.sd_compute import FIT_VIDEO, WAN_DIT, video_corpus
from planner.sd.sizing import Render, sized
from planner.synth.shapes_wan import write_wan

pytestmark = pytest.mark.peer

MiB = 1024 * 1024
LOG_STEP = round(0.005 * MiB) + 1     # the log prints MB with two decimals
ROLES = {"--diffusion-model": FileRole.DIFFUSION_MODEL, "--t5xxl": FileRole.T5XXL, "--vae": FileRole.VAE}
RUNNER_KIND = {WAN_DIT: Kind.DIFFUSION, "t5": Kind.TE, "wan_vae": Kind.VAE}
TOTALS = {Kind.DIFFUSION: "diffusion_model", Kind.TE: "text_encoders", Kind.VAE: "vae"}


@pytest.fixture(scope="session")
def wan(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The files (UMT5 as the Q8_0 GGUF people download, and its one-block stand-in) and the
    components sd-fit reads from them, for the whole session."""
    work = tmp_path_factory.mktemp("wan")
    full = write_wan(work, "Q8_0")
    stand_in = dict(full, **{"--t5xxl": write_wan(work, "Q8_0", te_layers=1)["--t5xxl"]})
    comps = read_components([ModelSource(str(p), ROLES[flag]) for flag, p in full.items()])
    return {"full": full, "stand_in": stand_in, "components": {c.kind: c for c in comps}}


def sizing(comp: Component, width: int, height: int, frames: int, fa: bool, tiled: bool) -> int:
    """sd-fit's compute buffer for `comp` on the CPU with flash attention as asked."""
    render = Render(width, height, parse_modes("on" if fa else "off", Feature.FLASH_ATTN),
                    ModeSpec(Feature.CONV_DIRECT), tiled)
    got = sized(comp, render, (), tiled, "wan", frames=frames).compute_bytes
    assert got is not None, comp.kind
    return got


def close(estimate: int, truth: int) -> bool:
    """The issue's tolerance: within 3 % or 4 MiB."""
    return abs(estimate - truth) <= max(0.03 * truth, 4 * MiB)


def sd_cli_log(exe: Path, files: dict[str, Path], width: int, height: int, frames: int, fa: bool, tiled: bool,
               runner: str):
    args = ["-M", "vid_gen", *[a for flag, path in files.items() for a in (flag, str(path))],
            "-p", "a cat", "-W", str(width), "-H", str(height), "--video-frames", str(frames), "--steps", "1",
            "--cfg-scale", "1", "-t", "2", "--seed", "1", "--mmap", "-o", str(files["--vae"].with_name("wan.webm"))]
    args += ["--fa"] if fa else []
    args += ["--vae-tiling"] if tiled else []
    return run_sd_cli(args, exe=exe, stop_when=[runner], timeout_s=1200)


def test_params_and_text_encoder_equal_sd_cli(sd_cli, wan):
    """The full UMT5-XXL Q8_0 encoder: sd-cli's params totals per component and its buffer for the
    512-token prompt chunk, at a size and frame count no corpus row has."""
    truth = sd_cli_log(sd_cli, wan["full"], 352, 208, 13, False, False, "t5")
    totals = dict(truth.totals)
    for kind, comp in wan["components"].items():
        print(f"params {TOTALS[kind]}: sd-fit {comp.buffer_bytes / MiB:.2f}, sd-cli {totals[TOTALS[kind]] / MiB:.2f}")
        assert abs(comp.buffer_bytes - totals[TOTALS[kind]]) <= LOG_STEP, kind
    est = sizing(wan["components"][Kind.TE], 352, 208, 13, False, False)
    print(f"t5 352x208x13: sd-fit {est / MiB:.2f} MiB, sd-cli {truth.compute_of('t5') / MiB:.2f} MiB")
    assert close(est, truth.compute_of("t5"))


# (width, height, frames, flash attention, VAE tiling, runner): points no fit row has
LIVE = [
    (352, 208, 13, False, False, WAN_DIT),
    (288, 288, 21, True, False, WAN_DIT),
    (288, 128, 1, False, True, "wan_vae"),    # 36x16 latent pixels, decoded in 32x16 tiles
    (224, 160, 9, False, False, "wan_vae"),
]


def test_live_points_are_off_the_fit_points():
    for width, height, frames, *_, runner in LIVE:
        family = "wan-vae" if runner == "wan_vae" else "wan"
        assert (width, height, frames) not in FIT_VIDEO[(family, runner)]


@pytest.mark.parametrize("width,height,frames,fa,tiled,runner", LIVE,
                         ids=[f"{r[5]}-{r[0]}x{r[1]}x{r[2]}-fa{int(r[3])}{'-tiled' * r[4]}" for r in LIVE])
def test_live_buffers_equal_sd_cli(sd_cli, wan, width, height, frames, fa, tiled, runner):
    got = sd_cli_log(sd_cli, wan["stand_in"], width, height, frames, fa, tiled, runner).compute_of(runner)
    est = sizing(wan["components"][RUNNER_KIND[runner]], width, height, frames, fa, tiled)
    print(f"{runner} {width}x{height}x{frames} fa={fa} tiled={tiled}: sd-fit {est / MiB:.2f} MiB, "
          f"sd-cli {got / MiB:.2f} MiB")
    assert close(est, got), f"{runner}: sd-fit {est / MiB:.2f} MiB, sd-cli {got / MiB:.2f} MiB"


# the 1.3B model's rows (the fixture's files: the Wan2.1 DiT, UMT5 and VAE); the 14B's and Wan2.2-TI2V-5B's
# (families wan-14b, wan22, wan22-vae) are checked against their graphs in tests/runtime/sd
RECORDED = [r for r in video_corpus() if r.runner in RUNNER_KIND and r.family in ("wan", "wan-vae") and not r.fit
            and not r.mode.conv_direct]


@pytest.mark.parametrize("row", RECORDED, ids=[f"{r.runner}-{r.width}x{r.height}x{r.frames}-{r.mode.key}"
                                               f"{'-tiled' if r.tiled else ''}" for r in RECORDED])
def test_recorded_buffers_equal_sd_cli(wan, row):
    est = sizing(wan["components"][RUNNER_KIND[row.runner]], row.width, row.height, row.frames,
                 row.mode.flash_attn, row.tiled)
    assert close(est, row.bytes), f"{row.runner}: sd-fit {est / MiB:.2f} MiB, sd-cli {row.bytes / MiB:.2f} MiB"
