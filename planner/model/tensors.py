"""What a weight is, from its name: which block it belongs to and which part of the block.

The names are gguf-py's `TENSOR_NAMES` (the table llama.cpp's LLM_TENSOR_NAMES in
src/llama-arch.cpp mirrors: `blk.{bid}.ffn_up_exps` and so on). Every stage that asks "is this a
routed expert" or "which layer is this" asks here, so the planner, the analytic model and the
runtime classify a tensor the same way.
"""
from __future__ import annotations

import functools
import re

from gguf import MODEL_TENSOR, TENSOR_NAMES

# TENSOR_NAMES spells a block's tensors as this template; the rest of the name is the suffix.
_BLOCK_TEMPLATE = "blk.{bid}."
_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")


def tensor_name(tensor: MODEL_TENSOR, bid: int | None = None, kind: str = "weight") -> str:
    """A tensor's full GGUF name: `tensor_name(FFN_UP_EXP, 3)` is `blk.3.ffn_up_exps.weight`."""
    base = TENSOR_NAMES[tensor]
    if (bid is None) == (_BLOCK_TEMPLATE in base):
        raise ValueError(f"{tensor.name} ({base}) {'needs' if bid is None else 'takes no'} block index")
    return f"{base.format(bid=bid)}.{kind}" if bid is not None else f"{base}.{kind}"


def _suffix(tensor: MODEL_TENSOR) -> str:
    """The table's name after `blk.{bid}.`: `ffn_up_exps` for FFN_UP_EXP."""
    return TENSOR_NAMES[tensor].removeprefix(_BLOCK_TEMPLATE)


TOKEN_EMBD = tensor_name(MODEL_TENSOR.TOKEN_EMBD)
OUTPUT = tensor_name(MODEL_TENSOR.OUTPUT)
OUTPUT_NORM = tensor_name(MODEL_TENSOR.OUTPUT_NORM)
ROPE_FREQS = tensor_name(MODEL_TENSOR.ROPE_FREQS)


def rope_freqs_name(il: int) -> str:
    """The name layer `il`'s copy of the RoPE frequency factors is known by here. llama.cpp creates
    rope_freqs.weight for every layer in that layer's buffer type (src/models/<arch>.cpp: TENSOR_DUPLICATED
    for i != 0; create_tensor reuses a copy already in the same buffer type), and each layer's rope reads
    its own (llama_model::get_rope_factors(il))."""
    return ROPE_FREQS if il == 0 else f"{ROPE_FREQS}#{il}"


# phi3's long and short frequency tables: created per layer as rope_freqs is (src/models/phi3.cpp
# TENSOR_DUPLICATED for i != 0), each layer's rope reads the one get_rope_factors picks
ROPE_FACTORS_LONG = tensor_name(MODEL_TENSOR.ROPE_FACTORS_LONG)
ROPE_FACTORS_SHORT = tensor_name(MODEL_TENSOR.ROPE_FACTORS_SHORT)
LAYER_COPIED = (ROPE_FREQS, ROPE_FACTORS_LONG, ROPE_FACTORS_SHORT)


def layer_copy_name(base: str, il: int) -> str:
    """rope_freqs_name for any of LAYER_COPIED."""
    return base if il == 0 else f"{base}#{il}"
# The input layer's tables, looked up by get_rows (llama.cpp's LLM_TENSOR_LAYER_INPUT tensors).
INPUT_TENSORS = tuple(TENSOR_NAMES[t] for t in (
    MODEL_TENSOR.TOKEN_EMBD, MODEL_TENSOR.TOKEN_TYPES, MODEL_TENSOR.POS_EMBD, MODEL_TENSOR.PER_LAYER_TOKEN_EMBD,
))
# Tables outside the blocks that llama.cpp creates with block 0's index (tn(..., "weight", 0) of an
# LLM_TENSOR_LAYER_REPEATING tensor: layer 0's buffer type): the per-layer embeddings' projection and its norm
# (src/models/gemma4.cpp, gemma3n.cpp load_arch_tensors). # gemma4
FIRST_LAYER_TENSORS = tuple(TENSOR_NAMES[t] for t in (
    MODEL_TENSOR.PER_LAYER_MODEL_PROJ, MODEL_TENSOR.PER_LAYER_PROJ_NORM,
))

# Routed experts: the stacked per-expert matrices `-ot exps=CPU` and `-cmoe` move (the `_exps` and
# chunked `_chexps` names). ffn_norm_exps (arctic) is named as an expert tensor, so it counts too.
ROUTED_EXPERT_TENSORS = frozenset(_suffix(t) for t in (
    MODEL_TENSOR.FFN_GATE_EXP, MODEL_TENSOR.FFN_UP_EXP, MODEL_TENSOR.FFN_DOWN_EXP,
    MODEL_TENSOR.FFN_GATE_UP_EXP, MODEL_TENSOR.FFN_NORM_EXP,
    MODEL_TENSOR.FFN_GATE_CHEXP, MODEL_TENSOR.FFN_UP_CHEXP, MODEL_TENSOR.FFN_DOWN_CHEXP,
))
# The always-on shared expert and its gate (the `_shexp` names).
SHARED_EXPERT_TENSORS = frozenset(_suffix(t) for t in (
    MODEL_TENSOR.FFN_GATE_SHEXP, MODEL_TENSOR.FFN_UP_SHEXP, MODEL_TENSOR.FFN_DOWN_SHEXP,
    MODEL_TENSOR.FFN_GATE_INP_SHEXP,
))

