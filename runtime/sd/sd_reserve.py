"""A stable-diffusion.cpp runner's compute buffer, by reserving its graph with the runtime's graph allocator.

Sources (stable-diffusion.cpp 97d2990, src/core/ggml_extend.hpp GGMLRunner): get_compute_graph makes two
one-element inputs first (`one`, f32, and `zero_int`, i32), builds the runner's graph, and expands those two
into it last; alloc_compute_buffer, on a single backend, makes one ggml_gallocr for the backend's default
buffer type and reserves the graph with ggml_gallocr_reserve; the logged "compute buffer size" is that
allocator's buffer, in the runtime backend's default buffer type (SdBackend): the CPU's (32-byte alignment, sizes
as ggml_nbytes, no largest buffer), or a Vulkan device's (ggml-vulkan.cpp ggml_backend_vk_buffer_type_*: the
device's minStorageBufferOffsetAlignment, sizes as ggml_nbytes, and the suballocation block as the largest
buffer, past which ggml-alloc opens another chunk; the logged size is the sum of the chunks). The graphs the
modelled runners build are the same on both (stable-diffusion.cpp's Vulkan branches change only a matmul's
precision flag). A runner whose graph has a node the backend refuses is reserved by a scheduler with a CPU
fallback instead (alloc_compute_buffer: graph_requires_backend_fallback), which logs no compute buffer and is
not modelled: such a reserve raises BackendFallback. ggml-vulkan refuses a node whose result or a source is larger
than maxStorageBufferRange (without 64-bit indexing; im2col through buffer device addresses excepted), which on
lavapipe is 128 MiB (ggml-vulkan.cpp ggml_backend_vk_device_supports_op, tensor_size_supported).
Inputs the runner sets from the host (make_input) are graph leafs allocated in the same buffer; parameters
live in their own buffer. The ggml-alloc.c of sd.cpp's ggml (8e800ce) differs from llama.cpp's pinned one
only in CLAMP not being an in-place op, which these graphs never use.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from planner.core.errors import FitplanError
from runtime.ggml.alloc import GraphAllocator, PlannedGraph
from runtime.ggml.backend import UNLIMITED, BufferType, make_cpu, make_virtual
from runtime.ggml.graph import FLAG_OUTPUT, GGMLType, Graph, Op, Tensor
from runtime.sd import (
    clip_text,
    flux_dit,
    llm_text,
    ltx_vae_decoder,
    sd3_mmdit,
    t5_encoder,
    unet,
    vae_decoder,
    vae_encoder,
    wan_dit,
    wan_vae_decoder,
    z_image_dit,
)
from runtime.sd.sd_blocks import Blocks

LATENT_FACTOR = 8   # the KL-f8 VAE: 8 image pixels per latent pixel
# src/model/vae/vae.hpp get_tile_sizes: without --vae-tile-size or a relative size a decode tile is 32 latent
# pixels a side, clamped to the latent's side and to at least 4
VAE_TILE = 32
VAE_MIN_TILE = 4
# src/stable-diffusion.cpp: an SDXL model decoded by its own VAE (no --vae, or --force-sdxl-vae-conv-scale)
# scales every Conv2d's input by 1/32 and its output back (the fp16 overflow fix), two more nodes per conv
SDXL_VAE_CONV_SCALE = 1.0 / 32.0


@dataclass(frozen=True)
class SdBackend:
    """The default buffer type of a runner's runtime backend, as far as ggml-alloc uses it, and the largest
    tensor its supports_op accepts. `alignment` None: the CPU buffer type's own (ggml-impl.h TENSOR_ALIGNMENT)."""

    name: str = "CPU"
    alignment: int | None = None
    max_size: int = UNLIMITED
    max_tensor_bytes: int = UNLIMITED
    unbounded_ops: frozenset[Op] = frozenset()   # ops whose own tensors max_tensor_bytes does not bound

    def buffer_type(self) -> BufferType:
        if self.alignment is None:
            return make_cpu(UNLIMITED).buffer_type
        return make_virtual(self.name, UNLIMITED, alignment=self.alignment, max_alloc=self.max_size).buffer_type


