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
# mla: which trunk blocks own a DSA indexer (get_key_or_arr over n_layer, not n_layer_all: glm-dsa.cpp)
LLM_KV_ATTENTION_INDEXER_TYPES = "{arch}.attention.indexer.types"
# dsv4: hyper-connections (deepseek4, hy_v4): the stream count, and the float epsilon and magnitude of the gates
LLM_KV_HC_COUNT = "{arch}.hyper_connection.count"
LLM_KV_HC_EPSILON = "{arch}.hyper_connection.epsilon"
LLM_KV_HC_MAGNITUDE = "{arch}.hyper_connection.magnitude"
# dsv4: deepseek4's per-block compress ratio (0, 4 or 128), at least one entry per block
LLM_KV_ATTENTION_COMPRESS_RATIOS = "{arch}.attention.compress_ratios"
# moe26: mimo2's scale of the attention output (load_arch_hparams: unset or 1 means none)
LLM_KV_ATTENTION_VALUE_SCALE = "{arch}.attention.value_scale"
# linear: Kimi Delta Attention's gate options (bailingmoe3.cpp load_arch_hparams)
LLM_KV_KDA_SAFE_GATE = "{arch}.kda.safe_gate"
LLM_KV_KDA_GATE_LOWER_BOUND = "{arch}.kda.gate_lower_bound"
# linear: kimi-k3's attention residuals, situ activation and latent experts (kimi-k3.cpp load_arch_hparams)
LLM_KV_ATTN_RES_BLOCK_SIZE = "{arch}.attn_res.block_size"
LLM_KV_SITU_BETA = "{arch}.activation.situ_beta"
LLM_KV_SITU_LINEAR_BETA = "{arch}.activation.situ_linear_beta"
LLM_KV_EXPERT_LATENT_LENGTH = "{arch}.expert_latent_length"
# dsv4 + glm5n: the rest of what deepseek4's and glm5-next's load_arch_hparams read (src/models/deepseek4.cpp,
# glm5-next.cpp): deepseek4's grouped low-rank output, compressor RoPE base, hash-routed blocks and shared-expert
# clamp; glm5-next's k-pool indexer (tokens pooled per key, whether the incomplete tail is always kept); both
# models' hyper-connection Sinkhorn iterations
LLM_KV_ATTENTION_OUTPUT_GROUP_COUNT = "{arch}.attention.output_group_count"
LLM_KV_ATTENTION_OUTPUT_LORA_RANK = "{arch}.attention.output_lora_rank"
LLM_KV_ATTENTION_COMPRESS_ROPE_FREQ_BASE = "{arch}.attention.compress_rope_freq_base"
LLM_KV_HASH_LAYER_COUNT = "{arch}.hash_layer_count"
LLM_KV_SWIGLU_CLAMP_SHEXP = "{arch}.swiglu_clamp_shexp"
LLM_KV_ATTENTION_INDEXER_KPOOL = "{arch}.attention.indexer.kpool"
LLM_KV_ATTENTION_INDEXER_KPOOL_SELECT_TAIL = "{arch}.attention.indexer.kpool_select_tail"
LLM_KV_HC_SINKHORN_ITERATIONS = "{arch}.hyper_connection.sinkhorn_iterations"
# The uint32 hyperparameters llama.cpp's src/models/<arch>.cpp read with get_key that gguf-py 0.19 does not
# name (DeepSeek-V4/GLM-DSA indexers, dflash, HRM, hyper-connections, PLE, ...), spelled as LLM_KV_NAMES does.
LLAMA_CPP_U32_KEYS = tuple(f"{{arch}}.{suffix}" for suffix in (
    "attention.indexer.block_size", "attention.indexer.head_count", "attention.indexer.key_length",
    "attention.indexer.kpool", "attention.indexer.local_blocks", "attention.indexer.top_k",
    "attention.key_length_mla_swa", "attention.kv_lora_rank_swa", "attention.output_group_count",
    "attention.output_lora_rank", "attention.value_length_mla_swa", "attn_res.block_size",
    "dense_2_feat_in", "dense_2_feat_out", "dense_3_feat_in", "dense_3_feat_out",
    "block_size", "conv_group_size", "conv_kernel_size", "selector_rank", "selector_top_k",
    "expert_latent_length", "hash_layer_count", "hrm.h_cycles", "hrm.layers_per_stack", "hrm.l_cycles",
    "hyper_connection.count", "hyper_connection.low_rank", "hyper_connection.sinkhorn_iterations",
    "ple.conv_kernel", "ple.eos_token_id", "ple.heads_per_ngram", "ple.image_token_id", "ple.ngram_size",
))


