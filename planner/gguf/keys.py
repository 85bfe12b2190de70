"""The GGUF type llama.cpp reads each metadata key fitplan uses as: a key of another type is an error.

llama.cpp does not coerce: `llama_model_loader::get_key` goes through `GGUFMeta::GKV<T>::get_kv`, which
throws "key %s has wrong type %s but expected type %s" unless the stored type is exactly T's
(src/llama-model-loader.cpp at the pinned build, llama-cpp-python 0.3.36); `get_key_or_arr` also takes
an array whose elements are UINT32 or INT32 for a uint32_t per-layer key (get_arr's type_ok), and
gguf.cpp refuses a `general.alignment` that is not UINT32 (gguf_init_from_file_impl). The C++ member
each key lands in (llama_hparams, llama_vocab, llama_model_loader's split fields) gives the type.
Keys are gguf-py's `Keys` templates, formatted with the file's architecture.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from gguf import GGUFValueType, Keys

T = GGUFValueType

# Metadata keys llama.cpp reads that gguf-py 0.19's `Keys` lacks, spelled as llama.cpp spells them
# (src/llama-arch.cpp LLM_KV_NAMES in llama-cpp-python 0.3.36's llama.cpp, commit 0c1e570; its `%s`
# is `{arch}` here, as in gguf-py's templates).
LLM_KV_ATTENTION_RECURRENT_LAYERS = "{arch}.attention.recurrent_layers"


@dataclass(frozen=True)
class KeyType:
    """What a key may hold: a scalar of `scalar` (None: only an array), or an array of `elements`."""

    scalar: GGUFValueType | None
    elements: frozenset[GGUFValueType] = frozenset()

    def accepts(self, vtype: GGUFValueType, element: GGUFValueType | None) -> bool:
        if vtype == T.ARRAY:
            return element in self.elements
        return vtype == self.scalar

    def describe(self) -> str:
        kinds = [self.scalar.name] if self.scalar is not None else []
        kinds += [f"an array of {e.name}" for e in sorted(self.elements, key=lambda e: e.value)]
        return " or ".join(kinds)


U32, F32, BOOL, STR, U16, I32 = (KeyType(t) for t in (T.UINT32, T.FLOAT32, T.BOOL, T.STRING, T.UINT16, T.INT32))
# get_key_or_arr into a std::array<uint32_t, LLAMA_MAX_LAYERS>: a scalar, or one value per layer
U32_PER_LAYER = KeyType(T.UINT32, frozenset({T.UINT32, T.INT32}))
# llama_model_loader::load_swa_pattern: a per-layer bool array, or the u32 pattern period
SWA_PATTERN = KeyType(T.UINT32, frozenset({T.BOOL}))
BOOL_ARRAY = KeyType(None, frozenset({T.BOOL}))
STRING_ARRAY = KeyType(None, frozenset({T.STRING}))
U32_ARRAY = KeyType(None, frozenset({T.UINT32, T.INT32}))

# `{arch}` templates (gguf-py's Keys) and general keys -> their llama.cpp type
KEY_TYPES: dict[str, KeyType] = {
    Keys.General.ARCHITECTURE: STR, Keys.General.ALIGNMENT: U32, Keys.General.FILE_TYPE: U32,
    Keys.General.TYPE: STR,
    Keys.Split.LLM_KV_SPLIT_COUNT: U16, Keys.Split.LLM_KV_SPLIT_NO: U16, Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT: I32,
    Keys.LLM.BLOCK_COUNT: U32, Keys.LLM.EMBEDDING_LENGTH: U32, Keys.LLM.CONTEXT_LENGTH: U32,
    Keys.LLM.VOCAB_SIZE: U32, Keys.LLM.FEED_FORWARD_LENGTH: U32_PER_LAYER, Keys.LLM.EXPERT_COUNT: U32,
    Keys.LLM.EXPERT_USED_COUNT: U32_PER_LAYER, Keys.LLM.EXPERT_SHARED_COUNT: U32, Keys.LLM.EXPERT_GROUP_COUNT: U32,
    Keys.LLM.EXPERT_WEIGHTS_SCALE: F32, Keys.LLM.EXPERT_WEIGHTS_NORM: BOOL, Keys.LLM.EXPERT_GATING_FUNC: U32,
    Keys.LLM.NEXTN_PREDICT_LAYERS: U32, Keys.LLM.LEADING_DENSE_BLOCK_COUNT: U32,
    Keys.LLM.FULL_ATTENTION_INTERVAL: U32, Keys.LLM.TOKEN_SHIFT_COUNT: U32, Keys.LLM.RESIDUAL_SCALE: F32,
    Keys.LLM.LOGIT_SCALE: F32, Keys.LLM.EMBEDDING_SCALE: F32, Keys.LLM.FINAL_LOGIT_SOFTCAPPING: F32,
    Keys.LLM.ATTN_LOGIT_SOFTCAPPING: F32,
    Keys.Attention.HEAD_COUNT: U32_PER_LAYER, Keys.Attention.HEAD_COUNT_KV: U32_PER_LAYER,
    Keys.Attention.KEY_LENGTH: U32, Keys.Attention.VALUE_LENGTH: U32, Keys.Attention.KEY_LENGTH_SWA: U32,
    Keys.Attention.VALUE_LENGTH_SWA: U32, Keys.Attention.KEY_LENGTH_MLA: U32, Keys.Attention.VALUE_LENGTH_MLA: U32,
    Keys.Attention.KV_LORA_RANK: U32, Keys.Attention.SLIDING_WINDOW: U32,
    Keys.Attention.SLIDING_WINDOW_PATTERN: SWA_PATTERN,
    Keys.Attention.SHARED_KV_LAYERS: U32, Keys.Attention.LAYERNORM_RMS_EPS: F32, Keys.Attention.SCALE: F32,
    Keys.Attention.TEMPERATURE_SCALE: F32,
    Keys.Rope.DIMENSION_COUNT: U32, Keys.Rope.FREQ_BASE: F32, Keys.Rope.FREQ_BASE_SWA: F32,
    Keys.Rope.SCALING_TYPE: STR, Keys.Rope.SCALING_FACTOR: F32, Keys.Rope.SCALING_ORIG_CTX_LEN: U32,
    Keys.Rope.SCALING_FINETUNED: BOOL, Keys.Rope.SCALING_YARN_LOG_MUL: F32,
    Keys.SSM.CONV_KERNEL: U32, Keys.SSM.INNER_SIZE: U32, Keys.SSM.STATE_SIZE: U32, Keys.SSM.TIME_STEP_RANK: U32,
    Keys.SSM.GROUP_COUNT: U32, Keys.WKV.HEAD_SIZE: U32, Keys.ShortConv.L_CACHE: U32,
    Keys.Tokenizer.MODEL: STR, Keys.Tokenizer.PRE: STR, Keys.Tokenizer.LIST: STRING_ARRAY,
    Keys.Tokenizer.BOS_ID: U32, Keys.Tokenizer.EOS_ID: U32, Keys.Tokenizer.ADD_BOS: BOOL, Keys.Tokenizer.ADD_EOS: BOOL,
    LLM_KV_ATTENTION_RECURRENT_LAYERS: BOOL_ARRAY,
    Keys.Adapter.TYPE: STR, Keys.Adapter.LORA_ALPHA: F32, Keys.Clip.PROJECTOR_TYPE: STR,
    Keys.Clip.HAS_VISION_ENCODER: BOOL,
}


@functools.lru_cache(maxsize=64)
def key_types(arch: str) -> dict[str, KeyType]:
    """KEY_TYPES with `{arch}` filled in for one architecture."""
    return {template.format(arch=arch): kt for template, kt in KEY_TYPES.items()}