CPU = SdBackend()


@dataclass(frozen=True)
class SdMode:
    """The runner switches that change a graph (--fa / --diffusion-fa, --*-conv-direct), and the backend
    whose buffer type the graph is reserved in."""

    flash_attn: bool = False
    conv_direct: bool = False
    backend: SdBackend = CPU
    graph_cuts: bool = False   # sd-cli plans the runner's graph cuts (--max-vram on a non-CPU backend)


def cpu_buffer_type() -> BufferType:
    return CPU.buffer_type()


class BackendFallback(FitplanError):
    """The runner's graph has nodes its backend refuses: sd-cli reserves it with a scheduler and a CPU
    fallback, whose buffers are not modelled."""

    exit_code = 1
    code = "backend_fallback"


def refused_nodes(graph: Graph, backend: SdBackend) -> list[Tensor]:
    """The nodes `backend` refuses by size: a source or the result larger than max_tensor_bytes."""
    def too_big(t: Tensor | None) -> bool:
        return t is not None and t.nbytes() > backend.max_tensor_bytes
    return [n for n in graph.nodes if n.op not in backend.unbounded_ops and (too_big(n) or any(map(too_big, n.src)))]


def reserve_graph(buft: BufferType, outputs: list[Tensor], backend: SdBackend | None = None) -> int:
    """Bytes of the one compute buffer ggml_gallocr_reserve makes for the graph of `outputs` (in order);
    BackendFallback where `backend` refuses a node."""
    graph = Graph()
    for out in outputs:
        graph.expand(out)
    bounded = backend is not None and backend.max_tensor_bytes < UNLIMITED
    refused = refused_nodes(graph, backend) if backend is not None and bounded else []
    if backend is not None and refused:
        biggest = max(refused, key=lambda n: max(t.nbytes() for t in (n, *n.src) if t is not None))
        raise BackendFallback(f"{backend.name} refuses {len(refused)} node(s) of this graph (the largest tensor at "
                              f"{biggest.op.value} {biggest.name!r}, over {backend.max_tensor_bytes / 2**20:.0f} MiB); "
                              "sd-cli reserves it with a CPU fallback, whose buffers are not modelled")
    planned = PlannedGraph(graph.nodes, [0] * len(graph.nodes), graph.leafs, [0] * len(graph.leafs))
    return GraphAllocator([buft]).plan(planned)[0]


def flag_cut_sources(outputs: list[Tensor]) -> None:
    """What planning graph cuts leaves on the graph (src/core/ggml_graph_cut.cpp build_plan and
    apply_max_vram_budget measure every segment with measure_segment_compute_buffer): build_segment_graph
    calls ggml_set_output on each segment output, which flags the tensor and its view source (ggml.c
    ggml_set_output walks view_src), and the measurement restores the flags of the outputs alone. A cut output
    that is a view (a Conv2d's bias added in place) thus leaves its source flagged as an output, which
    ggml-alloc never frees (ggml_gallocr_free_node), in the graph the runner then reserves whole."""
    for t in outputs:
        if t.view_src is not None:
            t.view_src.flags |= FLAG_OUTPUT


def runner_reserve(build: Callable[[Blocks], Tensor | list[Tensor]], mode: SdMode, conv_scale: float = 1.0) -> int:
    """GGMLRunner's reserve of the graph `build` makes (its outputs in the order they are expanded):
    `one` and `zero_int` are expanded after it."""
    buft = mode.backend.buffer_type()
    blocks = Blocks(buft, mode.flash_attn, mode.conv_direct, conv_scale)
    one = Tensor(GGMLType.F32, (1, 1, 1, 1), name="ggml_runner_build_in_tensor:one")
    zero_int = Tensor(GGMLType.I32, (1, 1, 1, 1), name="ggml_runner_build_in_tensor:zero_int")
    blocks.one = one
    built = build(blocks)
    if mode.graph_cuts and blocks.cut_points:
        flag_cut_sources([*blocks.cut_points, *(built if isinstance(built, list) else [built])])
    return reserve_graph(buft, [*(built if isinstance(built, list) else [built]), one, zero_int], mode.backend)


