"""The multimodal projector (`-mm FILE`): what llama-server's mtmd allocates for it, per device.

Placement (llama.cpp in llama-cpp-python 0.3.36):
- common/arg.cpp common_params_parse: without -mmdev, the projector follows the first -dev device
  (`-dev none` turns its offload off); -mmdev none or --no-mmproj-offload keep it on the CPU.
- tools/server/server-context.cpp load_model: mparams.use_gpu / device / flash_attn_type /
  image_min/max_tokens come from those flags; mtmd_init_from_file loads it after the target.
- tools/mtmd/clip.cpp clip_ctx::clip_ctx: with no device named, ggml_backend_init_by_type(GPU)
  takes the first GPU-type device in the registry (local GPUs are registered by
  ggml_backend_load_all before --rpc adds its servers; an RPC device is GPU-type), then an iGPU,
  else the CPU. The weights go to that backend's default buffer type: the device's row, or `Host`
  for the CPU (its plain CPU buffer type: never CPU_REPACK).

The figures come from runtime/engine (clip_hparams.py, clip.py, clip_qwen2vl.py, clip_pixtral.py,
clip_reserve.py): the weights buffer as ggml_backend_alloc_ctx_tensors makes it, and the warmup graph
reserved through the runtime's scheduler (compute "simulated"), for the SigLIP-tower projectors of
models/siglip.cpp (Gemma 3, IDEFICS3 / SmolVLM, LFM2 / LFM2-VL, Janus-Pro, Phi-4), InternVL's
(models/internvl.cpp), Pixtral's (models/pixtral.cpp), Qwen2-VL's and Qwen2.5-VL's
(models/qwen2vl.cpp), Qwen3-VL's (models/qwen3vl.cpp), Gemma 4's (models/gemma4v.cpp, gemma4uv.cpp:
clip_gemma4.py; the audio gemma4a.cpp, gemma4ua.cpp: clip_gemma4a.py, a 3000-frame warmup clip; a file with
both encoders loads two contexts, added up), Gemma 3n's
(models/mobilenetv5.cpp: clip_mobilenetv5.py), Llama 4's (models/llama4.cpp: clip_llama4.py) and GLM-4V's
(models/glm4v.cpp: clip_glm4v.py); other projector types are refused by name.
Gemma 3, Gemma 3n, Llama 4, IDEFICS3, Janus-Pro and InternVL warm up at their file's image_size, Phi-4 at 16 x 16
patches, Pixtral and Gemma 4 at 16 x 16 merged ones and the Qwen types and GLM-4V at 46 x 46 merged ones, so
--image-min/max-tokens do not change what they allocate (IDEFICS3's set_limit_image_tokens() moves
only the preprocessor's limits); LFM2's warmup image is the largest its token limit admits, and
--image-max-tokens replaces that limit (clip-model.h).
"""
from __future__ import annotations

from gguf import Keys

from planner.core.errors import BadInput, FlagError
from planner.gguf.reader import read_model
from planner.hardware.inventory import Backend
from planner.llama.placement import CPU, Device, row_of
from planner.llama.settings import LlamaSettings
from planner.memory.analytic import SIMULATED
from planner.memory.rows import CompanionEstimate, DeviceMemory
from runtime.engine.clip_hparams import HEADS
from runtime.engine.clip_reserve import ProjectorReserve, read_projector, reserve_projector

KIND = "mmproj"


def projector_device(target: LlamaSettings) -> Device | None:
    """The device clip.cpp runs the projector on, or None for the CPU alone."""
    mm, flags = target.flags.mmproj, target.flags
    if not mm.use_gpu:
        return None
    if mm.device is not None:
        wanted = mm.device
    elif flags.devices is not None:
        if flags.devices == ("none",):
            return None          # arg.cpp: devices.front() is null, so mmproj_use_gpu turns false
        wanted = flags.devices[0]
    else:
        local = [d for d in target.devices if d.backend is not Backend.RPC]
        rpc = [d for d in target.devices if d.backend is Backend.RPC]
        return (local or rpc)[0] if local or rpc else None
    found = next((d for d in target.devices if d.name.lower() == wanted.lower()), None)
    if found is None:
        raise FlagError(f"-mmdev {wanted}: not one of the devices llama.cpp would use here "
                        f"({', '.join(d.name for d in target.devices) or 'none'})")
    return found


def n_embd_inp(target: LlamaSettings) -> int:
    """llama_model_n_embd_inp, what mtmd compares the projector's width with (src/llama-hparams.cpp
    n_embd_inp: n_embd, plus n_embd per deepstack layer, {arch}.n_deepstack_layers, for Qwen3-VL's text
    models)."""
    model, n_embd = target.ctx.model, target.ctx.facts.n_embd
    n_deepstack = int(model.metadata.get(Keys.LLM.NUM_DEEPSTACK_LAYERS.format(arch=model.architecture), 0) or 0)
    return n_embd * (1 + n_deepstack)


def estimate_mmproj(target: LlamaSettings, exact_compute: bool = True) -> CompanionEstimate:
    """The projector's rows beside the target: weights where clip puts them, compute per backend.

    `exact_compute` is accepted for the companions' common signature: the projector's reserve is a
    few hundred milliseconds and cached per (file, device, -fa, --image-max-tokens), so it is always
    simulated.
    """
    mm = target.flags.mmproj
    if not mm.path:
        raise BadInput("no projector: -mm FILE was not given")
    model = read_model(mm.path)
    hp = read_projector(model, mm.image_max_tokens)
    n_embd_text = n_embd_inp(target)
    if hp.n_mmproj_embd != n_embd_text:   # mtmd.cpp mtmd_context: "mismatch between text model ... and mmproj"
        raise BadInput(f"{mm.path}: the projector's width {hp.n_mmproj_embd} is not the text model's "
                       f"n_embd {n_embd_text}; llama-server refuses the pair")
    device = projector_device(target)
    reserve = reserve_projector(model, device, target.flags.flash_attn, mm.image_max_tokens)
    head = HEADS.get(hp.projector)
    tokens_apply = head is not None and head.token_limits is not None
    return CompanionEstimate(KIND, mm.path, _rows(reserve, device), SIMULATED,
                             _notes(reserve, mm.image_min_tokens > 0 or mm.image_max_tokens > 0, tokens_apply))


def _rows(reserve: ProjectorReserve, device: Device | None) -> tuple[DeviceMemory, ...]:
    """The device row first (as the target's rows), then Host: weights there when on the CPU."""
    rows = []
    if device is not None:
        rows.append(DeviceMemory(device.name, reserve.weight_bytes, 0, reserve.compute_bytes.get(device.name, 0)))
    host_weights = reserve.weight_bytes if device is None else 0
    rows.append(DeviceMemory(row_of(CPU), host_weights, 0, reserve.compute_bytes.get(CPU, 0)))
    return tuple(rows)


def _notes(reserve: ProjectorReserve, tokens_given: bool, tokens_apply: bool) -> tuple[str, ...]:
    side = reserve.image_size
    notes = [f"projector on {reserve.device}; warmup image {side}x{side}, graph of {reserve.n_nodes} nodes, "
             f"flash attention {'enabled' if reserve.flash_attn else 'disabled'}"]
    if tokens_given and not tokens_apply:
        notes.append(f"--image-min/max-tokens leave this projector's warmup graph as it is: clip.cpp warms it "
                     f"up at {side}x{side} whatever the token limits say")
    return tuple(notes)
