"""The runners' compute buffers on Vulkan against the Vulkan sd-cli live (scripts/build_sd_cpp.sh --vulkan, built on
first use), on Mesa's lavapipe (GGML_VK_VISIBLE_DEVICES=0): the shape-faithful SD 1.5 checkpoint at sizes outside
the recorded Vulkan rows (planner/sd/data/sd_cli_corpus.json, "backend": "vulkan"), each run stopped once CLIP's
and the UNet's buffers are logged (before any sampling). The simulation reserves the graphs in lavapipe's buffer
type (planner/sd/sd_simulated.py BACKEND_BUFFERS) and must equal sd-cli to the 0.01 MB its log prints; the params
buffers on Vulkan0 must equal what the CPU build stores.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from planner.sd.sd_cli import ensure_sd_cli, run_sd_cli, sd_cli_path, source_tarball
from planner.sd.sd_compute import backend_corpus, params_rows
from planner.sd.sd_simulated import simulated_bytes
from planner.synth.shapes_sd import write_checkpoint
from tests.support.sd_corpus import logged

pytestmark = pytest.mark.peer

# width, height, flash attention, direct convolution: every tensor within lavapipe's 128 MiB storage buffer range
CASES = [(384, 256, False, False), (448, 448, True, True)]


@pytest.fixture(scope="module")
def sd_cli_vulkan() -> Path:
    """The Vulkan build of sd-cli (built from the vendored snapshot on first use)."""
    if sd_cli_path("vulkan") is None and not source_tarball().is_file():
        pytest.skip(f"the Vulkan sd-cli is not built and its source snapshot {source_tarball()} is absent "
                    "(set FITPLAN_SD_CPP_SOURCE to the stable-diffusion.cpp-97d2990-ggml-8e800ce tarball)")
    return ensure_sd_cli(backend="vulkan")


@pytest.fixture(scope="module")
def sd15(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint("sd15", tmp_path_factory.mktemp("sd15-vk") / "sd15.safetensors")


def test_live_sizes_are_not_in_the_vulkan_rows():
    recorded = {(r.width, r.height, r.mode.flash_attn, r.mode.conv_direct) for r in backend_corpus("vulkan")}
    assert recorded and not recorded & set(CASES)


@pytest.mark.parametrize("width,height,fa,conv", CASES, ids=[f"{w}x{h}-fa{int(f)}-cd{int(c)}" for w, h, f, c in CASES])
def test_vulkan_buffers_equal_sd_cli(sd_cli_vulkan, sd15, width, height, fa, conv):
    args = ["-m", str(sd15), "-p", "a cat", "-W", str(width), "-H", str(height), "--steps", "1", "--cfg-scale", "1",
            "-t", "2", "--seed", "1", "--mmap", "-o", str(sd15.with_suffix(".png")), "--backend", "vulkan0"]
    args += ["--fa"] if fa else []
    args += ["--diffusion-conv-direct", "--vae-conv-direct"] if conv else []
    truth = run_sd_cli(args, exe=sd_cli_vulkan, stop_when=["clip", "unet"], timeout_s=1200, backend="vulkan")
    # on the device: sd-cli's log says VRAM for the params buffers and the compute buffers alike
    assert {where for where, _, _ in truth.params} == {"VRAM"}
    assert re.search(r"unet compute buffer size: [0-9.]+ MB\(VRAM\)", truth.text)
    cpu = {p["component"]: p["bytes"] for p in params_rows() if p["family"] == "sd15"}
    assert {name: logged(size) for name, size in truth.totals} == {name: logged(cpu[name]) for name, _ in truth.totals}
    for family, runner in (("sd15", "clip"), ("sd15", "unet")):
        got = simulated_bytes(family, runner, width, height, fa, conv, False, "vulkan")
        assert got is not None and logged(got) == logged(truth.compute_of(runner)), runner
