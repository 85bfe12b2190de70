"""The projector families with a builder module of their own, by clip.projector_type: how
runtime/engine/clip_reserve.py reads each file's hparams, which tensors it loads and which graph it
builds (the whisper-enc audio encoders: clip_whisper.py; Qwen3-ASR's: clip_qwen3a.py; MiniCPM-V's
resampler: clip_minicpmv.py; Kimi-VL's, Kimi-K2.5's and PaddleOCR-VL's: clip_kimivl.py; LFM2-Audio's conformer:
clip_conformer.py; LLaVA's MLP: clip_llava.py; LightOnOCR's, on clip_pixtral.py's graph: clip_lightonocr.py)."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gguf import Keys, VisionProjectorType

from planner.gguf.reader import ModelFile
from runtime.engine.clip_conformer import ConformerGraph, conformer_tensor_names, read_conformer_hparams
from runtime.engine.clip_hparams import ClipHParams, projector_type
from runtime.engine.clip_kimivl import KimiK25Graph, KimiVLGraph, PaddleOCRGraph, kimi_tensor_names, read_kimi_hparams
from runtime.engine.clip_lightonocr import lightonocr_tensor_names, read_lightonocr_hparams
from runtime.engine.clip_llava import LLAVA_MLP, LlavaGraph, llava_tensor_names, read_llava_hparams
from runtime.engine.clip_minicpmv import (
    MINICPMV,
    MiniCPMVGraph,
    MiniCPMVHParams,
    minicpmv_tensor_names,
    read_minicpmv_hparams,
)
from runtime.engine.clip_pixtral import PixtralGraph
from runtime.engine.clip_qwen3a import Qwen3AGraph, qwen3a_tensor_names, read_qwen3a_hparams
from runtime.engine.clip_whisper import (
    WHISPER_HEADS,
    AudioHParams,
    WhisperEncGraph,
    audio_projector_type,
    read_whisper_hparams,
    whisper_tensor_names,
)
from runtime.ggml.graph import Graph, Tensor


@dataclass(frozen=True)
class ProjectorFamily:
    read: Callable[[ModelFile, int], ClipHParams]     # (file, --image-max-tokens)
    names: Callable[[ClipHParams], list[str]]
    graph: Callable[[ClipHParams, Mapping[str, Tensor], bool], Graph]


def _whisper_graph(hp: ClipHParams, w: Mapping[str, Tensor], fa: bool) -> Graph:
    assert isinstance(hp, AudioHParams)
    return WhisperEncGraph(hp, w, fa).build()


def _qwen3a_graph(hp: ClipHParams, w: Mapping[str, Tensor], fa: bool) -> Graph:
    assert isinstance(hp, AudioHParams)
    return Qwen3AGraph(hp, w, fa).build()


def _minicpmv_graph(hp: ClipHParams, w: Mapping[str, Tensor], fa: bool) -> Graph:
    assert isinstance(hp, MiniCPMVHParams)
    return MiniCPMVGraph(hp, w, fa).build()


def _conformer_graph(hp: ClipHParams, w: Mapping[str, Tensor], fa: bool) -> Graph:
    assert isinstance(hp, AudioHParams)
    return ConformerGraph(hp, w, fa).build()


def _kimi_graph(hp: ClipHParams, w: Mapping[str, Tensor], fa: bool) -> Graph:
    builders = {VisionProjectorType.KIMIK25: KimiK25Graph, VisionProjectorType.PADDLEOCR: PaddleOCRGraph}
    return builders.get(hp.projector, KimiVLGraph)(hp, w, fa).build()


def _pixtral_graph(hp: ClipHParams, w: Mapping[str, Tensor], fa: bool) -> Graph:
    return PixtralGraph(hp, dict(w), fa).build()


def _llava_graph(hp: ClipHParams, w: Mapping[str, Tensor], fa: bool) -> Graph:
    return LlavaGraph(hp, w, fa).build()


_WHISPER = ProjectorFamily(lambda m, _: read_whisper_hparams(m), whisper_tensor_names, _whisper_graph)

# projb: the projector types of these modules
PROJB_FAMILIES: dict[str, ProjectorFamily] = {
    **{p: _WHISPER for p in WHISPER_HEADS},
    VisionProjectorType.QWEN3A: ProjectorFamily(lambda m, _: read_qwen3a_hparams(m), qwen3a_tensor_names,
                                                _qwen3a_graph),
    MINICPMV: ProjectorFamily(lambda m, _: read_minicpmv_hparams(m), minicpmv_tensor_names, _minicpmv_graph),
    **{p: ProjectorFamily(read_kimi_hparams, kimi_tensor_names, _kimi_graph)
       for p in (VisionProjectorType.KIMIVL, VisionProjectorType.KIMIK25, VisionProjectorType.PADDLEOCR)},
    VisionProjectorType.LIGHTONOCR: ProjectorFamily(lambda m, _: read_lightonocr_hparams(m), lightonocr_tensor_names,
                                                    _pixtral_graph),
    LLAVA_MLP: ProjectorFamily(lambda m, _: read_llava_hparams(m), llava_tensor_names, _llava_graph),
    VisionProjectorType.LFM2A: ProjectorFamily(lambda m, _: read_conformer_hparams(m), conformer_tensor_names,
                                               _conformer_graph),
}


def projb_type(model: ModelFile) -> str:
    """The file's projector type as its builder here reads it: the vision one (clip_hparams.projector_type),
    else, for a file without a vision encoder, clip.audio.projector_type (Qwen3-ASR writes only that)."""
    vision = projector_type(model)
    if vision or model.metadata.get(Keys.Clip.HAS_VISION_ENCODER):
        return vision
    return audio_projector_type(model)
