"""`fitplan sd-fit --frames N` on Wan2.1-T2V-1.3B's shape-faithful files: the frame count reaches
the sizing (each component's buffer is the corpus's at width x height x frames) and the flags
(sd-cli's --video-frames), and the report gives the most frames that fit at the size."""
from __future__ import annotations

import json

import pytest

from planner.cli import main
from planner.sd.plan import MAX_RECORDED_FRAMES, SIMULATED_MAX_FRAMES
from planner.sd.sd_compute import WAN_DIT, Mode, video_compute_bytes
from planner.synth.shapes_wan import write_wan

SIZE = ["--width", "416", "--height", "240", "--conv-direct", "off"]


@pytest.fixture(scope="module")
def wan(tmp_path_factory):
    return [a for flag, path in write_wan(tmp_path_factory.mktemp("wan")).items() for a in (flag, str(path))]


def plan(capsys, *args):
    code = main(["sd-fit", *args, "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_frames_reach_the_sizing_and_the_flags(capsys, wan):
    p = plan(capsys, *wan, *SIZE, "--frames", "9", "--device", "CUDA0=24GiB", "--ram", "32GiB")
    c = {x["module"]: x for x in p["components"]}
    fa = Mode(True, False)
    assert c["diffusion"]["compute_reserve_bytes"] == video_compute_bytes("wan", WAN_DIT, 416, 240, 9, fa)
    assert c["vae"]["compute_reserve_bytes"] == video_compute_bytes("wan-vae", "wan_vae", 416, 240, 9, fa)
    assert p["image"]["frames"] == 9 and "--video-frames 9" in p["flags"]


def test_most_frames_that_fit(capsys, wan):
    # the decode grows with the frames (sd-cli decodes every frame in one graph, tiled or not): a
    # card with room for the weights and a tiled 9-frame decode, not a tiled 13-frame one, takes 9
    base = [*wan, *SIZE, "--auto-fit", "off", "--ram", "32GiB"]
    weights = sum(x["params_bytes"] for x in plan(capsys, *base, "--backend", "cpu")["components"])
    fa = Mode(True, False)
    tiled = {f: video_compute_bytes("wan-vae", "wan_vae", 416, 240, f, fa, tiled=True) for f in (9, 13)}
    assert tiled[9] < tiled[13]
    free = weights + (tiled[9] + tiled[13]) // 2 + 512 * 1024**2   # the budget: free less 512 MiB
    p = plan(capsys, *base, "--device", f"CUDA0={free}B")
    assert p["largest_frames"] == 9 and p["largest_square"] is None
    assert plan(capsys, *base, "--device", f"CUDA0={free}B", "--frames", "9")["verdict"] == "fits with VAE tiling"
    assert plan(capsys, *base, "--device", f"CUDA0={free}B", "--frames", "13")["verdict"] == "does not fit"


def test_wan_frames_must_be_4k_plus_1(capsys, wan):
    code = main(["sd-fit", *wan, *SIZE, "--frames", "8", "--device", "CUDA0=24GiB"])
    _, err = capsys.readouterr()
    assert code == 2 and "4k+1" in err and len(err.strip().splitlines()) == 1


def test_frames_of_a_simulated_model_go_past_the_corpus(capsys, wan):
    # every Wan runner is simulated (runtime/sd): the frame search runs to SIMULATED_MAX_FRAMES (81, Wan's
    # usual longest clip), past the corpus's 33; a card with room for all of them says it looked no further
    p = plan(capsys, *wan, *SIZE, "--device", "CUDA0=96GiB", "--ram", "32GiB")
    assert {c["compute_source"].split(",")[0] for c in p["components"]} == {"simulated"}
    assert p["largest_frames"] == SIMULATED_MAX_FRAMES > MAX_RECORDED_FRAMES
    code = main(["sd-fit", *wan, *SIZE, "--device", "CUDA0=96GiB", "--ram", "32GiB"])
    out, _ = capsys.readouterr()
    assert code == 0 and f": {SIMULATED_MAX_FRAMES} or more (sd-fit searches no further than " \
        f"{SIMULATED_MAX_FRAMES})" in out
    # the 81-frame plan fits as sized: its DiT buffer is the simulated one at 81 frames
    at = plan(capsys, *wan, *SIZE, "--frames", str(SIMULATED_MAX_FRAMES), "--device", "CUDA0=96GiB", "--ram", "32GiB")
    dit = {c["module"]: c for c in at["components"]}["diffusion"]["compute_reserve_bytes"]
    assert at["warnings"] == [] and dit == video_compute_bytes("wan", WAN_DIT, 416, 240, SIMULATED_MAX_FRAMES,
                                                               Mode(True, False))


def test_batch_on_a_video_model_is_one_line_exit_2(capsys, wan):
    # sd-cli's vid_gen makes one clip: its parameters have no batch count (sd_vid_gen_params_t)
    code = main(["sd-fit", *wan, *SIZE, "--batch", "2", "--device", "CUDA0=24GiB"])
    _, err = capsys.readouterr()
    assert code == 2 and "image models only" in err and len(err.strip().splitlines()) == 1
