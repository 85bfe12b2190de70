"""A model read once for llama.cpp: its header, architecture facts and the weights llama.cpp creates.

Every later stage (the estimate, the planner's search, the runtime's graph builders) takes a
`ModelContext` instead of a path, so a model's header is parsed, and its facts derived, once.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from planner.core.errors import BadInput
from planner.gguf.pin_lists import pin_architectures
from planner.gguf.reader import ModelFile, read_model
from planner.llama.flags import LlamaFlags
from planner.llama.nextn import loads_mtp, nextn_loaded, nextn_tensor_loaded
from planner.llama.placement import TensorSlot, tensor_slots
from planner.model.arch import ModelFacts, model_facts
from planner.model.shapes import Shapes, model_shapes
from planner.registry.examples import resolve_model


@dataclass(frozen=True)
class ModelContext:
    """A model read once: header, architecture facts and the weight list llama.cpp creates."""

    model: ModelFile
    facts: ModelFacts
    slots: tuple[TensorSlot, ...]

    @functools.cached_property
    def trunk_slots(self) -> tuple[TensorSlot, ...]:
        """The weights without the nextn (MTP) blocks', but for those their architecture allocates
        whatever load_mtp says (planner/llama/nextn.py NEXTN_ALWAYS_LOADED)."""
        first, end, arch = self.facts.n_layer, self.facts.n_layer_all, self.model.architecture
        return tuple(s for s in self.slots if not first <= s.layer < end or nextn_tensor_loaded(arch, s.name))

    def loaded_slots(self, flags: LlamaFlags) -> tuple[TensorSlot, ...]:
        """The weights llama.cpp allocates under these flags: the nextn blocks' only where the
        architecture loads them (planner/llama/nextn.py)."""
        if nextn_loaded(self.model.architecture, loads_mtp(flags)):
            return self.slots
        return self.trunk_slots

    @functools.cached_property
    def slot_bytes(self) -> dict[str, int]:
        """Bytes of each weight llama.cpp creates, by name."""
        return {s.name: s.n_bytes for s in self.slots}

    @functools.cached_property
    def slot_by_name(self) -> dict[str, TensorSlot]:
        return {s.name: s for s in self.slots}

    @functools.cached_property
    def shapes(self) -> Shapes:
        """The widths the model's graph materialises, worked out once per model."""
        return model_shapes(self.model, self.facts)


# Every form a model is given in: a path or `example:NAME`, a header already read, or a context.
ModelLike = str | os.PathLike[str] | ModelFile | ModelContext


# what a GGUF named `clip` is to llama.cpp: mtmd's projector file (tools/mtmd/clip.cpp), loaded by -mm
PROJECTOR_ARCH = "clip"


def check_architecture(mf: ModelFile) -> None:
    """BadInput for a file the pinned llama.cpp would not load as a model: llama_model_loader maps
    general.architecture through llm_arch_from_string and stops on a name it does not know with
    "unknown model architecture: '<name>'" (src/llama-model.cpp:371)."""
    arch = mf.architecture
    if arch in pin_architectures():
        return
    what = f"general.architecture {arch!r}" if arch else "no general.architecture"
    hint = (": it is a multimodal projector; pass it with -mm beside the text model" if arch == PROJECTOR_ARCH
            else "")
    raise BadInput(f"{mf.path}: {what} is not an architecture of the pinned llama.cpp, which refuses the file "
                   f"(\"unknown model architecture: '{arch}'\"){hint}")


def model_context(model: ModelLike) -> ModelContext:
    if isinstance(model, ModelContext):
        return model
    mf = model if isinstance(model, ModelFile) else read_model(resolve_model(str(model)))
    check_architecture(mf)
    facts = model_facts(mf)
    return ModelContext(mf, facts, tensor_slots(mf, facts.n_layer_all))
