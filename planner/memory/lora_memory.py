"""LoRA adapters' memory (`--lora FILE`, `--lora-scaled FILE:SCALE`), as the pinned llama.cpp loads them.

Rules, from the llama.cpp in llama-cpp-python 0.3.36:
- src/llama-adapter.cpp llama_adapter_lora_init_impl: general.type "adapter", adapter.type "lora" and the
  target's architecture; adapter.alora.invocation_tokens, when present, an array of UINT32. Tensors pair by name,
  BASE.lora_a with BASE.lora_b; `*_norm.weight` is skipped; any other name, a half pair or a BASE the model lacks
  is refused. Shapes: A.ne0 == base.ne0, B.ne1 == base.ne1, A.ne1 == B.ne0 (token_embd transposed). Types are not
  checked: each tensor keeps the file's type and size.
- Each pair goes to the buffer type of the tensor it patches, CPU_REPACK replaced by CPU; one buffer per buffer
  type, the sum of get_alloc_size padded to its alignment (ggml_backend_alloc_ctx_tensors_from_buft), logged as
  "<buffer> LoRA buffer size = X MiB".
- A tied-embedding model's output matrix is token_embd's duplicate (create_tensor TENSOR_DUPLICATED): an
  "output.weight" pair has no base, and a "token_embd.weight" pair is also found by the output matmul
  (build_lora_mm looks adapters up by name), whose shapes it does not fit: llama-server aborts
  (GGML_ASSERT(ggml_can_mul_mat)), so it is refused here when the adapter applies at start.
- common/common.cpp loads adapters after the model; common_fit_params runs before and
  llama_context::memory_breakdown lists model, context and compute only, so neither includes them.
- Compute: set_adapters_lora (unless --lora-init-without-apply; scale 0 left out) makes the warmup reserve again
  with the adapters' matmuls in the graph; that compute is the target's (runtime/engine/lora.py, reserve.py), so
  these rows hold weights only.
"""
from __future__ import annotations

from gguf import GGUFType, GGUFValueType, Keys

from planner.core.errors import GGUFError
from planner.core.units import pad
from planner.gguf.reader import ModelFile, SkippedArray, TensorInfo, read_model
from planner.llama.flags import LoraArg
from planner.llama.placement import CPU_REPACK, HOST, TensorSlot
from planner.llama.settings import LlamaSettings
from planner.memory.rows import CompanionEstimate, DeviceMemory
from planner.model.tensors import OUTPUT, TOKEN_EMBD
from runtime.engine.lora import INIT_WITHOUT_APPLY, LORA_A, LORA_B, LORA_SKIPPED, LoraPair, applies, pair_halves

__all__ = ["INIT_WITHOUT_APPLY", "LORA_A", "LORA_B", "LORA_SKIPPED", "LoraPair", "estimate_lora", "estimate_loras"]

ADAPTER_TYPE_LORA = "lora"

# What these rows say about compute (the adapter owns no compute buffer: the target's graph grows).
COMPUTE_NOTE = ("the adapter's matmuls join the target's graph (llama-server reserves again at warmup): the "
                "target's compute rows are reserved with them")
UNCOUNTED_NOTE = "llama.cpp's -fit and memory breakdown do not count adapters"


def _ne(t: TensorInfo, i: int) -> int:
    return t.shape[i] if i < len(t.shape) else 1


def check_header(adapter: ModelFile, arch: str) -> None:
    """The metadata checks llama_adapter_lora_init_impl makes before it reads a tensor."""
    meta, path = adapter.metadata, adapter.path
    general_type = meta.get(Keys.General.TYPE, "")
    if general_type != GGUFType.ADAPTER:
        raise GGUFError(path, f"expect general.type to be 'adapter', but got: {general_type!r} (llama.cpp refuses it)")
    if adapter.architecture != arch:
        raise GGUFError(path, f"model arch and LoRA arch mismatch: the adapter is for {adapter.architecture!r}, "
                              f"the model is {arch!r} (llama.cpp refuses it)")
    adapter_type = meta.get(Keys.Adapter.TYPE, "")
    if adapter_type != ADAPTER_TYPE_LORA:
        raise GGUFError(path, f"expect adapter.type to be 'lora', but got: {adapter_type!r} (llama.cpp refuses it)")
    tokens = meta.get(Keys.Adapter.ALORA_INVOCATION_TOKENS)
    if tokens is not None:
        ok = (tokens.element_type is GGUFValueType.UINT32 if isinstance(tokens, SkippedArray)
              else isinstance(tokens, (list, tuple)) and all(isinstance(t, int) and t >= 0 for t in tokens))
        if not ok:
            raise GGUFError(path, f"invalid gguf type for {Keys.Adapter.ALORA_INVOCATION_TOKENS}: an array of "
                                  f"UINT32 is required (llama.cpp refuses it)")


def lora_pairs(adapter: ModelFile) -> tuple[LoraPair, ...]:
    """The adapter's tensors bundled into (A, B) pairs by base name, in name order (std::map)."""
    halves, strays = pair_halves(adapter)
    if strays:
        raise GGUFError(adapter.path, f"LoRA tensor '{strays[0]}' has unexpected suffix (llama.cpp refuses it)")
    pairs = []
    for base in sorted(halves):
        a, b = halves[base].get(LORA_A), halves[base].get(LORA_B)
        if a is None or b is None:
            raise GGUFError(adapter.path, f"LoRA tensor pair for '{base}' is missing one component "
                                          f"(llama.cpp refuses it)")
        pairs.append(LoraPair(base, a, b))
    return tuple(pairs)


