"""The projector types whose graph builder is a module of its own, as one table (FAMILIES): how
runtime/engine/clip_reserve.py reads each file's hparams (clip.cpp load_hparams), which tensors it loads
(load_tensors), which builder makes its warmup graph (build_graph's clip_graph_*) and which tensors the
type's files carry that clip.cpp leaves unloaded. The SigLIP-tower types of clip_hparams.HEADS are the
default and have no row.

The modules: Qwen2-VL's, Qwen2.5-VL's and Qwen3-VL's (clip_qwen2vl.py), Pixtral's (clip_pixtral.py) and
LightOnOCR's on its graph (clip_lightonocr.py), Gemma 4's vision and audio (clip_gemma4.py,
clip_gemma4a.py), Gemma 3n's MobileNetV5 (clip_mobilenetv5.py), Llama 4's (clip_llama4.py), GLM-4V's
(clip_glm4v.py), the whisper-enc audio encoders (clip_whisper.py), Qwen3-ASR's (clip_qwen3a.py),
LFM2-Audio's conformer (clip_conformer.py), MiniCPM-V's resampler (clip_minicpmv.py), Kimi-VL's,
Kimi-K2.5's and PaddleOCR-VL's (clip_kimivl.py) and LLaVA's MLP (clip_llava.py).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from gguf import Keys, VisionProjectorType

from planner.gguf.reader import ModelFile
from runtime.engine.clip_conformer import ConformerGraph, conformer_tensor_names, read_conformer_hparams
from runtime.engine.clip_gemma4 import (
    GEMMA4UV,
    GEMMA4V,
    Gemma4UVGraph,
    Gemma4VGraph,
    gemma4_tensor_names,
    read_gemma4_hparams,
)
from runtime.engine.clip_gemma4a import (
    GEMMA4A,
    GEMMA4UA,
    Gemma4AGraph,
    Gemma4UAGraph,
    gemma4a_tensor_names,
    is_audio_tensor,
    read_gemma4a_hparams,
)
from runtime.engine.clip_glm4v import GLM4V, Glm4VGraph, glm4v_tensor_names, read_glm4v_hparams
from runtime.engine.clip_hparams import ClipHParams, audio_projector_type, projector_type
from runtime.engine.clip_kimivl import KimiK25Graph, KimiVLGraph, PaddleOCRGraph, kimi_tensor_names, read_kimi_hparams
from runtime.engine.clip_lightonocr import lightonocr_tensor_names, read_lightonocr_hparams
from runtime.engine.clip_llama4 import LLAMA4, Llama4Graph, llama4_tensor_names, read_llama4_hparams
from runtime.engine.clip_llava import LLAVA_MLP, LlavaGraph, llava_tensor_names, read_llava_hparams
from runtime.engine.clip_minicpmv import MINICPMV, MiniCPMVGraph, minicpmv_tensor_names, read_minicpmv_hparams
from runtime.engine.clip_mobilenetv5 import (
    GEMMA3NV,
    MobileNetV5Graph,
    gemma3n_left_in_file,
    mobilenet_tensor_names,
    read_mobilenet_hparams,
)
from runtime.engine.clip_pixtral import PixtralGraph, pixtral_tensor_names, read_pixtral_hparams
from runtime.engine.clip_qwen2vl import Qwen2VLGraph, Qwen3VLGraph, qwen2vl_tensor_names, read_qwen2vl_hparams
from runtime.engine.clip_qwen3a import Qwen3AGraph, qwen3a_tensor_names, read_qwen3a_hparams
from runtime.engine.clip_whisper import WHISPER_HEADS, WhisperEncGraph, read_whisper_hparams, whisper_tensor_names
from runtime.ggml.graph import Graph, Tensor

P = VisionProjectorType


class GraphBuilder(Protocol):
    def build(self) -> Graph: ...


@dataclass(frozen=True)
class ProjectorFamily:
    """How one projector type is read, which tensors it loads and which builder makes its warmup graph."""

    read: Callable[[ModelFile, int], ClipHParams]      # (file, --image-max-tokens; -1: the model's)
    names: Callable[[ClipHParams], list[str]]
    graph: Callable[[ClipHParams, Mapping[str, Tensor], bool], GraphBuilder]   # (hparams, weights, flash attn)
    # tensors the type's files carry that clip.cpp leaves unloaded (they count in load_hparams' model
    # size, not in the weights buffer); any other tensor the loader does not ask for is refused
    left_in_file: Callable[[str], bool] = lambda _name: False


def _fixed(read: Callable[[ModelFile], ClipHParams]) -> Callable[[ModelFile, int], ClipHParams]:
    """A reader whose warmup image (or clip) --image-max-tokens does not move."""
    return lambda model, _image_max_tokens: read(model)


_QWEN2VL = ProjectorFamily(_fixed(read_qwen2vl_hparams), qwen2vl_tensor_names, Qwen2VLGraph)
_WHISPER = ProjectorFamily(_fixed(read_whisper_hparams), whisper_tensor_names, WhisperEncGraph)

FAMILIES: dict[str, ProjectorFamily] = {
    P.QWEN2VL: _QWEN2VL,
    P.QWEN25VL: _QWEN2VL,
    P.QWEN3VL: ProjectorFamily(_fixed(read_qwen2vl_hparams), qwen2vl_tensor_names, Qwen3VLGraph),
    P.PIXTRAL: ProjectorFamily(_fixed(read_pixtral_hparams), pixtral_tensor_names, PixtralGraph),
    GEMMA4V: ProjectorFamily(_fixed(read_gemma4_hparams), gemma4_tensor_names, Gemma4VGraph, is_audio_tensor),
    GEMMA4UV: ProjectorFamily(_fixed(read_gemma4_hparams), gemma4_tensor_names, Gemma4UVGraph, is_audio_tensor),
    GEMMA3NV: ProjectorFamily(_fixed(read_mobilenet_hparams), mobilenet_tensor_names, MobileNetV5Graph,
                              gemma3n_left_in_file),
    LLAMA4: ProjectorFamily(_fixed(read_llama4_hparams), llama4_tensor_names, Llama4Graph),
    GLM4V: ProjectorFamily(_fixed(read_glm4v_hparams), glm4v_tensor_names, Glm4VGraph),
    GEMMA4A: ProjectorFamily(_fixed(read_gemma4a_hparams), gemma4a_tensor_names, Gemma4AGraph),
    GEMMA4UA: ProjectorFamily(_fixed(read_gemma4a_hparams), gemma4a_tensor_names, Gemma4UAGraph),
    **{p: _WHISPER for p in WHISPER_HEADS},
    P.QWEN3A: ProjectorFamily(_fixed(read_qwen3a_hparams), qwen3a_tensor_names, Qwen3AGraph),
    P.LFM2A: ProjectorFamily(_fixed(read_conformer_hparams), conformer_tensor_names, ConformerGraph),
    MINICPMV: ProjectorFamily(_fixed(read_minicpmv_hparams), minicpmv_tensor_names, MiniCPMVGraph),
    # Kimi-K2.5's warmup follows --image-max-tokens where its file has no pixel keys
    P.KIMIVL: ProjectorFamily(read_kimi_hparams, kimi_tensor_names, KimiVLGraph),
    P.KIMIK25: ProjectorFamily(read_kimi_hparams, kimi_tensor_names, KimiK25Graph),
    P.PADDLEOCR: ProjectorFamily(read_kimi_hparams, kimi_tensor_names, PaddleOCRGraph),
    LLAVA_MLP: ProjectorFamily(_fixed(read_llava_hparams), llava_tensor_names, LlavaGraph),
    P.LIGHTONOCR: ProjectorFamily(_fixed(read_lightonocr_hparams), lightonocr_tensor_names, PixtralGraph),
}


def family_type(model: ModelFile) -> str:
    """The projector type of the context clip_init loads first: the vision one (clip_hparams.projector_type),
    else, for a file without a vision encoder, the audio one (Qwen3-ASR writes only clip.audio.projector_type)."""
    vision = projector_type(model)
    if vision or model.metadata.get(Keys.Clip.HAS_VISION_ENCODER):
        return vision
    return audio_projector_type(model)
