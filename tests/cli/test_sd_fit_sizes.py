"""`fitplan sd-fit` by image size on the shape-faithful SD 1.5 and SDXL checkpoints: each
component's compute figure is sd-cli's (the corpus curve, planner/sd/sd_compute.py) for the modes
seed 002 selects on its device, the VAE decode is tiled when that is what makes the plan fit,
and the verdict and largest square follow from the budgets."""
from __future__ import annotations

import pytest

from planner.cli import main
from planner.sd import sd_simulated
from planner.sd.plan import SIMULATED_MAX_SIDE
from planner.sd.sd_compute import CORPUS_MAX_SIDE, Mode, compute_bytes
from planner.synth.shapes_sd import write_checkpoint, write_flux
from tests.support.sd_fit import sd_fit_json as plan

MiB, GiB = 1024**2, 1024**3
CPU = ["--backend", "cpu", "--ram", "64GiB"]


@pytest.fixture(scope="module")
def flux(tmp_path_factory):
    return write_flux(tmp_path_factory.mktemp("flux"))


@pytest.fixture(scope="module")
def sdxl(tmp_path_factory):
    return str(write_checkpoint("sdxl", tmp_path_factory.mktemp("sd") / "sdxl.safetensors"))


def comps(p):
    return {c["module"]: c for c in p["components"]}


def test_compute_is_sd_clis_at_the_size_and_modes(capsys, sd15):
    p = plan(capsys, sd15, *CPU, "-W", "768", "-H", "512", "--flash-attn", "off", "--conv-direct", "off")
    c, off = comps(p), Mode(False, False)
    assert c["diffusion"]["compute_reserve_bytes"] == compute_bytes("sd15", "unet", 768, 512, off)
    assert c["te"]["compute_reserve_bytes"] == compute_bytes("sd15", "clip", 768, 512, off)
    assert c["vae"]["compute_reserve_bytes"] == compute_bytes("kl-f8", "vae", 768, 512, off)
    assert c["vae"]["compute_source"] == "simulated, fa=off,conv_direct=off"
    assert p["image"] == {"width": 768, "height": 512, "frames": 1, "vae_tiling": False, "batch": 1}
    assert p["verdict"] == "fits"
    assert p["flags"].endswith("-W 768 -H 512 --flash-attn off --conv-direct off")


def test_auto_modes_on_the_cpu(capsys, sd15):
    # seed 002: auto turns flash attention on for the CPU without timing; direct convolution stays off
    c = comps(plan(capsys, sd15, *CPU, "-W", "640", "-H", "640"))
    assert c["diffusion"]["compute_reserve_bytes"] == compute_bytes("sd15", "unet", 640, 640, Mode(True, False))
    assert c["diffusion"]["compute_source"] == "simulated, fa=on,conv_direct=off"


def test_legacy_switches_and_module_assignments(capsys, sd15):
    # --diffusion-fa is "off,diffusion=on": the VAE keeps ordinary attention
    c = comps(plan(capsys, sd15, *CPU, "--diffusion-fa"))
    assert c["diffusion"]["compute_reserve_bytes"] == compute_bytes("sd15", "unet", 512, 512, Mode(True, False))
    assert c["vae"]["compute_reserve_bytes"] == compute_bytes("kl-f8", "vae", 512, 512, Mode(False, False))
    c = comps(plan(capsys, sd15, *CPU, "--flash-attn", "off", "--conv-direct", "off,diffusion=on"))
    assert c["diffusion"]["compute_source"] == "simulated, fa=off,conv_direct=on"
    assert c["vae"]["compute_source"] == "simulated, fa=off,conv_direct=off"


def _manual_budget(capsys, sd15, side):
    """All three components resident on CUDA0 with --auto-fit off: the device needs every weight
    plus the largest compute buffer (planner/sd/check.py). Returns (weights, unet, clip, vae, vae tiled)."""
    c = comps(plan(capsys, sd15, *CPU, "-W", str(side), "-H", str(side), "--flash-attn", "on",
                   "--conv-direct", "off"))
    weights = sum(x["params_bytes"] for x in c.values())
    fa = Mode(True, False)
    return (weights, compute_bytes("sd15", "unet", side, side, fa), compute_bytes("sd15", "clip", side, side, fa),
            compute_bytes("kl-f8", "vae", side, side, fa), compute_bytes("kl-f8", "vae", side, side, fa, tiled=True))


