"""An LTX-2 checkpoint for sd-cli's video VAE: the video VAE shape-faithful, the rest thin stand-ins.

sd-cli (stable-diffusion.cpp 97d2990) reads a checkpoint as LTX-2 (VERSION_LTXAV) by the DiT's
AdaLN-single timestep embedder (src/model_loader.cpp `get_sd_version`) and then builds LTX's
video VAE, its DiT and its Gemma-3 text encoder, each sized from the file:
- the video VAE (src/model/vae/ltx_vae.hpp), decoder and encoder layouts read from the tensors'
  shapes (`infer_decoder_config_from_weights`, `get_default_encoder_config` where the encoder's
  blocks are not all given): LTX-2's decoder, 128 latent channels into conv_in 1024 wide, four
  mid blocks of 5 residual blocks at 1024, 512, 256 and 128 channels with a depth-to-space
  up-sampling by 2 in time and space between them (a convolution to 4x the channels), timestep
  conditioning (the decoder's `timestep_scale_multiplier`, a `scale_shift_table` per residual
  block, a timestep embedder per mid block and one last), conv_out to 3 x 4 x 4 outputs; the
  encoder as sd.cpp's LTX-2 default (4, 6, 6, 2, 2 residual blocks from 128 channels, doubling
  at each of its four down-samplings), conv_out to 128 + 1 channels; the per-channel latent
  statistics. Weights F16, biases and tables F32 (sd.cpp adds F32 biases; the file's types
  matter to the params buffer only).
- the DiT (src/model/diffusion/ltxv.hpp `LTXAVConfig::detect_from_weights`, which counts the
  blocks): LTX-2's widths (video 3840, audio 2048, 128 latent channels) with no transformer
  block, so one sampling step costs nothing; its buffers are not the real model's.
- the text encoder: `LTXAVEmbedder` reshapes the Gemma-3 hidden states to 49 x 3840 per token
  (src/conditioning/conditioner.hpp), however many layers the file has (llm.hpp counts them); a
  Gemma without layers returns two states (the embeddings and the final norm's), so one 94080
  wide (2 x 94080 = 49 x 3840) stands in with a 512-token vocabulary, and the projection reads
  the 188160 values per token as LTX-2's does. Its buffers are not the real encoder's either.
The decode's buffer depends on the VAE and the latent's size only: this file is for that runner.
"""
from __future__ import annotations

from pathlib import Path

from planner.synth.safetensors_factory import write_safetensors

Shapes = dict[str, tuple[int, ...]]
VAE = "first_stage_model."
DIT = "model.diffusion_model."
LATENT = 128
PATCH = 4                                  # ltx_vae.hpp LTXVideoVAE: patch_size 4 (3 x 4 x 4 pixels per output)
DECODER_WIDTHS = (1024, 512, 256, 128)     # one mid block of DECODER_RES residual blocks at each
DECODER_RES = 5
ENCODER_BLOCKS = (4, 6, 6, 2, 2)           # residual blocks between the down-samplings (ltx_vae.hpp defaults)
ENCODER_DOWN = ((1, 2), (2, 1), (2, 2), (2, 2))   # (time, space) factor of each down-sampling
ENCODER_BASE = 128
TIME_FREQ = 256                            # the timestep embedders' sinusoid width (ltxv.hpp TimestepEmbedder)
VIDEO, AUDIO = 3840, 2048
GEMMA_STATES, GEMMA_WIDTH = 49, 3840       # conditioner.hpp LTXAVEmbedder kNumStates, kHiddenSize
STAND_IN_VOCAB = 512


def _conv(out: Shapes, name: str, n_out: int, n_in: int) -> None:
    out[f"{name}.conv.weight"] = (n_out, n_in, 3, 3, 3)
    out[f"{name}.conv.bias"] = (n_out,)


def _linear(out: Shapes, name: str, n_out: int, n_in: int) -> None:
    out[f"{name}.weight"] = (n_out, n_in)
    out[f"{name}.bias"] = (n_out,)


def _time_embedder(out: Shapes, name: str, width: int) -> None:
    _linear(out, f"{name}.timestep_embedder.linear_1", width, TIME_FREQ)
    _linear(out, f"{name}.timestep_embedder.linear_2", width, width)