@dataclass(frozen=True)
class KeyType:
    """What a key may hold: a scalar of `scalar` (None: only an array), or an array of `elements`; a
    `per_layer` array holds one entry per block (get_key_or_arr with n = n_layer_all: "key %s has wrong
    array length")."""

    scalar: GGUFValueType | None
    elements: frozenset[GGUFValueType] = frozenset()
    per_layer: bool = False

    def accepts(self, vtype: GGUFValueType, element: GGUFValueType | None) -> bool:
        if vtype == T.ARRAY:
            return element in self.elements
        return vtype == self.scalar

    def describe(self) -> str:
        kinds = [self.scalar.name] if self.scalar is not None else []
        kinds += [f"an array of {e.name}" for e in sorted(self.elements, key=lambda e: e.value)]
        return " or ".join(kinds)


U32, F32, BOOL, STR, U16, I32 = (KeyType(t) for t in (T.UINT32, T.FLOAT32, T.BOOL, T.STRING, T.UINT16, T.INT32))
# get_arr into a std::array<uint32_t or int32_t, N>: its type_ok takes BOOL, UINT32 and INT32 elements
_INT_ELEMENTS = frozenset({T.BOOL, T.UINT32, T.INT32})
# get_key_or_arr into a std::array<uint32_t, LLAMA_MAX_LAYERS>: a UINT32 scalar, or one value per layer
U32_PER_LAYER = KeyType(T.UINT32, _INT_ELEMENTS, per_layer=True)
# load_swa_pattern (src/llama-model.cpp): a per-layer array through get_arr, or the u32 pattern period
SWA_PATTERN = KeyType(T.UINT32, _INT_ELEMENTS)
# get_key_or_arr into std::array<int, 4> (rope_sections): an INT32 scalar, or an array
I32_OR_ARRAY = KeyType(T.INT32, _INT_ELEMENTS)
STRING_ARRAY = KeyType(None, frozenset({T.STRING}))

# Every uint32 hyperparameter llama.cpp reads with get_key (GKV<uint32_t>: GGUF_TYPE_UINT32 and nothing else):
# src/llama-model.cpp load_hparams and src/models/<arch>.cpp load_arch_hparams at the pinned build.
_U32_KEYS = (
    Keys.LLM.BLOCK_COUNT, Keys.LLM.EMBEDDING_LENGTH, Keys.LLM.EMBEDDING_LENGTH_OUT, Keys.LLM.CONTEXT_LENGTH,
    Keys.LLM.VOCAB_SIZE, Keys.LLM.EXPERT_COUNT, Keys.LLM.EXPERT_SHARED_COUNT, Keys.LLM.EXPERT_GROUP_COUNT,
    Keys.LLM.EXPERT_GROUP_USED_COUNT, Keys.LLM.EXPERTS_PER_GROUP, Keys.LLM.EXPERT_GATING_FUNC,
    Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, Keys.LLM.EXPERT_CHUNK_FEED_FORWARD_LENGTH,
    Keys.LLM.NEXTN_PREDICT_LAYERS, Keys.LLM.LEADING_DENSE_BLOCK_COUNT, Keys.LLM.FULL_ATTENTION_INTERVAL,
    Keys.LLM.TOKEN_SHIFT_COUNT, Keys.LLM.POOLING_TYPE, Keys.LLM.DECODER_BLOCK_COUNT,
    Keys.LLM.DECODER_START_TOKEN_ID, Keys.LLM.EMBD_LENGTH_PER_LAYER_INP, Keys.LLM.FEATURES_LENGTH,
    Keys.LLM.INTERLEAVE_MOE_LAYER_STEP, Keys.LLM.MOE_EVERY_N_LAYERS, Keys.LLM.MOE_LATENT_SIZE,
    Keys.LLM.NUM_DEEPSTACK_LAYERS, Keys.LLM.RESCALE_EVERY_N_LAYERS, Keys.LLM.TIME_DECAY_EXTRA_DIM,
    Keys.LLM.TIME_MIX_EXTRA_DIM,
    Keys.Attention.KEY_LENGTH, Keys.Attention.VALUE_LENGTH, Keys.Attention.KEY_LENGTH_SWA,
    Keys.Attention.VALUE_LENGTH_SWA, Keys.Attention.KEY_LENGTH_MLA, Keys.Attention.VALUE_LENGTH_MLA,
    Keys.Attention.KV_LORA_RANK, Keys.Attention.Q_LORA_RANK, Keys.Attention.SLIDING_WINDOW,
    Keys.Attention.SHARED_KV_LAYERS, Keys.Attention.TEMPERATURE_LENGTH, Keys.Attention.REL_BUCKETS_COUNT,
    Keys.Attention.GROUPNORM_GROUPS, Keys.Attention.DECAY_LORA_RANK, Keys.Attention.GATE_LORA_RANK,
    Keys.Attention.ICLR_LORA_RANK, Keys.Attention.VALUE_RESIDUAL_MIX_LORA_RANK,
    Keys.Rope.DIMENSION_COUNT, Keys.Rope.DIMENSION_COUNT_SWA, Keys.Rope.SCALING_ORIG_CTX_LEN,
    Keys.SSM.CONV_KERNEL, Keys.SSM.INNER_SIZE, Keys.SSM.STATE_SIZE, Keys.SSM.TIME_STEP_RANK, Keys.SSM.GROUP_COUNT,
    Keys.WKV.HEAD_SIZE, Keys.ShortConv.L_CACHE, Keys.KDA.HEAD_DIM, Keys.PosNet.BLOCK_COUNT,
    Keys.PosNet.EMBEDDING_LENGTH, Keys.ConvNext.BLOCK_COUNT, Keys.ConvNext.EMBEDDING_LENGTH,
    *LLAMA_CPP_U32_KEYS,
)
# ... and every per-layer one it reads with get_key_or_arr(key, arr, n_layer_all)
_U32_PER_LAYER_KEYS = (
    Keys.LLM.FEED_FORWARD_LENGTH, Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, Keys.LLM.EXPERT_USED_COUNT,
    Keys.Attention.HEAD_COUNT, Keys.Attention.HEAD_COUNT_KV, LLM_KV_ATTENTION_RECURRENT_LAYERS,
)