def test_vae_tiling_when_the_decode_does_not_fit(capsys, sd15):
    weights, unet, clip, vae, tiled = _manual_budget(capsys, sd15, 1024)
    budget = weights + max(unet, clip, tiled) + 64 * MiB
    assert vae > budget - weights   # the untiled decode does not fit beside the weights
    device = f"CUDA0={budget + 512 * MiB}B"   # free = budget + sd-cli's 512 MiB margin
    args = [sd15, "--device", device, "--ram", "64GiB", "--auto-fit", "off", "-W", "1024", "-H", "1024",
            "--flash-attn", "on", "--conv-direct", "off"]
    p = plan(capsys, *args)
    assert p["image"]["vae_tiling"] is True and p["verdict"] == "fits with VAE tiling"
    assert comps(p)["vae"]["compute_reserve_bytes"] == tiled
    assert p["warnings"] == [] and "--vae-tiling" in p["flags"]
    # 64 MiB less than the tiled plan needs: nothing fits
    small = f"CUDA0={budget - 128 * MiB + 512 * MiB}B"
    p = plan(capsys, *[small if a == device else a for a in args])
    assert p["verdict"] == "does not fit" and p["image"]["vae_tiling"] is False


def test_largest_square_is_the_last_that_fits(capsys, sd15):
    # without flash attention the UNet's attention scores grow with N^2: a 4 GiB card stops short
    args = [sd15, "--device", "CUDA0=4GiB", "--ram", "64GiB", "--auto-fit", "off", "--flash-attn", "off",
            "--conv-direct", "off"]
    side = plan(capsys, *args)["largest_square"]
    assert side is not None and side % 64 == 0 and side < CORPUS_MAX_SIDE
    assert plan(capsys, *args, "-W", str(side), "-H", str(side))["warnings"] == []
    assert plan(capsys, *args, "-W", str(side + 64), "-H", str(side + 64))["verdict"] == "does not fit"


def test_largest_square_stops_where_the_corpus_ends(capsys, sd15, monkeypatch):
    # with the UNet's figure from its corpus curve (its simulation taken away), a 3 GiB card takes every
    # size the corpus records with flash attention and VAE tiling; sd-fit does not extrapolate the curve
    # beyond it and says so
    monkeypatch.delitem(sd_simulated.SIMULATED, ("sd15", "unet"))
    sd_simulated.simulated_bytes.cache_clear()
    args = [sd15, "--device", "CUDA0=3GiB", "--ram", "64GiB", "--auto-fit", "off", "--flash-attn", "on"]
    try:
        got = plan(capsys, *args)
        code = main(["sd-fit", *args])
        out, _ = capsys.readouterr()
    finally:
        sd_simulated.simulated_bytes.cache_clear()
    assert got["largest_square"] == CORPUS_MAX_SIDE
    assert {c["module"]: c["compute_source"] for c in got["components"]}["diffusion"].startswith("sd-cli curve, ")
    assert code == 0 and f"{CORPUS_MAX_SIDE}x{CORPUS_MAX_SIDE} or larger (sizes above it are beyond sd-cli's " \
        "recorded figures)" in out


def test_largest_square_of_a_simulated_model_goes_past_the_corpus(capsys, sd15):
    # every SD 1.5 runner is simulated: the same 3 GiB card is searched past the corpus's largest size,
    # and the answer is the last size that fits
    args = [sd15, "--device", "CUDA0=3GiB", "--ram", "64GiB", "--auto-fit", "off", "--flash-attn", "on"]
    got = plan(capsys, *args)
    assert {c["compute_source"].split(",")[0] for c in got["components"]} == {"simulated"}
    side = got["largest_square"]
    assert CORPUS_MAX_SIDE < side < SIMULATED_MAX_SIDE
    assert plan(capsys, *args, "-W", str(side), "-H", str(side))["warnings"] == []
    assert plan(capsys, *args, "-W", str(side + 64), "-H", str(side + 64))["verdict"] == "does not fit"
    # a card that takes every size searched: the answer is SIMULATED_MAX_SIDE, and sd-fit says it looked no further
    big = [sd15, "--device", "CUDA0=16GiB", "--ram", "64GiB", "--auto-fit", "off", "--flash-attn", "on"]
    assert plan(capsys, *big)["largest_square"] == SIMULATED_MAX_SIDE
    code = main(["sd-fit", *big])
    out, _ = capsys.readouterr()
    assert code == 0 and f"{SIMULATED_MAX_SIDE}x{SIMULATED_MAX_SIDE} or larger (sd-fit searches no further " \
        f"than {SIMULATED_MAX_SIDE}x{SIMULATED_MAX_SIDE})" in out


@pytest.mark.parametrize("flag,value,needle", [("-W", "500", "expected a positive multiple of 16"),
                                                ("--height", "0", "expected a positive multiple of 16"),
                                                ("-W", "-64", "expected a positive multiple of 16"),
                                                ("-W", "480", "expected positive multiples of 64")])
