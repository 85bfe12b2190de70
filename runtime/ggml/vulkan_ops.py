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
- LIGHTNING_INDEXER unless its heads are 128 wide, its keys of a type the shader reads
  (lightning_indexer_k_types) and every operand's elements packed (the shader indexes by element);
- DSV4_HC_COMB on a device whose subgroups have fewer than 16 lanes (lavapipe's 8: no pipeline is made).
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


# glm5n, dsv4: the key types ggml-vulkan's lightning indexer shader reads (ggml-vulkan-types.h
# lightning_indexer_k_types)
_INDEXER_K_TYPES = frozenset({GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q8_0, GGMLType.Q5_1, GGMLType.Q5_0,
                              GGMLType.Q4_1, GGMLType.Q4_0, GGMLType.IQ4_NL})
INDEXER_HEAD = 128           # the lightning indexer shader's block size: the head it takes
HC_COMB_MIN_SUBGROUP = 16    # dsv4_hc_comb keeps a token's 4 x 4 matrix in one 16-lane slice of a subgroup


def _indexer_ok(t: Tensor) -> bool:
    """The head and key type, then q, k, weights, mask and the scores each with packed elements: nb[0] one
    element and every other stride a whole number of them (the strides are divided down from bytes)."""
    q, k = t.src[0], t.src[1]
    assert q is not None and k is not None
    if q.ne[0] != INDEXER_HEAD or k.type not in _INDEXER_K_TYPES:
        return False
    for x in (*t.src, t):
        if x is None:
            continue
        size = GGML_QUANT_SIZES[x.type][1]
        if x.nb[0] != size or any(nb % size for nb in x.nb[1:]):
            return False
    return True


def vulkan_supports(limit: int, subgroup_size: int = 0) -> Callable[[Tensor], bool]:
    """supports_op of a Vulkan device whose largest buffer is `limit` bytes (0: no limit) and whose subgroups have
    `subgroup_size` lanes (0: not measured, taken as wide enough)."""
    comb_ok = subgroup_size == 0 or subgroup_size >= HC_COMB_MIN_SUBGROUP

    def supports(t: Tensor) -> bool:
        if limit and (t.nbytes() > limit or any(s is not None and s.nbytes() > limit for s in t.src)):
            return False
        if t.op is Op.LIGHTNING_INDEXER:
            return _indexer_ok(t)
        if t.op is Op.DSV4_HC_COMB:        # glm5n: no pipeline without 16-lane subgroups
            return comb_ok
        return t.op not in (Op.MUL_MAT, Op.MUL_MAT_ID) or _matmul_ok(t)
    return supports
