"""`fitplan sd-fit` where sd-cli's own auto-fit placement is over budget (planner/sd/ladder.py): the
answer is the first explicit --params-backend placement that fits, flagged `auto_fit_fails`, or, where
none does, `does not fit` with the closest placement's needs; where auto-fit fits nothing changes."""
from __future__ import annotations

import json

import pytest

from planner.cli import main
from planner.sd.sd_compute import Mode, video_compute_bytes
from planner.synth.shapes_wan import write_wan22

MiB = 1 << 20
GiB = 1 << 30
SIZE = ["--width", "1280", "--height", "704", "--frames", "121"]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> list[str]:
    f = write_wan22(tmp_path_factory.mktemp("wan22"), "Q8_0")
    return [a for flag, p in f.items() for a in (flag, str(p))]


def plan(capsys, files, *args, fmt: str = "json"):
    code = main(["sd-fit", *files, *args, "--format", fmt])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out) if fmt == "json" else out


def by_module(got: dict) -> dict[str, dict]:
    return {c["module"]: c for c in got["components"]}


def device(got: dict, name: str) -> dict:
    return next(d for d in got["per_device"] if d["name"] == name)


def test_wan22_720p_121_frames_fits_with_an_explicit_placement(capsys, files):
    got = plan(capsys, files, *SIZE, "--device", "CUDA0=24GiB", "--ram", "32GiB")
    c = by_module(got)
    assert got["auto_fit_fails"] is True
    assert got["mode"] == "manual"   # the flags are an explicit --params-backend: auto-fit off
    assert got["verdict"] == "fits with parameters on the host and VAE tiling"
    # one component moved (the diffusion model: moving the text encoder or the VAE alone does not fit)
    assert got["params_backend"] == "diffusion=cpu"
    assert "--params-backend diffusion=cpu" in got["flags"] and "--vae-tiling" in got["flags"]
    assert "--auto-fit" not in got["flags"]
    # the GPU holds the resident weights and the largest compute buffer, the simulated tiled VAE decode
    tiled = video_compute_bytes("wan22-vae", "wan_vae", 1280, 704, 121, Mode(flash_attn=True, conv_direct=True),
                                tiled=True)
    assert tiled is not None and c["vae"]["compute_reserve_bytes"] == tiled
    assert "vae_tiling=on" in c["vae"]["compute_source"] and c["vae"]["compute_source"].startswith("simulated")
    cuda = device(got, "CUDA0")
    assert cuda["need_bytes"] == tiled + c["te"]["params_bytes"] + c["vae"]["params_bytes"]
    assert cuda["fits"] and cuda["need_bytes"] <= cuda["cap_bytes"]
    assert device(got, "RAM")["weights_bytes"] == c["diffusion"]["params_bytes"]
    # auto-fit's own placement keeps every weight on the card: with the tiled decode it is over
    weights = sum(x["params_bytes"] for x in c.values())
    assert weights + tiled > cuda["cap_bytes"]
    assert got["largest_frames"] > got["largest_frames_auto_fit"]


def test_the_text_says_auto_fit_would_fail(capsys, files):
    out = plan(capsys, files, *SIZE, "--device", "CUDA0=24GiB", "--ram", "32GiB", fmt="text")
    assert out.startswith("explicit placement (sd-cli's auto-fit would not fit; compute on CUDA0):")
    assert "sd-cli's auto-fit would not fit this" in out
    assert "1280x704x121 frames: fits with parameters on the host and VAE tiling" in out


def test_short_ram_puts_weights_on_disk(capsys, files):
    got = plan(capsys, files, *SIZE, "--device", "CUDA0=24GiB", "--ram", "4GiB")
    c = by_module(got)
    assert got["auto_fit_fails"] is True
    assert "disk" in got["verdict"] and "disk" in got["params_backend"]
    # the diffusion model's weights do not fit the RAM budget, so they come from disk
    assert c["diffusion"]["params_bytes"] > got["ram"]["params_budget_bytes"]
    assert c["diffusion"]["params_location"] == "disk"
    assert not got["warnings"] and all(d["fits"] for d in got["per_device"])


def test_nothing_fits_gives_the_closest_needs(capsys, files):
    got = plan(capsys, files, *SIZE, "--device", "CUDA0=8GiB", "--ram", "32GiB")
    assert got["verdict"] == "does not fit" and got["auto_fit_fails"] is True
    assert got["mode"] == "auto-fit"   # the plan shown stays auto-fit's
    closest = got["closest"]
    cuda = next(d for d in closest["per_device"] if d["name"] == "CUDA0")
    # the closest placement keeps no weight on the card: what is left is the tiled decode (plus staging)
    tiled = video_compute_bytes("wan22-vae", "wan_vae", 1280, 704, 121, Mode(flash_attn=True, conv_direct=True),
                                tiled=True)
    assert tiled is not None
    assert cuda["weights_bytes"] == 0 and cuda["compute_bytes"] >= tiled and not cuda["fits"]
    assert cuda["need_bytes"] < device(got, "CUDA0")["need_bytes"]
    assert "--params-backend" in closest["flags"] and "--vae-tiling" in closest["flags"]
    out = plan(capsys, files, *SIZE, "--device", "CUDA0=8GiB", "--ram", "32GiB", fmt="text")
    assert "no explicit placement fits either; the closest needs:" in out


def test_where_auto_fit_fits_nothing_changes(capsys, files):
    got = plan(capsys, files, "--width", "320", "--height", "192", "--frames", "9", "--device", "CUDA0=24GiB",
               "--ram", "32GiB")
    assert got["auto_fit_fails"] is False and got["closest"] is None and got["mode"] == "auto-fit"
    assert got["verdict"] == "fits"
    assert got["largest_frames"] == got["largest_frames_auto_fit"]


def test_explicit_flags_are_not_replanned(capsys, files):
    """A user's own --params-backend is sd-cli's placement as written: no ladder."""
    got = plan(capsys, files, *SIZE, "--device", "CUDA0=8GiB", "--ram", "32GiB", "--params-backend", "vae=cpu")
    assert got["auto_fit_fails"] is False and got["verdict"] == "does not fit" and got["closest"] is None