def _mid(out: Shapes, p: str, width: int, blocks: int, timestep: bool) -> None:
    if timestep:
        _time_embedder(out, f"{p}.time_embedder", 4 * width)
    for i in range(blocks):
        _conv(out, f"{p}.res_blocks.{i}.conv1", width, width)
        _conv(out, f"{p}.res_blocks.{i}.conv2", width, width)
        if timestep:
            out[f"{p}.res_blocks.{i}.scale_shift_table"] = (4, width)


def ltx2_vae_tensors() -> Shapes:
    out: Shapes = {}
    d = f"{VAE}decoder"
    _conv(out, f"{d}.conv_in", DECODER_WIDTHS[0], LATENT)
    out[f"{d}.timestep_scale_multiplier"] = (1,)
    for i, width in enumerate(DECODER_WIDTHS):
        _mid(out, f"{d}.up_blocks.{2 * i}", width, DECODER_RES, True)
        if i + 1 < len(DECODER_WIDTHS):   # depth-to-space by 2 x 2 x 2, the channels halved
            _conv(out, f"{d}.up_blocks.{2 * i + 1}.conv", 8 * width // 2, width)
    last = DECODER_WIDTHS[-1]
    _conv(out, f"{d}.conv_out", 3 * PATCH * PATCH, last)
    out[f"{d}.last_scale_shift_table"] = (2, last)
    _time_embedder(out, f"{d}.last_time_embedder", 2 * last)
    e, width = f"{VAE}encoder", ENCODER_BASE
    _conv(out, f"{e}.conv_in", width, 3 * PATCH * PATCH)
    for i, blocks in enumerate(ENCODER_BLOCKS):
        _mid(out, f"{e}.down_blocks.{2 * i}", width, blocks, False)
        if i < len(ENCODER_DOWN):   # space-to-depth: a convolution to 2x width / (t * s * s)
            ft, fs = ENCODER_DOWN[i]
            _conv(out, f"{e}.down_blocks.{2 * i + 1}.conv", 2 * width // (ft * fs * fs), width)
            width *= 2
    _conv(out, f"{e}.conv_out", LATENT + 1, width)
    out[f"{VAE}per_channel_statistics.mean-of-means"] = (LATENT,)
    out[f"{VAE}per_channel_statistics.std-of-means"] = (LATENT,)
    return out


def _adaln(out: Shapes, name: str, width: int, chunks: int) -> None:
    _time_embedder(out, f"{name}.emb", width)
    _linear(out, f"{name}.linear", chunks * width, width)


def ltx2_thin_dit_tensors() -> Shapes:
    """LTX-2's DiT at its widths with no transformer block (the names ltxv.hpp creates then)."""
    out: Shapes = {}
    _adaln(out, f"{DIT}adaln_single", VIDEO, 6)
    _adaln(out, f"{DIT}audio_adaln_single", AUDIO, 6)
    _adaln(out, f"{DIT}av_ca_video_scale_shift_adaln_single", VIDEO, 4)
    _adaln(out, f"{DIT}av_ca_audio_scale_shift_adaln_single", AUDIO, 4)
    _adaln(out, f"{DIT}av_ca_a2v_gate_adaln_single", VIDEO, 1)
    _adaln(out, f"{DIT}av_ca_v2a_gate_adaln_single", AUDIO, 1)
    for stream, width in (("", VIDEO), ("audio_", AUDIO)):
        _linear(out, f"{DIT}{stream}patchify_proj", width, LATENT)
        _linear(out, f"{DIT}{stream}proj_out", LATENT, width)
        out[f"{DIT}{stream}scale_shift_table"] = (2, width)
    return out


def gemma_stand_in_tensors() -> Shapes:
    width = GEMMA_STATES * GEMMA_WIDTH // 2
    return {"text_encoders.llm.model.embed_tokens.weight": (STAND_IN_VOCAB, width),
            "text_encoders.llm.model.norm.weight": (width,),
            "text_embedding_projection.projection.weight": (GEMMA_WIDTH, GEMMA_STATES * GEMMA_WIDTH)}


def _dtype(name: str, shape: tuple[int, ...]) -> str:
    return "F16" if name.endswith(".weight") and len(shape) >= 2 and "scale_shift_table" not in name else "F32"


def write_ltx2(path: Path) -> Path:
    """The checkpoint as one file (written once: an existing file is kept)."""
    if not path.exists():
        shapes = {**ltx2_thin_dit_tensors(), **gemma_stand_in_tensors(), **ltx2_vae_tensors()}
        write_safetensors(path, {n: (_dtype(n, s), s) for n, s in shapes.items()})
    return path