def vae_tile_side(latent_side: int, tile: int = VAE_TILE) -> int:
    """A decode tile's side in latent pixels (get_tile_sizes with a requested size of `tile`)."""
    return max(min(tile, latent_side), VAE_MIN_TILE)


def vae_decode_bytes(latent_w: int, latent_h: int, mode: SdMode = SdMode(), tiled: bool = False,
                     cfg: vae_decoder.VaeConfig = vae_decoder.KL_F8, conv_scale: float = 1.0) -> int:
    """The VAE runner's compute buffer for decoding one latent of latent_w x latent_h pixels; `tiled`
    (--vae-tiling): every tile's graph is the same, so the buffer is one tile's; `conv_scale`: the
    Conv2d scale the runner was given (SDXL_VAE_CONV_SCALE for SDXL's own VAE)."""
    if tiled:
        latent_w, latent_h = vae_tile_side(latent_w), vae_tile_side(latent_h)

    def build(b: Blocks) -> Tensor:
        z = Tensor(GGMLType.F32, (latent_w, latent_h, cfg.z_channels, 1), name="z")
        return vae_decoder.decode(b, z, cfg)
    return runner_reserve(build, mode, conv_scale)


def vae_encode_bytes(width: int, height: int, mode: SdMode = SdMode(),
                     cfg: vae_decoder.VaeConfig = vae_decoder.KL_F8, conv_scale: float = 1.0) -> int:
    """The VAE runner's compute buffer for encoding one width x height image, untiled (img2img's init image)."""
    def build(b: Blocks) -> Tensor:
        x = Tensor(GGMLType.F32, (width, height, cfg.out_ch, 1), name="x")
        return vae_encoder.encode(b, x, cfg)
    return runner_reserve(build, mode, conv_scale)


def clip_text_bytes(cfg: clip_text.ClipTextConfig = clip_text.CLIP_L, mode: SdMode = SdMode(),
                    clip_skip: int = 1, pooled: bool = False) -> int:
    """A CLIP text runner's compute buffer for one 77-token chunk (the image size does not enter)."""
    def build(b: Blocks) -> Tensor:
        ids = Tensor(GGMLType.I32, (clip_text.N_TOKEN, 1, 1, 1), name="input_ids")
        mask = Tensor(GGMLType.F32, (clip_text.N_TOKEN, clip_text.N_TOKEN, 1, 1), name="attention_mask")
        return clip_text.text_model(b, ids, mask, cfg, clip_skip, pooled)
    return runner_reserve(build, mode)


def sdxl_clip_bytes(mode: SdMode = SdMode()) -> int:
    """SDXL's text encoders, each runner reserving its own buffer, one after the other (conditioner.hpp
    get_learned_condition_common: CLIP-L's hidden states, bigG's, then bigG's pooled output; clip_skip 2
    for the hidden states): the largest of the three is what the component needs at once."""
    return max(clip_text_bytes(clip_text.SDXL_CLIP_L, mode, clip_skip=2),
               clip_text_bytes(clip_text.SDXL_CLIP_G, mode, clip_skip=2),
               clip_text_bytes(clip_text.SDXL_CLIP_G, mode, pooled=True))


def unet_bytes(latent_w: int, latent_h: int, mode: SdMode = SdMode(), cfg: unet.UnetConfig = unet.SD1,
               n_context: int = clip_text.N_TOKEN) -> int:
    """The UNet runner's compute buffer for one call on a latent of latent_w x latent_h pixels (batch 1: sd-cli
    runs the conditional and unconditional passes as separate calls) with `n_context` text tokens."""
    def build(b: Blocks) -> Tensor:
        x = Tensor(GGMLType.F32, (latent_w, latent_h, cfg.in_channels, 1), name="x")
        timesteps = Tensor(GGMLType.F32, (1, 1, 1, 1), name="timesteps")
        context = Tensor(GGMLType.F32, (cfg.context_dim, n_context, 1, 1), name="context")
        y = Tensor(GGMLType.F32, (cfg.adm_in_channels, 1, 1, 1), name="y") if cfg.adm_in_channels else None
        return unet.unet(b, x, timesteps, context, cfg, y)
    return runner_reserve(build, mode)


