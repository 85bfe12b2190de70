"""Applied LoRA adapters in the runtime's graphs, as the pinned llama.cpp puts them there.

Sources (llama.cpp in llama-cpp-python 0.3.36):
- src/llama-adapter.cpp llama_adapter_lora_init_impl: an adapter's tensors pair by name,
  BASE.lora_a with BASE.lora_b; `*_norm.weight` tensors are skipped. Each pair lives in the buffer
  type of the weight it patches, a CPU extra buffer type (the repack buffer) replaced by the CPU's.
- src/llama-context.cpp set_adapters_lora: adapters of scale 0 are left out of the context's set;
  common/common.cpp common_init_from_params applies the set unless --lora-init-without-apply, and
  the warmup's sched_reserve then reserves a new scheduler with the adapters in the graph.
- src/llama-graph.cpp build_lora_mm: after mul_mat(w, x), for each applied adapter with a pair on
  w (llama_adapter_lora::get_weight looks it up by w's name): mul_mat(B, mul_mat(A, x)), scale by
  adapter_scale * alpha / rank (rank = B.ne0; adapter_scale alone when alpha is 0), add to the
  result. build_inp_embd: get_rows(A, tokens), mul_mat(B, that), scale, add to the embeddings.
  The adapters are iterated in an unordered_map's order; the runtime takes the flags' order.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gguf import Keys

from planner.gguf.reader import ModelFile, TensorInfo, read_model
from planner.llama.flags import LlamaFlags, LoraArg
from planner.llama.placement import CPU_REPACK, HOST
from planner.llama.settings import LlamaSettings
from runtime.ggml import build as B
from runtime.ggml.graph import Tensor

# llama-adapter.cpp llama_adapter_lora_init_impl: the tensor-name suffixes it pairs and skips
LORA_A = ".lora_a"
LORA_B = ".lora_b"
LORA_SKIPPED = "_norm.weight"
# common/arg.cpp: load adapters without applying them (applied later through POST /lora-adapters)
INIT_WITHOUT_APPLY = "--lora-init-without-apply"


@dataclass(frozen=True)
class LoraPair:
    """One patched weight in an adapter file: BASE.lora_a and BASE.lora_b."""

    base: str
    a: TensorInfo
    b: TensorInfo


def pair_halves(adapter: ModelFile) -> tuple[dict[str, dict[str, TensorInfo]], list[str]]:
    """The adapter's tensors by base name and suffix, and the names that neither pair nor are skipped."""
    halves: dict[str, dict[str, TensorInfo]] = {}
    strays = []
    for t in adapter.tensors:
        for suffix in (LORA_A, LORA_B):
            if t.name.endswith(suffix):
                halves.setdefault(t.name.replace(suffix, ""), {})[suffix] = t
                break
        else:
            if not t.name.endswith(LORA_SKIPPED):
                strays.append(t.name)
    return halves, strays


def applies(flags: LlamaFlags, lora: LoraArg) -> bool:
    """Whether the context's graph holds the adapter at start: scale != 0, no --lora-init-without-apply."""
    return lora.scale != 0.0 and INIT_WITHOUT_APPLY not in flags.ignored


def applied_loras(flags: LlamaFlags) -> tuple[LoraArg, ...]:
    """The adapters the context's graph holds at start, in the flags' order."""
    return tuple(lora for lora in flags.loras if applies(flags, lora))


def pair_scale(adapter: ModelFile, pair: LoraPair, adapter_scale: float) -> float:
    """llama_adapter_lora_weight::get_scale: adapter_scale * alpha / rank, rank the B tensor's ne0."""
    alpha = float(adapter.metadata.get(Keys.Adapter.LORA_ALPHA, 0.0) or 0.0)
    rank = pair.b.shape[0]
    return adapter_scale * alpha / rank if alpha else adapter_scale


@dataclass(frozen=True)
class LoraWeight:
    """One applied pair as graph weights: A and B in the patched weight's buffer, and its scale."""

    a: Tensor
    b: Tensor
    scale: float


