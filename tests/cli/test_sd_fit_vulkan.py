"""`fitplan sd-fit` with the runners placed on a Vulkan device: sized in that device's buffer type.

Expected figures are sd-cli's own, read from the recorded corpus (planner/sd/data/sd_cli_corpus.json): the rows the
Vulkan build logged on Mesa's lavapipe ("backend": "vulkan") for a lavapipe device (configs/devices/lavapipe.yaml, its
description matched to its measured limits in planner/hardware/vulkan_devices.py; with --max-vram, the rows it
logged with that budget), the CPU build's rows for a CUDA
device (sized as before) and for a Vulkan device fitplan has not measured (its storage buffer range unknown, so
nothing refused; 32-byte alignment and 1 GiB chunks, which at these sizes reserve what the CPU buffer type does).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cli import main
from planner.sd.components import COMPUTE_RESERVE
from planner.sd.roles import Kind
from planner.sd.sd_compute import CORPUS
from tests.support.sd_fit import sd_fit_json

MiB = 1 << 20
LAVAPIPE_YAML = str(Path(__file__).resolve().parents[2] / "configs" / "devices" / "lavapipe.yaml")
CPU_ONLY_YAML = str(Path(LAVAPIPE_YAML).with_name("cpu-only.yaml"))
LAVAPIPE = ["--devices", LAVAPIPE_YAML, "--device", "Vulkan0=8GiB", "--ram", "32GiB"]


def mb(n):
    """As sd-cli logs a size (the corpus keeps what it logged): MB (MiB) to two decimals."""
    return round(n / MiB, 2)


def corpus_row(family, runner, width, height, fa, cd, backend=None, max_vram=None):
    """sd-cli's logged buffer for one runner: `backend` "vulkan" for the lavapipe build's rows, None for the CPU
    build's; `max_vram` the run's --max-vram (None: without one)."""
    rows = [r for r in json.loads(CORPUS.read_text())["rows"]
            if r.get("backend") == backend and r.get("max_vram") == max_vram
            and r.get("batch", 1) == 1 and not r.get("vae_tiling", False)
            and (r["family"], r["runner"], r["width"], r["height"], r["flash_attn"], r["conv_direct"])
            == (family, runner, width, height, fa, cd)]
    assert rows, f"no sd-cli row for {family} {runner} {width}x{height} fa={fa} conv_direct={cd} on {backend}"
    return rows[0]["bytes"]


def answer(capsys, *args):
    p = sd_fit_json(capsys, *args)
    return p, {c["module"]: c for c in p["components"]}


def modes(fa, cd):
    return ["--flash-attn", "on" if fa else "off", "--conv-direct", "on" if cd else "off"]


@pytest.mark.parametrize(("width", "height", "fa", "cd"), [(320, 384, False, False), (320, 384, True, True),
                                                            (256, 256, True, False)])
def test_lavapipe_runners_are_sized_as_the_vulkan_build_logs_them(capsys, sd15, width, height, fa, cd):
    p, c = answer(capsys, sd15, *LAVAPIPE, "-W", str(width), "-H", str(height), *modes(fa, cd))
    assert c["diffusion"]["compute"] == c["te"]["compute"] == "Vulkan0"
    for module, runner in (("diffusion", "unet"), ("te", "clip")):
        logged = corpus_row("sd15", runner, width, height, fa, cd, "vulkan")
        assert mb(c[module]["compute_reserve_bytes"]) == mb(logged)
    assert c["diffusion"]["compute_source"].startswith("simulated, ")


@pytest.mark.parametrize("fa", [False, True])
def test_lavapipe_with_max_vram_is_sized_with_graph_cuts_as_logged(capsys, sd15, fa):
    """With --max-vram the runners on the device plan graph cuts first (the whole graph one segment at 8 GiB):
    the rows the Vulkan build logged with --max-vram vulkan0=8."""
    _, c = answer(capsys, sd15, *LAVAPIPE, "--max-vram", "Vulkan0=8", "-W", "320", "-H", "320", *modes(fa, False))
    logged = corpus_row("sd15", "unet", 320, 320, fa, False, "vulkan", "vulkan0=8")
    assert mb(c["diffusion"]["compute_reserve_bytes"]) == mb(logged)
    assert logged != corpus_row("sd15", "unet", 320, 320, fa, False, "vulkan")


def test_lavapipe_decode_is_sized_as_the_vulkan_build_logs_it(capsys, sd15):
    _, c = answer(capsys, sd15, *LAVAPIPE, "-W", "128", "-H", "128", *modes(False, False))
    assert c["vae"]["compute"] == "Vulkan0"
    assert mb(c["vae"]["compute_reserve_bytes"]) == mb(corpus_row("kl-f8", "vae", 128, 128, False, False, "vulkan"))


def test_a_unet_over_lavapipes_storage_range_runs_through_the_cpu_fallback(capsys, sd15):
    """SD 1.5's UNet at 384x384 without flash attention: the first level's attention scores KQ are 48*48 = 2304
    queries x 2304 keys x 8 heads of f32, over lavapipe's 128 MiB maxStorageBufferRange, so ggml-vulkan refuses
    that node and sd-cli reserves the graph with its CPU-fallback scheduler: sd-fit gives no figure on the device,
    says so, and the fixed reserve stands in. The same request on a CUDA card is sized as the CPU build logs it."""
    assert 128 * MiB < 2304 * 2304 * 8 * 4
    args = [sd15, "-W", "384", "-H", "384", *modes(False, False)]
    p, c = answer(capsys, *args, *LAVAPIPE)
    assert c["diffusion"]["compute"] == "Vulkan0"
    assert c["diffusion"]["compute_source"].startswith("CPU fallback: Vulkan0 refuses nodes of this graph")
    assert "on the host" in c["diffusion"]["compute_source"]
    assert c["diffusion"]["compute_reserve_bytes"] == COMPUTE_RESERVE[Kind.DIFFUSION]
    code = main(["sd-fit", *args, *LAVAPIPE])
    out, _ = capsys.readouterr()
    assert code == 0
    assert "DiT on Vulkan0: the device refuses nodes of its graph at this size" in out
    assert "sd-cli runs it through its CPU fallback, those nodes computing on the host" in out

    _, cuda = answer(capsys, *args, "--device", "CUDA0=8GiB", "--ram", "32GiB")
    assert cuda["diffusion"]["compute"] == "CUDA0"
    assert mb(cuda["diffusion"]["compute_reserve_bytes"]) == mb(corpus_row("sd15", "unet", 384, 384, False, False))
    assert cuda["diffusion"]["compute_source"].startswith("simulated, ")


def test_flash_attention_keeps_the_unet_on_lavapipe(capsys, sd15):
    """With flash attention no KQ is built: the same size is sized on the device (the lavapipe row at 320x384 is
    the largest recorded; at 384x384 the figure is the simulation's, not a fallback)."""
    _, c = answer(capsys, sd15, "-W", "384", "-H", "384", *modes(True, False), *LAVAPIPE)
    assert c["diffusion"]["compute_source"].startswith("simulated, ")


@pytest.mark.parametrize("where", [["--device", "Vulkan0=8GiB", "--ram", "32GiB"],
                                   ["--device", "CUDA0=8GiB", "--ram", "32GiB"],
                                   ["--devices", CPU_ONLY_YAML, "--ram", "32GiB"]])
def test_unmeasured_vulkan_cuda_and_cpu_are_sized_as_the_cpu_build_logs_them(capsys, sd15, where):
    """A Vulkan device without a description fitplan has measured: ggml-vulkan's 1 GiB chunks and no tensor
    refused (its storage range is unknown), so at 384x384 the UNet is on the device with the CPU build's figure;
    CUDA and the host unchanged."""
    _, c = answer(capsys, sd15, *where, "-W", "384", "-H", "384", *modes(False, False))
    assert mb(c["diffusion"]["compute_reserve_bytes"]) == mb(corpus_row("sd15", "unet", 384, 384, False, False))
    assert c["diffusion"]["compute_source"].startswith("simulated, ")
