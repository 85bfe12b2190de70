"""The runners' compute buffers on Vulkan: the simulation in a Vulkan device's buffer type (runtime/sd/sd_reserve.py
SdBackend), with the facts of Mesa's lavapipe (planner/hardware/vulkan_devices.py).
"""
from __future__ import annotations

import pytest

from planner.hardware.vulkan_devices import LAVAPIPE
from planner.sd.sd_simulated import BACKEND_BUFFERS, simulated_bytes
from runtime.ggml.backend import UNLIMITED
from runtime.ggml.graph import Op
from runtime.sd.sd_reserve import CPU, BackendFallback

MiB = 1 << 20
GiB = 1 << 30
VULKAN = BACKEND_BUFFERS["vulkan"]
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

