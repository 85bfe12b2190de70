"""The runners whose compute buffer is simulated (runtime/sd) rather than read off the corpus curves.

A runner is listed here only when its simulated graph reproduces every sd-cli figure the corpus records
for it (tests/runtime/sd: each to the 0.01 MB sd-cli logs);
planner/sd/sd_compute.py asks here first and falls back to its curves for everything else. The
simulation reserves the runner's graph with the runtime's graph allocator, as
GGMLRunner::alloc_compute_buffer does, so any image size is covered, not only the corpus's range, in the
buffer type of the runner's backend: the CPU's, or a Vulkan device's (BACKEND_BUFFERS; the device's facts from
planner/hardware/vulkan_devices.py).
"""
from __future__ import annotations

import functools
from collections.abc import Callable

from planner.hardware.vulkan_devices import LAVAPIPE, SUBALLOCATION_BLOCK_SIZE, VulkanDeviceFeatures, vulkan_features
from runtime.ggml.backend import UNLIMITED
from runtime.ggml.graph import Op
from runtime.ggml.profiles import Backend, device_profile
from runtime.sd import clip_text, sd3_mmdit, t5_encoder, unet, vae_decoder, wan_dit, wan_vae_decoder
from runtime.sd.sd_reserve import (
    CPU,
    LATENT_FACTOR,
    SDXL_VAE_CONV_SCALE,
    Z_IMAGE_PROMPT_TOKENS,
    BackendFallback,
    SdBackend,
    SdMode,
    clip_text_bytes,
    flux_bytes,
    flux_clip_bytes,
    llm_text_bytes,
    ltx_vae_decode_bytes,
    mmdit_bytes,
    sd3_clip_bytes,
    sdxl_clip_bytes,
    t5_bytes,
    unet_bytes,
    vae_decode_bytes,
    wan_dit_bytes,
    wan_latent_frames,
    wan_vae_decode_bytes,
    z_image_bytes,
)

# ggml-vulkan.cpp supports_op: im2col reads and writes through buffer device addresses, so the storage buffer
# range does not bound its tensors (the matmul that consumes its columns is bounded)
IM2COL_OPS = frozenset({Op.IM2COL})


def vulkan_buffers(device: VulkanDeviceFeatures, name: str = "Vulkan0") -> SdBackend:
    """A Vulkan device's default buffer type: its minStorageBufferOffsetAlignment, and the suballocation
    block (at most 1 GiB) as the largest buffer ggml-alloc asks for; and the largest tensor it accepts."""
    return SdBackend(name, device.alignment, device.max_alloc, device.max_tensor_bytes,
                     IM2COL_OPS if device.buffer_device_address else frozenset())


CPU_ROWS = "cpu"
# the backends sd-cli's figures are known for: the CPU build, and the Vulkan build on Mesa's lavapipe
BACKEND_BUFFERS: dict[str, SdBackend] = {CPU_ROWS: CPU, "vulkan": vulkan_buffers(LAVAPIPE)}


def device_buffers(backend: str, description: str, name: str) -> SdBackend | None:
    """The buffer type sd-cli's runners reserve in on the device `name` of ggml backend `backend` (a
    runtime.ggml.profiles.Backend value) described as `description`: a Vulkan device's own, None for every
    other backend (its runners are sized in the CPU buffer type). A Vulkan device fitplan has measured
    (planner/hardware/vulkan_devices.py VULKAN_DEVICES) has its own alignment, largest buffer and tensor limit;
    ggml-vulkan reads those from the driver (ggml-vulkan.cpp ggml_vk_get_device), so for any other device only
    the default suballocation block is known (1 GiB, GGML_VK_SUBALLOCATION_BLOCK_SIZE unset): the alignment is
    the one the llama.cpp side assumes for an unmeasured Vulkan device (runtime/ggml/profiles.py) and no tensor
    is refused (its maxStorageBufferRange is unknown)."""
    if backend != Backend.VULKAN.value:
        return None
    features = vulkan_features(description)
    if features is not None:
        return vulkan_buffers(features, name)
    return SdBackend(name, device_profile(Backend.VULKAN).alignment, SUBALLOCATION_BLOCK_SIZE, UNLIMITED)


def _buffers(backend: str | SdBackend) -> SdBackend:
    return backend if isinstance(backend, SdBackend) else BACKEND_BUFFERS[backend]