def t5_bytes(n_token: int, cfg: t5_encoder.T5Config = t5_encoder.T5_XXL, mode: SdMode = SdMode(),
             masked: bool = False) -> int:
    """The T5 runner's compute buffer for one chunk of `n_token` tokens (FLUX.1: 256; Wan's UMT5: 512, with
    its attention mask as an input, `masked`)."""
    def build(b: Blocks) -> Tensor:
        ids = Tensor(GGMLType.I32, (n_token, 1, 1, 1), name="input_ids")
        mask = Tensor(GGMLType.F32, (n_token, 1, 1, 1), name="attention_mask") if masked else None
        buckets = Tensor(GGMLType.I32, (n_token, n_token, 1, 1), name="relative_position_bucket")
        return t5_encoder.t5_encoder(b, ids, buckets, cfg, mask)
    return runner_reserve(build, mode)


def sd3_clip_bytes(mode: SdMode = SdMode(), clip_skip: int = -1) -> int:
    """SD3's CLIP-L and CLIP-G, each run for the chunk's hidden states and then its pooled output
    (conditioner.hpp SD3CLIPEmbedder), one runner after the other: the largest of the four buffers."""
    return max(clip_text_bytes(cfg, mode, clip_skip=clip_skip, pooled=pooled)
               for cfg in (clip_text.SD3_CLIP_L, clip_text.SD3_CLIP_G) for pooled in (False, True))


def flux_clip_bytes(mode: SdMode = SdMode()) -> int:
    """FLUX.1's CLIP-L: only its pooled output is used (conditioner.hpp FluxCLIPEmbedder), no projection."""
    return clip_text_bytes(clip_text.CLIP_L, mode, pooled=True)


FLUX_LATENT_CHANNELS = 16   # FLUX.1's autoencoder: 16 channels per latent pixel, 64 after 2x2 patches