def check_pair(path: str, pair: LoraPair, base: TensorInfo) -> None:
    """llama_adapter_lora_init_impl's shape checks against the model tensor."""
    a, b = pair.a, pair.b
    if pair.base.endswith(TOKEN_EMBD):   # B is not transposed, A and B swap (llm_build_inp_embd)
        fits = _ne(base, 0) == _ne(b, 1) and _ne(base, 1) == _ne(a, 1)
    else:
        fits = _ne(base, 0) == _ne(a, 0) and _ne(base, 1) == _ne(b, 1)
    if not fits:
        raise GGUFError(path, f"tensor '{pair.base}' has incorrect shape: A {list(a.shape)}, B {list(b.shape)} for "
                              f"a base of {list(base.shape)} (llama.cpp refuses it: wrong base model?)")
    if not pair.base.endswith(TOKEN_EMBD) and _ne(a, 1) != _ne(b, 0):
        raise GGUFError(path, f"lora_a tensor is not transposed for '{pair.base}': A {list(a.shape)}, "
                              f"B {list(b.shape)} (llama.cpp refuses it)")


def _base_slot(settings: LlamaSettings, path: str, pair: LoraPair) -> TensorSlot:
    """The model tensor a pair patches, refused where llama.cpp finds none or cannot run it."""
    slot = settings.ctx.slot_by_name.get(pair.base)
    if slot is None or slot.duplicate_of:   # a tied output matrix is named token_embd.weight
        raise GGUFError(path, f"LoRA tensor '{pair.base}' does not exist in base model (llama.cpp refuses it: "
                              f"wrong base model?)")
    return slot


def tied_pairs(settings: LlamaSettings, pairs: tuple[LoraPair, ...]) -> list[str]:
    """Pairs on a weight a tied output matrix shares its name with (token_embd.weight)."""
    tied = {s.duplicate_of for s in settings.ctx.slots if s.duplicate_of and s.name == OUTPUT}
    return [p.base for p in pairs if p.base in tied]


def _refuse_tied(settings: LlamaSettings, path: str, pairs: tuple[LoraPair, ...], lora: LoraArg) -> str | None:
    """A pair on tied embeddings is also found by the output matmul (build_lora_mm looks adapters
    up by the weight's name), whose shapes it does not fit: llama.cpp aborts the first graph the
    adapter joins (GGML_ASSERT(ggml_can_mul_mat), measured with llama-server). Refused when the
    adapter applies at start; a note when it is loaded without applying."""
    tied = tied_pairs(settings, pairs)
    if not tied:
        return None
    applied = applies(settings.flags, lora)
    what = (f"LoRA tensor '{tied[0]}' patches tied embeddings: llama.cpp also applies it at the output matmul, "
            f"whose shapes it does not fit, and aborts (GGML_ASSERT(ggml_can_mul_mat) in build_lora_mm)")
    if applied:
        raise GGUFError(path, what)
    return what + " once the adapter is applied"


def adapter_rows(settings: LlamaSettings, path: str, pairs: tuple[LoraPair, ...]) -> dict[str, int]:
    """Bytes of each LoRA buffer, by the target's row names."""
    row_of = dict(settings.placement.tensor_buft)
    model = settings.ctx.model
    out: dict[str, int] = {}
    for pair in pairs:
        slot = _base_slot(settings, path, pair)
        base = model.tensor(slot.name)
        assert base is not None   # a slot that is no duplicate is a tensor of the file
        check_pair(path, pair, base)
        row = row_of[slot.name]
        if row == CPU_REPACK:   # no adapter in an extra buffer type: the CPU's own buffer type
            row = HOST
        for t in (pair.a, pair.b):
            size = settings.alloc_size(row, t.ggml_type, t.shape[0], t.n_bytes) if row in settings.row_padding \
                else t.n_bytes
            out[row] = out.get(row, 0) + pad(size, settings.alignment[row])
    return out


def _notes(settings: LlamaSettings, pairs: tuple[LoraPair, ...], lora: LoraArg) -> tuple[str, ...]:
    row_of = dict(settings.placement.tensor_buft)
    repacked = [p.base for p in pairs if row_of.get(p.base) == CPU_REPACK]
    notes = [UNCOUNTED_NOTE]
    if repacked:
        notes.append(f"{len(repacked)} patched weights are repacked (CPU_REPACK): their adapter tensors take plain "
                     f"CPU memory (llama.cpp: 'cannot use buft, fallback to CPU')")
    if lora.scale == 0.0:
        notes.append("scale 0: loaded, never applied (the graph leaves it out)")
    elif not applies(settings.flags, lora):
        notes.append(f"{INIT_WITHOUT_APPLY}: the target's compute grows once a request applies the adapter")
    elif pairs:
        notes.append(COMPUTE_NOTE)
    return tuple(notes)


def estimate_lora(target: LlamaSettings, lora: LoraArg, adapter: ModelFile | None = None) -> CompanionEstimate:
    """One adapter's buffers on the target's rows (device names, then Host)."""
    adapter = adapter or read_model(lora.path)
    check_header(adapter, target.ctx.model.architecture)
    pairs = lora_pairs(adapter)
    rows = adapter_rows(target, lora.path, pairs)
    tied = _refuse_tied(target, lora.path, pairs, lora)
    order = [d.name for d in target.devices] + [HOST]
    devices = tuple(DeviceMemory(name, rows[name], 0, 0) for name in order if name in rows)
    notes = _notes(target, pairs, lora) + ((tied,) if tied else ())
    return CompanionEstimate("lora", lora.path, devices, "formula", notes)


def estimate_loras(target: LlamaSettings) -> tuple[CompanionEstimate, ...]:
    """Every `--lora` / `--lora-scaled` adapter of the target's flags, in order."""
    return tuple(estimate_lora(target, lora) for lora in target.flags.loras)