FLUX_T5_TOKENS = 256   # conditioner.hpp FluxCLIPEmbedder::chunk_len
SD3_T5_TOKENS = 77     # conditioner.hpp SD3CLIPEmbedder: T5's chunk is CLIP's 77 tokens
WAN_T5_TOKENS = 512    # Wan's UMT5 chunk (WanRunner text_len), masked (T5CLIPEmbedder use_mask)
# (latent width, latent height, mode, VAE tiling) -> bytes
Simulator = Callable[[int, int, SdMode, bool], int]

SIMULATED: dict[tuple[str, str], Simulator] = {
    ("sd15", "unet"): lambda w, h, mode, tiled: unet_bytes(w, h, mode),
    ("sd15", "clip"): lambda w, h, mode, tiled: clip_text_bytes(mode=mode),
    ("kl-f8", "vae"): lambda w, h, mode, tiled: vae_decode_bytes(w, h, mode, tiled),
    ("sdxl", "unet"): lambda w, h, mode, tiled: unet_bytes(w, h, mode, unet.SDXL),
    # SD 2.x: its UNet (the v-prediction probe's 8x8 graph it reserves first is always smaller) and OpenCLIP-H
    ("sd2", "unet"): lambda w, h, mode, tiled: unet_bytes(w, h, mode, unet.SD2),
    ("sd2", "clip"): lambda w, h, mode, tiled: clip_text_bytes(clip_text.SD2_CLIP_H, mode, clip_text.SD2_CLIP_SKIP),
    ("sdxl", "clip"): lambda w, h, mode, tiled: sdxl_clip_bytes(mode),
    ("flux", "clip"): lambda w, h, mode, tiled: flux_clip_bytes(mode),
    ("flux", "t5"): lambda w, h, mode, tiled: t5_bytes(FLUX_T5_TOKENS, mode=mode),
    ("flux", "flux"): lambda w, h, mode, tiled: flux_bytes(w, h, mode, n_txt=FLUX_T5_TOKENS),
    ("sd3", "clip"): lambda w, h, mode, tiled: sd3_clip_bytes(mode),
    ("sd3", "t5"): lambda w, h, mode, tiled: t5_bytes(SD3_T5_TOKENS, mode=mode),
    ("sd3", "mmdit"): lambda w, h, mode, tiled: mmdit_bytes(w, h, mode),
    ("sd3-large", "mmdit"): lambda w, h, mode, tiled: mmdit_bytes(w, h, mode, sd3_mmdit.SD35_LARGE),
    ("zimage", "z_image"): lambda w, h, mode, tiled: z_image_bytes(w, h, mode),
    # Qwen3-4B over sd-cli's prompt in Z-Image's chat template (the corpus's prompt, `a cat`)
    ("zimage", "qwen3"): lambda w, h, mode, tiled: llm_text_bytes(Z_IMAGE_PROMPT_TOKENS, mode),
    # the 16-channel autoencoder of SD3, FLUX.1 and Z-Image (one decode graph for all three)
    ("ae16", "vae"): lambda w, h, mode, tiled: vae_decode_bytes(w, h, mode, tiled, vae_decoder.AE16),
    # SDXL's checkpoint decoded by its own VAE: sd-cli scales its convolutions (planner/sd/sizing.py picks
    # this family for a KL-f8 VAE beside an SDXL UNet)
    ("kl-f8-sdxl", "vae"): lambda w, h, mode, tiled: vae_decode_bytes(w, h, mode, tiled,
                                                                      conv_scale=SDXL_VAE_CONV_SCALE),
}


# the video models: (latent width, latent height, latent frames, mode, VAE tiling) -> bytes
VideoSimulator = Callable[[int, int, int, SdMode, bool], int]

VIDEO_SIMULATED: dict[tuple[str, str], VideoSimulator] = {
    # the DiT runner is named after the model in sd-cli's log (wan.hpp WanRunner::desc)
    ("wan", "Wan2.1-T2V-1.3B"): lambda w, h, t, mode, tiled: wan_dit_bytes(w, h, t, mode),
    ("wan-14b", "Wan2.x-T2V-14B"): lambda w, h, t, mode, tiled: wan_dit_bytes(w, h, t, mode, wan_dit.WAN21_T2V_14B),
    ("wan", "t5"): lambda w, h, t, mode, tiled: t5_bytes(WAN_T5_TOKENS, t5_encoder.UMT5_XXL, mode, masked=True),
    ("wan-vae", "wan_vae"): lambda w, h, t, mode, tiled: wan_vae_decode_bytes(w, h, t, mode, tiled),
    # Wan2.2-TI2V-5B: its DiT (one timestep per latent frame) and its 48-channel VAE
    ("wan22", "Wan2.2-TI2V-5B"): lambda w, h, t, mode, tiled: wan_dit_bytes(w, h, t, mode, wan_dit.WAN22_TI2V_5B),
    ("wan22-vae", "wan_vae"): lambda w, h, t, mode, tiled: wan_vae_decode_bytes(w, h, t, mode, tiled,
                                                                             wan_vae_decoder.WAN22_VAE),
}
# image pixels per latent pixel where not LATENT_FACTOR: the Wan2.2 VAE's 16 (src/model/vae/vae.hpp
# get_scale_factor for VERSION_WAN2_2_TI2V)
VIDEO_SCALE = {"wan22": 16, "wan22-vae": 16}