def test_bad_size_is_one_line_exit_2(capsys, sd15, flag, value, needle):
    # any model's sizes are multiples of 16 (Wan's); SD 1.x's of 64 (sd-cli's UNet models)
    code = main(["sd-fit", sd15, *CPU, flag, value])
    _, err = capsys.readouterr()
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_sdxl_1024_on_an_8_gib_card(capsys, sdxl):
    """The issue's question: SDXL at 1024x1024 on an 8 GiB CUDA card. Auto modes on CUDA are flash
    attention and direct convolution on; every compute figure is sd-cli's for that size and mode."""
    p = plan(capsys, sdxl, "--device", "CUDA0=8GiB", "--ram", "32GiB", "-W", "1024", "-H", "1024")
    c, on = comps(p), Mode(True, True)
    assert c["diffusion"]["compute_reserve_bytes"] == compute_bytes("sdxl", "unet", 1024, 1024, on)
    assert c["te"]["compute_reserve_bytes"] == compute_bytes("sdxl", "clip", 1024, 1024, Mode(True, False))
    # SDXL's VAE: the KL-f8 tensors, but sd-cli's SDXL decode graph ("kl-f8-sdxl"), not SD 1.5's
    # (tiled, as seed 002's retry does it: tiles of half the latent per side, 64 x 64)
    tile = (64, 64) if p["image"]["vae_tiling"] else None
    assert c["vae"]["compute_reserve_bytes"] == compute_bytes("kl-f8-sdxl", "vae", 1024, 1024, on,
                                                              tiled=tile is not None, tile=tile)
    assert c["vae"]["compute_reserve_bytes"] != compute_bytes("kl-f8", "vae", 1024, 1024, on,
                                                              tiled=tile is not None, tile=tile)
    assert p["verdict"] in ("fits", "fits with VAE tiling", "fits with parameters on the host",
                            "fits with parameters on the host and VAE tiling")


def test_flux_1024_on_a_12_gib_card(capsys, flux):
    """FLUX.1 [dev] at 1024x1024 on a 12 GiB CUDA card: the DiT's, the text encoders' and the
    autoencoder's compute are sd-cli's (CUDA's auto flash attention on, direct convolution on for
    the VAE); its 16-channel autoencoder's decode is the one SD3 and Z-Image share, tiled where the
    whole decode does not fit."""
    files = [a for flag, path in flux.items() for a in (flag, str(path))]
    p = plan(capsys, *files, "--device", "CUDA0=12GiB", "--ram", "64GiB", "-W", "1024", "-H", "1024")
    c, fa = comps(p), Mode(True, False)
    assert c["diffusion"]["compute_reserve_bytes"] == compute_bytes("flux", "flux", 1024, 1024, fa)
    assert c["te"]["compute_reserve_bytes"] == max(compute_bytes("flux", "t5", 1024, 1024, fa),
                                                   compute_bytes("flux", "clip", 1024, 1024, fa))
    assert c["vae"]["compute_reserve_bytes"] == compute_bytes("ae16", "vae", 1024, 1024, Mode(True, True),
                                                              tiled=p["image"]["vae_tiling"])
    # the 16-channel autoencoder's decode, sd-cli's for FLUX.1 ("ae16"), untiled: it fits
    assert c["vae"]["compute_reserve_bytes"] == compute_bytes("ae16", "vae", 1024, 1024, Mode(True, True))
    assert c["vae"]["compute_source"] == "simulated, fa=on,conv_direct=on"
    # 22.2 GiB of DiT weights cannot stay on a 12 GiB card: auto-fit keeps them in RAM
    assert c["diffusion"]["params"] == "cpu"
    assert p["verdict"].startswith("fits with parameters on the host")


@pytest.mark.parametrize("frames,needle", [("9", "sd15 is an image model"), ("0", "expected 1 or more")])
def test_frames_on_an_image_model_is_one_line_exit_2(capsys, sd15, frames, needle):
    code = main(["sd-fit", sd15, *CPU, "--frames", frames])
    _, err = capsys.readouterr()
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_the_text_report_shows_the_figures_behind_the_verdict(capsys, sd15):
    # one line per device: weights + compute = need of cap, as the JSON's per_device says
    args = [sd15, "--device", "CUDA0=4GiB", "--ram", "64GiB", "-W", "768", "-H", "768"]
    p = plan(capsys, *args)
    code = main(["sd-fit", *args])
    out, _ = capsys.readouterr()
    assert code == 0
    for d in p["per_device"]:
        line = next(x for x in out.splitlines() if x.strip().startswith(d["name"] + " ") and "weights" in x)
        assert f"= {d['need_bytes'] // MiB:6d} MiB of {d['cap_bytes'] // MiB:6d} MiB" in line
    assert f"768x768: {p['verdict']}" in out
