"""Vulkan device limits that change where ggml-vulkan lets llama.cpp put tensors and run ops.

ggml-vulkan reads these from the driver when it opens a device (ggml/src/ggml-vulkan/ggml-vulkan.cpp in the pinned
llama.cpp, llama-cpp-python 0.3.36 / commit 0c1e570), and they differ by device (docs/internals/backend-profiles.md):
- `ggml_backend_vk_device_supports_op` refuses an op whose result or a source is larger than `max_buffer_size`,
  or than `maxStorageBufferRange` without VK_EXT_shader_64bit_indexing; llama.cpp asks the same of each weight
  (llama-model-loader.cpp weight_buft_supported, a 512-token test op), so such a weight is not placed there.
- `max_memory_allocation_size` = min(maxMemoryAllocationSize, maxBufferSize) with VK_KHR_maintenance4, else
  maxMemoryAllocationSize; `max_buffer_size` = maxBufferSize with maintenance4, else the former.
- the buffer type: alignment minStorageBufferOffsetAlignment, largest buffer the suballocation block
  (min(1 GiB, max_memory_allocation_size)), alloc size ggml_nbytes; the pinned host buffer `Vulkan_Host`:
  alignment minMemoryMapAlignment, 32 bytes added to every buffer.
- memory: the DEVICE_LOCAL heaps; only an INTEGRATED_GPU device is an iGPU, so lavapipe (a CPU-type device) is a
  GPU to llama.cpp, skipped unless GGML_VK_VISIBLE_DEVICES names it.

`VULKAN_DEVICES` holds the devices fitplan has measured, matched by the description llama.cpp
prints for them (`llama-cli --list-devices`, the inventory's `description`).
"""
from __future__ import annotations

from dataclasses import dataclass

from planner.hardware.inventory import DeviceKind, DeviceSpec
from runtime.ggml.profiles import Backend

MIB = 2**20
GIB = 2**30
# ggml-vulkan.cpp ggml_vk_get_device: "Limit batching of allocations to 1GB by default".
SUBALLOCATION_BLOCK_SIZE = GIB
# ggml-vulkan.cpp ggml_backend_vk_host_buffer_type_alloc_buffer: "size += 32; // Behave like the CPU buffer type".
HOST_BUFFER_EXTRA = 32


@dataclass(frozen=True)
class VulkanDeviceFeatures:
    """What `vulkaninfo` reports for one device model, as far as ggml-vulkan uses it."""

    id: str
    match: str                              # a substring of llama.cpp's description of the device
    description: str
    driver: str
    device_type: str                        # VkPhysicalDeviceType, as vulkaninfo spells it
    max_storage_buffer_range: int           # VkPhysicalDeviceLimits
    max_memory_allocation_size: int         # VkPhysicalDeviceMaintenance3Properties
    max_buffer_size: int                    # VkPhysicalDeviceMaintenance4Properties
    min_storage_buffer_offset_alignment: int
    min_memory_map_alignment: int
    heap_bytes: int                         # the DEVICE_LOCAL heaps
    maintenance4: bool
    shader_64bit_indexing: bool             # VK_EXT_shader_64bit_indexing (needs headers >= 1.4.x to be seen)
    memory_budget: bool                     # VK_EXT_memory_budget
    subgroup_size: int
    fp16: bool
    integer_dot_product: bool
    coopmat: bool
    # bufferDeviceAddress and shaderInt64: ggml-vulkan's im2col then addresses its tensors directly, and
    # supports_op does not bound them by maxStorageBufferRange
    buffer_device_address: bool = False

    @property
    def alloc_limit(self) -> int:
        """ggml-vulkan's device->max_memory_allocation_size."""
        if self.maintenance4:
            return min(self.max_memory_allocation_size, self.max_buffer_size)
        return self.max_memory_allocation_size

    @property
    def buffer_limit(self) -> int:
        """ggml-vulkan's device->max_buffer_size."""
        return self.max_buffer_size if self.maintenance4 else self.alloc_limit

    @property
    def max_tensor_bytes(self) -> int:
        """The largest source or result supports_op accepts (tensor_size_supported)."""
        if self.shader_64bit_indexing:
            return self.buffer_limit
        return min(self.buffer_limit, self.max_storage_buffer_range)

    @property
    def max_alloc(self) -> int:
        """The buffer type's get_max_size: the largest single buffer ggml-alloc asks for."""
        return min(SUBALLOCATION_BLOCK_SIZE, self.alloc_limit)

    @property
    def alignment(self) -> int:
        return self.min_storage_buffer_offset_alignment

    @property
    def host_alignment(self) -> int:
        return self.min_memory_map_alignment

    @property
    def is_integrated(self) -> bool:
        return self.device_type == "PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU"


# Mesa's lavapipe (llvmpipe), Debian 12's mesa-vulkan-drivers 22.3.6: `vulkaninfo` on the machine
# tests/data/vulkan_lavapipe.json was measured on (the record keeps the same figures).
LAVAPIPE = VulkanDeviceFeatures(
    id="lavapipe", match="llvmpipe", description="llvmpipe (LLVM 15.0.6, 256 bits)",
    driver="Mesa 22.3.6 (LLVM 15.0.6)", device_type="PHYSICAL_DEVICE_TYPE_CPU",
    max_storage_buffer_range=128 * MIB, max_memory_allocation_size=2 * GIB, max_buffer_size=0xFFFFFFFF,
    min_storage_buffer_offset_alignment=16, min_memory_map_alignment=64, heap_bytes=2 * GIB,
    maintenance4=True, shader_64bit_indexing=False, memory_budget=False, subgroup_size=8, fp16=True,
    integer_dot_product=False, coopmat=False, buffer_device_address=True,
)

VULKAN_DEVICES: dict[str, VulkanDeviceFeatures] = {LAVAPIPE.id: LAVAPIPE}


def vulkan_features(description: str) -> VulkanDeviceFeatures | None:
    """The measured features of a Vulkan device by its description; None for one not measured."""
    text = description.lower()
    return next((f for f in VULKAN_DEVICES.values() if f.match in text), None)


def vulkan_device_spec(features: VulkanDeviceFeatures, name: str = "Vulkan0") -> DeviceSpec:
    """The inventory entry llama.cpp's device list would give this device: its heaps as total and
    free memory (free = total without VK_EXT_memory_budget), a GPU unless integrated."""
    kind = DeviceKind.IGPU if features.is_integrated else DeviceKind.GPU
    return DeviceSpec(name=name, kind=kind, backend=Backend.VULKAN, total_bytes=features.heap_bytes,
                      free_bytes=features.heap_bytes, bandwidth_bytes_s=0, fp16_flops=0, link_bytes_s=0,
                      description=features.description)