# `{arch}` templates (gguf-py's Keys) and general keys -> their llama.cpp type
KEY_TYPES: dict[str, KeyType] = {
    **dict.fromkeys(_U32_KEYS, U32), **dict.fromkeys(_U32_PER_LAYER_KEYS, U32_PER_LAYER),
    Keys.General.ARCHITECTURE: STR, Keys.General.ALIGNMENT: U32, Keys.General.FILE_TYPE: U32,
    Keys.General.TYPE: STR,
    Keys.Split.LLM_KV_SPLIT_COUNT: U16, Keys.Split.LLM_KV_SPLIT_NO: U16, Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT: I32,
    Keys.LLM.EXPERT_WEIGHTS_SCALE: F32, Keys.LLM.EXPERT_WEIGHTS_NORM: BOOL,
    Keys.LLM.RESIDUAL_SCALE: F32, Keys.LLM.LOGIT_SCALE: F32, Keys.LLM.EMBEDDING_SCALE: F32,
    Keys.LLM.FINAL_LOGIT_SOFTCAPPING: F32, Keys.LLM.ATTN_LOGIT_SOFTCAPPING: F32,
    Keys.Attention.SLIDING_WINDOW_PATTERN: SWA_PATTERN,
    Keys.Attention.LAYERNORM_RMS_EPS: F32, Keys.Attention.SCALE: F32, Keys.Attention.TEMPERATURE_SCALE: F32,
    Keys.Rope.FREQ_BASE: F32, Keys.Rope.FREQ_BASE_SWA: F32, Keys.Rope.DIMENSION_SECTIONS: I32_OR_ARRAY,
    Keys.Rope.SCALING_TYPE: STR, Keys.Rope.SCALING_FACTOR: F32,
    Keys.Rope.SCALING_FINETUNED: BOOL, Keys.Rope.SCALING_YARN_LOG_MUL: F32,
    Keys.Tokenizer.MODEL: STR, Keys.Tokenizer.PRE: STR, Keys.Tokenizer.LIST: STRING_ARRAY,
    Keys.Tokenizer.BOS_ID: U32, Keys.Tokenizer.EOS_ID: U32, Keys.Tokenizer.ADD_BOS: BOOL, Keys.Tokenizer.ADD_EOS: BOOL,
    Keys.Adapter.TYPE: STR, Keys.Adapter.LORA_ALPHA: F32, Keys.Clip.PROJECTOR_TYPE: STR,
    Keys.Clip.HAS_VISION_ENCODER: BOOL,
}


@functools.lru_cache(maxsize=64)
def key_types(arch: str) -> dict[str, KeyType]:
    """KEY_TYPES with `{arch}` filled in for one architecture."""
    return {template.format(arch=arch): kt for template, kt in KEY_TYPES.items()}