# The three dense feed-forward matrices (not their expert or shared-expert variants).
DENSE_FFN_TENSORS = frozenset(_suffix(t) for t in (MODEL_TENSOR.FFN_UP, MODEL_TENSOR.FFN_GATE, MODEL_TENSOR.FFN_DOWN))

# Name families of a block's token mixer: attention, SSM, RWKV time mixing, LFM2's short
# convolution, linear attention (gguf-py's attn_*, ssm_*, time_mix_*, shortconv.*, linear_attn*).
MIXER_PREFIXES = ("attn_", "ssm_", "time_mix_", "shortconv", "linear_attn")
# Dense feed-forward projections (the router ffn_gate_inp is not one) and RWKV channel mixing.
DENSE_FFN_PREFIXES = ("ffn_up", "ffn_down", "ffn_gate")
ROUTER_PREFIX = "ffn_gate_inp"
CHANNEL_MIX_PREFIX = "channel_mix_"


@functools.lru_cache(maxsize=1 << 16)   # the estimate asks again for the same names on every candidate
def layer_of(name: str) -> tuple[int | None, str]:
    """(block index, the name after `blk.N.`) for a block tensor; (None, name) for any other."""
    m = _BLOCK.match(name)
    return (int(m.group(1)), m.group(2)) if m else (None, name)


# embed: architectures that create token_embd_norm (an LLM_TENSOR_LAYER_REPEATING tensor) with block 0's index, so
# the embeddings' LayerNorm lives with block 0 (src/models/bert.cpp, nomic-bert.cpp, jina-bert-v2.cpp,
# jina-bert-v3.cpp, modern-bert.cpp load_arch_tensors); lfm2's output norm bears the same file name and stays an
# output tensor
FIRST_LAYER_TOKEN_NORM_ARCHS = frozenset({"bert", "nomic-bert", "jina-bert-v2", "jina-bert-v3", "modern-bert"})
TOKEN_EMBD_NORM = TENSOR_NAMES[MODEL_TENSOR.TOKEN_EMBD_NORM]
# embed: encoders whose load_arch_tensors creates no output matrix at all (no logits; src/models/bert.cpp,
# nomic-bert.cpp, jina-bert-v2.cpp, jina-bert-v3.cpp, modern-bert.cpp): token_embd is not duplicated as one
NO_OUTPUT_MATRIX = frozenset({"bert", "nomic-bert", "jina-bert-v2", "jina-bert-v3", "modern-bert"})


def is_first_layer(name: str, arch: str = "") -> bool:
    """A table outside the blocks that lives with block 0 (FIRST_LAYER_TENSORS, and an encoder's token_embd_norm),
    by its full name and the model's architecture."""
    base = name.partition(".")[0]
    return base in FIRST_LAYER_TENSORS or (base == TOKEN_EMBD_NORM and arch in FIRST_LAYER_TOKEN_NORM_ARCHS)


def is_input(name: str) -> bool:
    """A tensor of the input layer (`token_embd.weight`, `position_embd.weight`, …), by its full name."""
    return name.partition(".")[0] in INPUT_TENSORS


def _base(suffix: str) -> str:
    """`ffn_up_exps` of `ffn_up_exps.weight`: the table name without `.weight`, `.bias`, …"""
    return suffix.split(".", 1)[0]


def is_routed_expert(suffix: str) -> bool:
    """A routed-expert tensor, by its name after `blk.N.` (`ffn_up_exps.weight`, `ffn_down_chexps.bias`)."""
    return _base(suffix) in ROUTED_EXPERT_TENSORS


def is_shared_expert(suffix: str) -> bool:
    return _base(suffix) in SHARED_EXPERT_TENSORS


def is_norm(suffix: str) -> bool:
    return "norm" in suffix


def is_mixer(suffix: str) -> bool:
    """An attention or recurrent-mixer weight of a block (its norms excluded)."""
    return suffix.startswith(MIXER_PREFIXES) and not is_norm(suffix)


def is_dense_ffn_projection(suffix: str) -> bool:
    """One of the dense ffn_up / ffn_gate / ffn_down matrices (or their biases)."""
    return _base(suffix) in DENSE_FFN_TENSORS


def is_dense_ffn(suffix: str) -> bool:
    """A dense feed-forward weight of a block for weight grouping: the ffn_up/gate/down families
    (not experts, the router or norms) and RWKV's channel mixing."""
    if is_routed_expert(suffix) or is_shared_expert(suffix) or is_norm(suffix):
        return False
    if suffix.startswith(DENSE_FFN_PREFIXES):
        return not suffix.startswith(ROUTER_PREFIX)
    return suffix.startswith(CHANNEL_MIX_PREFIX)