# LTX-2's video VAE (runtime/sd/ltx_vae_decoder.py), decoded whole or with --temporal-tiling; its spatial
# tiles are not recorded, so sd-fit sizes no spatially tiled LTX-2 decode
LTX_VAE = ("ltx2-vae", "ltx_video_vae")
LTX_SCALE = 32   # src/model/vae/vae.hpp get_scale_factor: VERSION_LTXAV's image pixels per latent pixel


def is_simulated(family: str, runner: str) -> bool:
    return (family, runner) in SIMULATED or (family, runner) in VIDEO_SIMULATED or (family, runner) == LTX_VAE


def ltx_latent_frames(frames: int) -> int:
    """src/stable-diffusion.cpp video_frames_to_latent_frames for VERSION_LTXAV (sd-cli aligns the
    frame count down to 8k+1 the same way)."""
    return (frames - 1) // 8 + 1


@functools.lru_cache(maxsize=256)
def simulated_ltx_vae_bytes(width: int, height: int, frames: int, temporal: bool) -> int:
    """LTX-2's video VAE decode at width x height pixels and `frames` frames, whole or tiled in time."""
    return ltx_vae_decode_bytes(max(width // LTX_SCALE, 1), max(height // LTX_SCALE, 1), ltx_latent_frames(frames),
                                temporal)


@functools.lru_cache(maxsize=1024)
def _reserve(simulate: Callable[..., int], *args: object) -> int | BackendFallback:
    """`simulate(*args)`, or the refusal it raised (kept, so that a size search asks the graph once)."""
    try:
        return simulate(*args)
    except BackendFallback as refused:
        return refused


def _raised(result: int | BackendFallback) -> int:
    if isinstance(result, BackendFallback):
        raise result
    return result


@functools.lru_cache(maxsize=1024)   # sd-fit's size search asks for the same graphs repeatedly
def simulated_bytes(family: str, runner: str, width: int, height: int, flash_attn: bool, conv_direct: bool,
                    tiled: bool, backend: str | SdBackend = CPU_ROWS, graph_cuts: bool = False) -> int | None:
    """The runner's compute buffer at width x height image pixels on `backend` (a key of BACKEND_BUFFERS, or a
    device's buffer type: device_buffers), or None where it is not simulated; BackendFallback where the
    device refuses a node of the graph. `graph_cuts`: the runner plans its graph cuts first, the whole graph in
    one segment (sd-cli given a --max-vram budget for a runner on a non-CPU device: ggml_extend.hpp
    can_attempt_graph_cut_segmented_compute)."""
    simulate = SIMULATED.get((family, runner))
    if simulate is None:
        return None
    mode = SdMode(flash_attn, conv_direct, _buffers(backend), graph_cuts)
    return _raised(_reserve(simulate, width // LATENT_FACTOR, height // LATENT_FACTOR, mode, tiled))


@functools.lru_cache(maxsize=1024)
def simulated_video_bytes(family: str, runner: str, width: int, height: int, frames: int, flash_attn: bool,
                          conv_direct: bool, tiled: bool, backend: str | SdBackend = CPU_ROWS) -> int | None:
    """A video model runner's compute buffer at width x height pixels and `frames` video frames (4k+1) on
    `backend`, or None where it is not simulated; BackendFallback where the device refuses a node."""
    simulate = VIDEO_SIMULATED.get((family, runner))
    if simulate is None:
        return None
    scale = VIDEO_SCALE.get(family, LATENT_FACTOR)
    mode = SdMode(flash_attn, conv_direct, _buffers(backend))
    return _raised(_reserve(simulate, width // scale, height // scale, wan_latent_frames(frames), mode, tiled))