def flux_bytes(latent_w: int, latent_h: int, mode: SdMode = SdMode(), cfg: flux_dit.FluxConfig = flux_dit.FLUX1,
               n_txt: int = 256) -> int:
    """The FLUX.1 DiT runner's compute buffer for one call on a latent_w x latent_h latent with `n_txt` T5
    tokens (FLUX.1's 256-token chunk)."""
    def build(b: Blocks) -> Tensor:
        x = Tensor(GGMLType.F32, (latent_w, latent_h, FLUX_LATENT_CHANNELS, 1), name="x")
        timesteps = Tensor(GGMLType.F32, (1, 1, 1, 1), name="timesteps")
        context = Tensor(GGMLType.F32, (cfg.context_in_dim, n_txt, 1, 1), name="context")
        y = Tensor(GGMLType.F32, (cfg.vec_in_dim, 1, 1, 1), name="y")
        guidance = Tensor(GGMLType.F32, (1, 1, 1, 1), name="guidance") if cfg.guidance_embed else None
        n_img = (latent_w // cfg.patch_size) * (latent_h // cfg.patch_size)
        pe = Tensor(GGMLType.F32, (2, 2, cfg.axes_dim_sum // 2, n_txt + n_img), name="pe")
        return flux_dit.flux(b, x, timesteps, context, y, guidance, pe, cfg)
    return runner_reserve(build, mode)


SD3_CONTEXT_TOKENS = 154   # conditioner.hpp SD3CLIPEmbedder: 77 CLIP-L/G tokens, then 77 T5 tokens


def mmdit_bytes(latent_w: int, latent_h: int, mode: SdMode = SdMode(),
                cfg: sd3_mmdit.MMDiTConfig = sd3_mmdit.SD35_MEDIUM, n_context: int = SD3_CONTEXT_TOKENS) -> int:
    """The MMDiT runner's compute buffer for one call on a latent_w x latent_h latent with `n_context`
    context tokens. --diffusion-conv-direct does not reach it: stable-diffusion.cpp enables direct
    convolution only on the UNet runner, so its patch embedding stays an im2col convolution."""
    mode = replace(mode, conv_direct=False)
    def build(b: Blocks) -> Tensor:
        x = Tensor(GGMLType.F32, (latent_w, latent_h, cfg.in_channels, 1), name="x")
        timesteps = Tensor(GGMLType.F32, (1, 1, 1, 1), name="timesteps")
        context = Tensor(GGMLType.F32, (cfg.context_size, n_context, 1, 1), name="context")
        y = Tensor(GGMLType.F32, (cfg.adm_in_channels, 1, 1, 1), name="y")
        return sd3_mmdit.mmdit(b, x, timesteps, context, y, cfg)
    return runner_reserve(build, mode)


WAN_TIME_FACTOR = 4   # Wan 2.1's VAE: 4 video frames per latent frame after the first


def wan_latent_frames(frames: int) -> int:
    return (frames - 1) // WAN_TIME_FACTOR + 1


def wan_dit_bytes(latent_w: int, latent_h: int, latent_t: int, mode: SdMode = SdMode(),
                  cfg: wan_dit.WanConfig = wan_dit.WAN21_T2V_1_3B) -> int:
    """The Wan DiT runner's compute buffer for one call on a latent_w x latent_h x latent_t latent with the
    512-token text context. Direct convolution does not reach it (stable-diffusion.cpp enables it on the UNet
    runner only)."""
    mode = replace(mode, conv_direct=False)
    pt, ph, pw = cfg.patch

    def build(b: Blocks) -> Tensor:
        x = Tensor(GGMLType.F32, (latent_w, latent_h, latent_t, cfg.in_dim), name="x")
        timesteps = Tensor(GGMLType.F32, (latent_t if cfg.per_frame_time else 1, 1, 1, 1), name="timesteps")
        context = Tensor(GGMLType.F32, (cfg.text_dim, cfg.text_len, 1, 1), name="context")
        n_pos = (latent_t // pt) * (latent_h // ph) * (latent_w // pw)
        pe = Tensor(GGMLType.F32, (2, 2, cfg.axes_dim_sum // 2, n_pos), name="pe")
        return wan_dit.wan(b, x, timesteps, context, pe, cfg)
    return runner_reserve(build, mode)


# conditioner.hpp: Z-Image's prompt in its chat template, "<|im_start|>user\n" + prompt +
# "<|im_end|>\n<|im_start|>assistant\n"; sd-cli's "a cat" is 10 Qwen tokens
Z_IMAGE_PROMPT_TOKENS = 10
# the template's own tokens: <|im_start|> user \n before the prompt, <|im_end|> \n <|im_start|> assistant \n
# after it (LLMEmbedder tokenizes the three parts apart, pads nothing and keeps every token:
# prompt_template_encode_start_idx 0)
Z_IMAGE_TEMPLATE_TOKENS = 8


def z_image_bytes(latent_w: int, latent_h: int, mode: SdMode = SdMode(),
                  cfg: z_image_dit.ZImageConfig = z_image_dit.Z_IMAGE_TURBO,
                  n_txt: int = Z_IMAGE_PROMPT_TOKENS) -> int:
    """The Z-Image DiT runner's compute buffer for one call on a latent_w x latent_h latent (even sides) with
    `n_txt` caption tokens. Direct convolution does not reach it (no convolutions)."""
    mode = replace(mode, conv_direct=False)
    p = cfg.patch_size

    def build(b: Blocks) -> Tensor:
        x = Tensor(GGMLType.F32, (latent_w, latent_h, cfg.in_channels, 1), name="x")
        timesteps = Tensor(GGMLType.F32, (1, 1, 1, 1), name="timesteps")
        context = Tensor(GGMLType.F32, (cfg.cap_feat_dim, n_txt, 1, 1), name="context")
        n_img = (latent_w // p) * (latent_h // p)
        n_pos = n_txt + z_image_dit.pad_to(n_txt) + n_img + z_image_dit.pad_to(n_img)
        pe = Tensor(GGMLType.F32, (2, 2, cfg.axes_dim_sum // 2, n_pos), name="pe")
        return z_image_dit.z_image(b, x, timesteps, context, pe, cfg)
    return runner_reserve(build, mode)


def wan_vae_decode_bytes(latent_w: int, latent_h: int, latent_t: int, mode: SdMode = SdMode(),
                         tiled: bool = False,
                         cfg: wan_vae_decoder.WanVaeConfig = wan_vae_decoder.WAN21_VAE) -> int:
    """The Wan VAE runner's compute buffer for decoding a latent_w x latent_h x latent_t latent; `tiled`: one
    spatial tile's decode (VAE_TILE latent pixels a side, all frames), as for the image VAEs."""
    if tiled:
        latent_w, latent_h = vae_tile_side(latent_w), vae_tile_side(latent_h)

    def build(b: Blocks) -> Tensor:
        z = Tensor(GGMLType.F32, (latent_w, latent_h, latent_t, cfg.z_dim), name="z")
        return wan_vae_decoder.decode(b, z, cfg)
    return runner_reserve(build, mode)


Z_IMAGE_LLM_OUT_LAYER = 35   # conditioner.hpp: Z-Image takes Qwen3-4B's hidden states of layer 35 (-2)


def llm_text_bytes(n_tokens: int, mode: SdMode = SdMode(), cfg: llm_text.LlmConfig = llm_text.QWEN3_4B,
                   out_layer: int = Z_IMAGE_LLM_OUT_LAYER) -> int:
    """The LLM runner's compute buffer for a prompt of `n_tokens` tokens (the image size does not enter;
    flash attention is never used by this runner)."""
    def build(b: Blocks) -> Tensor:
        ids = Tensor(GGMLType.I32, (n_tokens, 1, 1, 1), name="input_ids")
        pos = Tensor(GGMLType.I32, (n_tokens, 1, 1, 1), name="input_pos")
        mask = Tensor(GGMLType.F32, (n_tokens, n_tokens, 1, 1), name="attention_mask")
        return llm_text.text_model(b, ids, pos, mask, out_layer, cfg)
    return runner_reserve(build, mode)


def _ltx_timestep() -> Tensor:
    return Tensor(GGMLType.F32, (1, 1, 1, 1), name="timestep")


def _ltx_tile_bytes(latent_w: int, latent_h: int, tile: ltx_vae_decoder.Tile, prev: list[tuple[int, ...]] | None,
                    cfg: ltx_vae_decoder.LtxVaeConfig) -> tuple[int, list[tuple[int, ...]]]:
    """One temporal tile's buffer and the shapes of the feature-cache copies it leaves the next tile."""
    caches: list[Tensor] = []

    def build(b: Blocks) -> list[Tensor]:
        z = Tensor(GGMLType.F32, (latent_w, latent_h, tile.frames, cfg.latent), name="z")
        out, new = ltx_vae_decoder.decode_tile(b, z, _ltx_timestep(), tile, prev, cfg)
        caches.extend(new)
        return [*new, out]
    size = runner_reserve(build, SdMode())
    return size, [c.ne for c in caches]


def ltx_vae_decode_bytes(latent_w: int, latent_h: int, latent_t: int, temporal: bool = False,
                         cfg: ltx_vae_decoder.LtxVaeConfig = ltx_vae_decoder.LTX2_VAE) -> int:
    """LTX-2's video VAE runner's compute buffer for a latent_w x latent_h x latent_t latent; `temporal`
    (--temporal-tiling, more than one latent frame): the largest of its tiles' buffers, each tile a graph
    reserved on its own (the feature-cache copies expanded ahead of the output)."""
    if not temporal or latent_t <= 1:
        def build(b: Blocks) -> Tensor:
            z = Tensor(GGMLType.F32, (latent_w, latent_h, latent_t, cfg.latent), name="z")
            return ltx_vae_decoder.decode(b, z, _ltx_timestep(), cfg)
        return runner_reserve(build, SdMode())
    sizes: list[int] = []
    prev: list[tuple[int, ...]] | None = None
    for tile in ltx_vae_decoder.tiles(latent_t):
        size, prev = _ltx_tile_bytes(latent_w, latent_h, tile, prev, cfg)
        sizes.append(size)
    return max(sizes)
