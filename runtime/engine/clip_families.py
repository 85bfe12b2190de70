"""The projector families with a builder module of their own, by clip.projector_type: how
runtime/engine/clip_reserve.py reads each file's hparams, which tensors it loads and which graph it
builds (the whisper-enc audio encoders: clip_whisper.py)."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from planner.gguf.reader import ModelFile
from runtime.engine.clip_hparams import ClipHParams
from runtime.engine.clip_whisper import (
    WHISPER_HEADS,
    AudioHParams,
    WhisperEncGraph,
    read_whisper_hparams,
    whisper_tensor_names,
)
from runtime.ggml.graph import Graph, Tensor


@dataclass(frozen=True)
class ProjectorFamily:
    read: Callable[[ModelFile], ClipHParams]
    names: Callable[[ClipHParams], list[str]]
    graph: Callable[[ClipHParams, Mapping[str, Tensor], bool], Graph]


def _whisper_graph(hp: ClipHParams, w: Mapping[str, Tensor], fa: bool) -> Graph:
    assert isinstance(hp, AudioHParams)
    return WhisperEncGraph(hp, w, fa).build()


_WHISPER = ProjectorFamily(read_whisper_hparams, whisper_tensor_names, _whisper_graph)

# projb: the projector types of these modules
PROJB_FAMILIES: dict[str, ProjectorFamily] = {**{p: _WHISPER for p in WHISPER_HEADS}}
