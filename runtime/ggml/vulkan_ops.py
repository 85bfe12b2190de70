"""The ops a Vulkan device refuses, as far as the scheduler's placement depends on them
(ggml-vulkan.cpp ggml_backend_vk_device_supports_op at the pinned build):

- any op whose result or a source is larger than the device's largest buffer (tensor_size_supported:
  lavapipe's 128 MiB maxStorageBufferRange keeps Gemma 3's 512-token logits and -c 32768 -fa off
  scores on the CPU);
- MUL_MAT_ID asked for F32 precision (mistral4's down experts: ggml_prec_set_src);
- MUL_MAT / MUL_MAT_ID whose weight and activations differ in their fourth dimension ("could
  potentially support these with 2 dispatches": DeepSeek-V2's MLA value projection over several KV
  streams runs on the CPU), or whose quantized sources are not contiguous in their first two
  dimensions (ggml_vk_dim01_contiguous);
- LIGHTNING_INDEXER but for heads of 128 over keys of lightning_indexer_k_types (ggml-vulkan-types.h),
  every operand's elements packed.
"""
from __future__ import annotations

from collections.abc import Callable

from gguf import GGML_QUANT_SIZES

from runtime.ggml.graph import GGMLType, Op, Tensor

_FLOAT = frozenset({GGMLType.F32, GGMLType.F16, GGMLType.BF16})


def dim01_contiguous(t: Tensor) -> bool:
    """ggml_vk_dim01_contiguous: rows packed, row after row, and the 3rd/4th dimensions in order."""
    block, type_size = GGML_QUANT_SIZES[t.type]
    return (t.nb[0] == type_size and t.nb[1] == t.nb[0] * t.ne[0] // block
            and (t.ne[3] == 1 or t.nb[3] == t.nb[2] * t.ne[2]))


def _matmul_ok(t: Tensor) -> bool:
    if t.op is Op.MUL_MAT_ID and t.op_params.get("prec_src_f32"):
        return False
    weight, acts = t.src[0], t.src[1]
    assert weight is not None and acts is not None
    dims_from = t.src[2] if t.op is Op.MUL_MAT_ID else weight
    if dims_from is None or dims_from.ne[3] != acts.ne[3]:
        return False
    if not (dim01_contiguous(weight) or weight.type in _FLOAT):
        return False
    return dim01_contiguous(acts) or acts.type in (GGMLType.F32, GGMLType.F16)


# dsv4: ggml-vulkan's lightning indexer: its shader's head size and the key types it has pipelines for
LID_HEAD = 128
LID_K_TYPES = frozenset({GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q8_0, GGMLType.Q5_1, GGMLType.Q5_0,
                         GGMLType.Q4_1, GGMLType.Q4_0, GGMLType.IQ4_NL})


def _lightning_indexer_ok(t: Tensor) -> bool:
    q, k = t.src[0], t.src[1]
    assert q is not None and k is not None
    if q.ne[0] != LID_HEAD or k.type not in LID_K_TYPES:
        return False
    for x in (*t.src, t):
        if x is None:
            continue
        size = GGML_QUANT_SIZES[x.type][1]
        if x.nb[0] != size or any(nb % size for nb in x.nb[1:]):
            return False
    return True


def vulkan_supports(limit: int) -> Callable[[Tensor], bool]:
    """supports_op of a Vulkan device whose largest buffer is `limit` bytes (0: no limit)."""
    def supports(t: Tensor) -> bool:
        if limit and (t.nbytes() > limit or any(s is not None and s.nbytes() > limit for s in t.src)):
            return False
        if t.op is Op.LIGHTNING_INDEXER:
            return _lightning_indexer_ok(t)
        return t.op not in (Op.MUL_MAT, Op.MUL_MAT_ID) or _matmul_ok(t)
    return supports
