"""The runners' compute buffers on Vulkan: the simulation in a Vulkan device's buffer type (runtime/sd/sd_reserve.py
SdBackend, with the facts of Mesa's lavapipe from planner/hardware/vulkan_devices.py) against what the Vulkan sd-cli
logged on lavapipe (planner/sd/data/sd_cli_corpus.json, rows marked "backend": "vulkan", recorded by
scripts/record_sd_corpus.py --groups vulkan-sd15,vulkan-kl-f8, and with --max-vram vulkan-sd15-cuts,vulkan-sdxl-cuts),
at the 0.01 MB the log prints.
"""
from __future__ import annotations

import pytest

from planner.hardware.vulkan_devices import LAVAPIPE
from planner.sd.sd_compute import Row, backend_corpus, corpus, params_rows
from planner.sd.sd_simulated import BACKEND_BUFFERS, simulated_bytes
from runtime.ggml.backend import UNLIMITED
from runtime.ggml.graph import Op
from runtime.sd.sd_reserve import CPU, BackendFallback
from tests.support.sd_corpus import logged, row_id

MiB = 1 << 20
GiB = 1 << 30
VULKAN = BACKEND_BUFFERS["vulkan"]
ROWS = backend_corpus("vulkan")


@pytest.mark.parametrize("row", ROWS, ids=[f"{r.family}-{r.runner}-{row_id(r)}" for r in ROWS])
def test_vulkan_row_equals_the_simulation(row: Row):
    got = simulated_bytes(row.family, row.runner, row.width, row.height, row.mode.flash_attn, row.mode.conv_direct,
                          row.tiled, "vulkan", row.max_vram is not None)
    assert got is not None and logged(got) == logged(row.bytes)


def test_max_vram_rows_cover_sizes_and_switches():
    """Rows logged with --max-vram (the whole graph in one segment) at two sizes, with flash attention and
    direct convolution off, flash attention alone, and both."""
    cut = [r for r in ROWS if r.max_vram is not None and (r.family, r.runner) == ("sd15", "unet")]
    assert len({(r.width, r.height) for r in cut}) >= 2
    assert {(r.mode.flash_attn, r.mode.conv_direct) for r in cut} >= {(False, False), (True, False), (True, True)}


def test_planning_graph_cuts_grows_the_unet_buffer_where_a_cut_is_a_view():
    """With --max-vram sd-cli measures every graph-cut segment first (ggml_graph_cut.cpp
    measure_segment_compute_buffer); ggml_set_output flags a segment output's view source too, and only the
    output's own flags are restored. SD 1.5's UNet cuts after each upsampling output block, a Conv2d whose bias
    is added in place (a view of the convolution): those convolutions then stay allocated to the end. At 256x256
    that costs 4.06 MB with flash attention and direct convolution (30.55 MB logged, 26.49 without --max-vram),
    nothing without either (49.57 MB both ways: the peak lies elsewhere)."""
    def unet(fa: bool, cd: bool, graph_cuts: bool) -> int:
        got = simulated_bytes("sd15", "unet", 256, 256, fa, cd, False, "vulkan", graph_cuts)
        assert got is not None
        return got
    assert (logged(unet(True, True, False)), logged(unet(True, True, True))) == ("26.49", "30.55")
    assert logged(unet(False, False, False)) == logged(unet(False, False, True)) == "49.57"


def test_the_vulkan_rows_cover_sizes_and_switches():
    """Three sizes of the UNet with flash attention and direct convolution each on and off, CLIP, and one
    decode (sd-cli on lavapipe rarely survives the UNet step a decode row needs: scripts/record_sd_corpus.py)."""
    unet = [r for r in ROWS if (r.family, r.runner) == ("sd15", "unet")]
    assert {(r.mode.flash_attn, r.mode.conv_direct) for r in unet} == {(False, False), (True, False), (False, True),
                                                                       (True, True)}
    assert len({(r.width, r.height) for r in unet}) >= 3
    assert {(r.family, r.runner) for r in ROWS} == {("sd15", "clip"), ("sd15", "unet"), ("kl-f8", "vae"),
                                                    ("sdxl", "unet")}


def test_the_cpu_readers_leave_the_vulkan_rows_out():
    assert ROWS and all(r.backend == "cpu" for r in corpus())
    assert params_rows("vulkan") and all("backend" not in p for p in params_rows())


def test_vulkan_params_buffers_equal_the_cpu_builds():
    """Parameters are stored as read, whatever the backend: the same bytes per component (to sd-cli's 0.01 MB)."""
    cpu = {(p["family"], p["component"]): p["bytes"] for p in params_rows()}
    for p in params_rows("vulkan"):
        assert logged(p["bytes"]) == logged(cpu[(p["family"], p["component"])])


def test_lavapipes_buffer_type():
    """ggml-vulkan's buffer type: the device's minStorageBufferOffsetAlignment (16 on lavapipe) and the
    suballocation block, min(1 GiB, maxMemoryAllocationSize = 2 GiB), as the largest buffer; supports_op's
    tensor limit, maxStorageBufferRange (128 MiB) without 64-bit indexing, except for im2col (lavapipe has
    bufferDeviceAddress and shaderInt64)."""
    buft = VULKAN.buffer_type()
    assert (buft.alignment, buft.max_size) == (LAVAPIPE.min_storage_buffer_offset_alignment, 1 << 30) == (16, GiB)
    assert (VULKAN.max_tensor_bytes, VULKAN.unbounded_ops) == (128 * MiB, frozenset({Op.IM2COL}))
    assert (CPU.buffer_type().alignment, CPU.max_tensor_bytes) == (32, UNLIMITED)


def test_a_graph_lavapipe_refuses_is_not_sized():
    """SD 1.5's UNet at 384x384 without flash attention: KQ of the first level's attention is 48*48 = 2304
    queries x 2304 keys x 8 heads of f32, 162 MiB, over the 128 MiB range: sd-cli reserves that graph with its
    CPU fallback scheduler, which the simulation does not model; at 320x384 (1920^2 x 8 x 4 = 112.5 MiB) it fits."""
    assert 2304 * 2304 * 8 * 4 > 128 * MiB > 1920 * 1920 * 8 * 4
    with pytest.raises(BackendFallback, match="Vulkan0 refuses .* over 128 MiB"):
        simulated_bytes("sd15", "unet", 384, 384, False, False, False, "vulkan")
    assert simulated_bytes("sd15", "unet", 320, 384, False, False, False, "vulkan") is not None
    # with flash attention no KQ is built
    assert simulated_bytes("sd15", "unet", 384, 384, True, False, False, "vulkan") is not None

