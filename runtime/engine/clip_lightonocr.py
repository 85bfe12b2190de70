"""LightOnOCR's projector (PROJECTOR_TYPE_LIGHTONOCR): clip.cpp builds it with Pixtral's graph
(tools/mtmd/clip.cpp clip_get_graph_builder -> clip_graph_pixtral; runtime/engine/clip_pixtral.py).

Sources (llama.cpp in llama-cpp-python 0.3.36, tools/mtmd/clip.cpp):
- load_hparams (LIGHTONOCR): n_merge = clip.vision.spatial_merge_size (default 1), the preprocessor's
  longest edge, then set_warmup_n_tokens(256): Pixtral's 16 x 16 merged-token warmup image.
- load_tensors (LIGHTONOCR): Pixtral's tower and head (mm.1 / mm.2 with optional biases, the optional
  mm.input_norm and patch merger) without the [IMG_BREAK] embedding, which it never loads.
"""
from __future__ import annotations

import dataclasses

from gguf import MODEL_TENSOR, VisionProjectorType

from planner.gguf.reader import ModelFile
from runtime.engine.clip_hparams import ClipHParams, name
from runtime.engine.clip_pixtral import pixtral_tensor_names, read_pixtral_hparams

IMG_BREAK = name(MODEL_TENSOR.V_TOK_EMBD_IMG_BREAK, None, None)


def read_lightonocr_hparams(model: ModelFile) -> ClipHParams:
    return dataclasses.replace(read_pixtral_hparams(model), projector=VisionProjectorType.LIGHTONOCR)


def lightonocr_tensor_names(hp: ClipHParams) -> list[str]:
    return [n for n in pixtral_tensor_names(hp) if n != IMG_BREAK]