@dataclass
class Adapters:
    """The applied pairs by the name of the weight they patch, in the flags' order; `used` records the
    weights a builder looked up, so pairs no builder reaches can be told apart."""

    by_base: Mapping[str, tuple[LoraWeight, ...]] = field(default_factory=dict)
    used: set[str] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.by_base)

    def _of(self, w: Tensor) -> tuple[LoraWeight, ...]:
        found = self.by_base.get(w.name, ())
        if found:
            self.used.add(w.name)
        return found

    def mm(self, w: Tensor, x: Tensor, name: str = "") -> Tensor:
        """build_lora_mm: mul_mat(w, x) plus each applied pair's scaled mul_mat(B, mul_mat(A, x))."""
        res = B.mul_mat(w, x, name=name)
        for lw in self._of(w):
            ab = B.mul_mat(lw.b, B.mul_mat(lw.a, x))
            res = B.add(res, B.scale(ab, lw.scale))
        return res

    def mm_id(self, w: Tensor, x: Tensor, ids: Tensor, name: str = "") -> Tensor:
        """build_lora_mm_id: the experts' product plus each pair's mul_mat_id(B, mul_mat_id(A, x))."""
        res = B.mul_mat_id(w, x, ids, name=name)
        for lw in self._of(w):
            ab = B.mul_mat_id(lw.b, B.mul_mat_id(lw.a, x, ids), ids)
            res = B.add(res, B.scale(ab, lw.scale))
        return res

    def embd(self, tok_embd: Tensor, tokens: Tensor, x: Tensor) -> Tensor:
        """build_inp_embd: the token rows plus each pair's scaled mul_mat(B, get_rows(A, tokens))."""
        for lw in self._of(tok_embd):
            x = B.add(x, B.scale(B.mul_mat(lw.b, B.get_rows(lw.a, tokens)), lw.scale))
        return x

    def unreached(self) -> list[str]:
        """Patched weights no graph built so far looked up (a builder that does not apply them there)."""
        return sorted(set(self.by_base) - self.used)


@dataclass(frozen=True)
class AdapterTensor:
    """One A or B tensor of an applied adapter: the graph weight, the row its buffer is on (the
    target's row names: a device, or Host for a patched weight in CPU or CPU_REPACK), its file."""

    tensor: Tensor
    row: str
    adapter: ModelFile
    info: TensorInfo


def load_adapters(settings: LlamaSettings, weights: Mapping[str, Tensor],
                  read: Callable[[str], ModelFile] = read_model) -> tuple[Adapters, list[AdapterTensor]]:
    """The applied adapters of the settings' flags as graph weights (not yet in buffers). Pairs on a
    weight the placement does not hold, or whose halves are incomplete, are left out: the planner
    refuses such files (planner/memory/lora_memory.py) as llama.cpp does."""
    row_of = dict(settings.placement.tensor_buft)
    by_base: dict[str, list[LoraWeight]] = {}
    tensors: list[AdapterTensor] = []
    for lora in applied_loras(settings.flags):
        adapter = read(lora.path)
        halves, _strays = pair_halves(adapter)
        for base in sorted(halves):   # std::map: name order
            a, b = halves[base].get(LORA_A), halves[base].get(LORA_B)
            if a is None or b is None or base not in row_of or base not in weights:
                continue
            row = HOST if row_of[base] == CPU_REPACK else row_of[base]
            ta, tb = (Tensor(t.ggml_type, t.shape, name=t.name) for t in (a, b))
            tensors += [AdapterTensor(ta, row, adapter, a), AdapterTensor(tb, row, adapter, b)]
            scale = pair_scale(adapter, LoraPair(base, a, b), lora.scale)
            by_base.setdefault(base, []).append(LoraWeight(ta, tb, scale))
    return Adapters({k: tuple(v) for k, v in by_base.items()}), tensors
