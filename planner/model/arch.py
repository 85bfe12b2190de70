"""Architecture facts per layer, read from GGUF metadata the way the pinned llama.cpp reads them.

The rules (defaults, SWA patterns, which layers are recurrent) are facts of llama.cpp's
`src/models/<arch>.cpp` `load_arch_hparams` and `src/llama-hparams.cpp` at the pinned build
(llama-cpp-python 0.3.36). They live in the tables below, keyed by architecture name.
"""
from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from gguf import Keys

from planner.core.errors import GGUFError
from planner.gguf.cursor import QUOTE_CHARS, short
from planner.gguf.keys import (
    KEY_TYPES,
    LLM_KV_ATTENTION_COMPRESS_RATIOS,
    LLM_KV_ATTENTION_INDEXER_TYPES,
    LLM_KV_ATTENTION_RECURRENT_LAYERS,
)
from planner.gguf.reader import ModelFile, SkippedArray
from planner.model.tensors import TOKEN_EMBD, is_routed_expert, layer_of

log = logging.getLogger(__name__)

# src/llama-hparams.h at the pinned build: load_hparams asserts n_layer_all in (0, LLAMA_MAX_LAYERS] and
# n_expert <= LLAMA_MAX_EXPERTS (the per-layer arrays are std::array<uint32_t, LLAMA_MAX_LAYERS>).
LLAMA_MAX_LAYERS = 512
LLAMA_MAX_EXPERTS = 1024



class AttnKind(enum.Enum):
    FULL = "full"
    SWA = "swa"
    RECURRENT = "recurrent"
    NONE = "none"      # no attention and no state: an FFN-only block (e.g. some nemotron_h layers)
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class SwaRule:
    """How an architecture marks its sliding-window layers when the file has no per-layer array.

    llama_hparams::set_swa_pattern: layer il is SWA when il % pattern < pattern - 1, or, with
    dense_first, when il % pattern != 0.
    """

    pattern: int
    dense_first: bool = False
    default_window: int = 0
    needs_window_key: bool = False  # SWA only when the file declares a window (gemma3, afmoe, …)
    chunked: bool = False           # llama4's chunked attention
    # dense: the rule holds only for this many trunk layers (exaone4: the 64-layer 32B; load_arch_hparams
    # leaves every other size without SWA, whatever its keys say)
    n_layer_only: int = 0


SWA_RULES: dict[str, SwaRule] = {
    "gemma2": SwaRule(2, default_window=4096),
    "gemma3": SwaRule(6, needs_window_key=True),
    "gemma3n": SwaRule(5),
    "gemma-embedding": SwaRule(6),
    "cohere2": SwaRule(4),
    "cohere2moe": SwaRule(4, dense_first=True),
    "gpt-oss": SwaRule(2),
    "llama4": SwaRule(4, default_window=8192, chunked=True),
    "exaone4": SwaRule(4, default_window=4096, n_layer_only=64),
    # olmo2 (OLMo 3): three sliding layers in four once the file sets a window (load_arch_hparams)
    "olmo2": SwaRule(4, needs_window_key=True),
    "exaone-moe": SwaRule(4, default_window=128),
    "afmoe": SwaRule(4, needs_window_key=True),
    "smallthinker": SwaRule(4, dense_first=True, needs_window_key=True),
    "laguna": SwaRule(4, dense_first=True, needs_window_key=True),
    # pattern 0: every attention layer slides once the file sets a window (src/models/lfm2.cpp)
    "lfm2": SwaRule(0, needs_window_key=True),
    # gemma4 reads its per-layer flags as a required array (src/models/gemma4.cpp load_arch_hparams); the
    # pattern only stands for a file without one, which llama.cpp refuses
    "gemma4": SwaRule(0),
    # dsv4: every block's raw K cache slides (deepseek4.cpp load_arch_hparams: set_swa_pattern(0) and the
    # window from attention.sliding_window); its compressed caches follow DSV4_RULES
    "deepseek4": SwaRule(0),
    # moe26: mimo2.cpp and step35.cpp read the per-layer flags as a required array (get_arr); their MTP
    # blocks after the trunk have entries of their own
    "mimo2": SwaRule(0),
    "step35": SwaRule(0),
    # embed: modern-bert's symmetric windows in every block but each third from block 0, once the file sets a window
    "modern-bert": SwaRule(3, dense_first=True, needs_window_key=True),
}


class RecurrentRule(enum.Enum):
    ALL = "all"                     # every block is recurrent (mamba, rwkv)
    NO_KV_HEADS = "no_kv_heads"     # recurrent where head_count_kv[il] == 0 (jamba, lfm2, granitehybrid…)
    NO_KV_NO_FFN = "no_kv_no_ffn"   # nemotron_h: recurrent where head_count_kv and feed_forward_length are 0
    INTERVAL = "interval"           # every full_attention_interval-th block attends (qwen3next, minimax-01)
    PARALLEL = "parallel"           # attention and SSM in every block (falcon-h1)


RECURRENT_RULES: dict[str, RecurrentRule] = {
    "mamba": RecurrentRule.ALL, "mamba2": RecurrentRule.ALL,
    "rwkv6": RecurrentRule.ALL, "rwkv6qwen2": RecurrentRule.ALL,
    "rwkv7": RecurrentRule.ALL, "arwkv7": RecurrentRule.ALL,
    "jamba": RecurrentRule.NO_KV_HEADS, "granitehybrid": RecurrentRule.NO_KV_HEADS,
    "lfm2": RecurrentRule.NO_KV_HEADS, "lfm2moe": RecurrentRule.NO_KV_HEADS,
    "kimi-linear": RecurrentRule.NO_KV_HEADS, "kimi-k3": RecurrentRule.NO_KV_HEADS,
    "glm5-next": RecurrentRule.NO_KV_HEADS, "bailingmoe3": RecurrentRule.NO_KV_HEADS,
    "nemotron_h": RecurrentRule.NO_KV_NO_FFN, "nemotron_h_moe": RecurrentRule.NO_KV_NO_FFN,
    "qwen3next": RecurrentRule.INTERVAL, "qwen35": RecurrentRule.INTERVAL,
    "qwen35moe": RecurrentRule.INTERVAL, "minimax-01": RecurrentRule.INTERVAL,
    "falcon-h1": RecurrentRule.PARALLEL,
}

# Architectures fitplan knows to be plain transformers: every block attends over a full cache.
# Anything not here, in SWA_RULES or in RECURRENT_RULES still gets weights per layer; its layers
# are UNKNOWN with no KV figures, since guessing full attention would be wrong for SWA or
# recurrent designs.
KNOWN_DENSE = frozenset({
    "llama", "mistral3", "qwen2", "qwen3", "qwen2moe", "qwen3moe", "qwen3vl", "qwen3vlmoe", "phi3",
    "deepseek2", "deepseek", "glm4", "glm4moe", "granite", "granitemoe", "olmo", "olmo2", "olmoe",
    "starcoder2", "stablelm", "internlm2", "minicpm", "minicpm3", "ernie4_5", "ernie4_5-moe",
    "gemma", "command-r", "dbrx", "grok", "arcee", "seed_oss", "smollm3", "hunyuan-moe",
    "hunyuan-dense", "bailingmoe", "bailingmoe2", "dots1", "minimax-m2", "apertus", "phimoe",
    # mla: deepseek2's model class (src/models/models.h), its K-only MLA cache; the DSA models add an
    # indexer key cache (INDEXER_RULES)
    "mistral4", "deepseek32", "glm-dsa",
    # glm5: minimax-m3's MSA cache (src/llama-kv-cache-msa.cpp) is a plain cache plus an indexer cache
    # (MSA_ARCHS)
    "minimax-m3",
    # dsv4: hy-v4.cpp's MLA cache (GGML_ASSERT(is_mla())); llama_kv_cache_dsa once the file has an indexer
    "hy_v4",
    # moe26: hy-v3.cpp builds one unified cache (build_attn_inp_kv)
    "hy_v3",
    # embed: the BERT-family encoders; create_memory gives them no cache (NO_MEMORY)
    "bert", "nomic-bert", "jina-bert-v2", "jina-bert-v3",
})


# --- mla: the lightning indexer's key cache of DSA models (src/llama-kv-cache-dsa.cpp) ---------------
# llama_kv_cache_dsa holds two caches of the same cells: the K-only MLA cache of the trunk layers and, for
# the layers that own an indexer, one head of attention.indexer.key_length per cell (type_k, K only).
# glm-dsa.cpp: a file trained for 1M positions (GLM-5.2) without indexer.types owns indexers at blocks 0, 1
# and every fourth from 2 (GLM_5_2_DEFAULT_INDEXER_TYPES, 78 entries); earlier GLM-5 files at every block.
GLM_5_2_CONTEXT = 1048576
GLM_5_2_INDEXER_LAYERS = 78


def _glm_dsa_default(n_ctx_train: int, il: int) -> bool:
    if n_ctx_train < GLM_5_2_CONTEXT:
        return True
    return il < GLM_5_2_INDEXER_LAYERS and (il < 2 or (il - 2) % 4 == 0)


# architecture -> which trunk layers own an indexer cache before attention.indexer.types overrides it
INDEXER_RULES: dict[str, Callable[[int, int], bool]] = {
    "deepseek32": lambda _ctx, _il: True,      # llama-model.cpp filter_lid: every trunk layer
    "glm-dsa": _glm_dsa_default,
    # glm5: glm5-next's attention layers (its KDA layers have no KV heads, hence no cache), all by default
    "glm5-next": lambda _ctx, _il: True,
    # dsv4: hy_v4 owns none before attention.indexer.types says (load_hparams zero-fills is_indexer_full_impl)
    "hy_v4": lambda _ctx, _il: False,
}
# glm5: keys per cell of the indexer cache, in indexer key lengths: glm5-next's k-pool caches key, gate and pooled
# value per token (llama-memory-hybrid-idx.cpp: indexer_head_size * 3 when indexer_kpool > 0, which it asserts)
INDEXER_WIDTH = {"glm5-next": 3}
# glm5: architectures whose recurrent layers are Kimi Delta Attention (llama_hparams::n_embd_r / n_embd_s with
# n_embd_head_kda): per sequence the Q, K and V conv columns, 3 x (d_conv - 1) x n_head x head_dim (d_conv 4 when
# unset), and one head_dim^2 state per head; n_head is block 0's (llama_hparams::n_head())
KDA_STATE_ARCHS = frozenset({"glm5-next"})

# --- glm5: MiniMax Sparse Attention's indexer cache (src/llama-kv-cache-msa.cpp) --------------------------
# llama_kv_cache_msa holds two llama_kv_caches of the same cells: the main one and one for the indexer, made
# from the model's hparams with one KV head and K heads attention.indexer.key_length wide. Unlike DSA's it is
# not an MLA cache, so it stores V too: one head of the model's value length (type_v). Its layer filter
# (create_memory in llama-model.cpp) keeps the blocks past leading_dense_block_count.
MSA_ARCHS = frozenset({"minimax-m3"})
# dsv4: architectures whose indexer cache exists only when the file sets attention.indexer.top_k (hy_v4's
# create_memory: a plain llama_kv_cache for a full-attention checkpoint, llama_kv_cache_dsa otherwise)
INDEXER_NEEDS_TOP_K = frozenset({"hy_v4"})

# Architectures llama_model::create_memory gives no memory at all (src/llama-model.cpp: res = nullptr): their
# layers attend over the ubatch itself (build_attn_inp_no_cache), so nothing is cached. # gemma4 (helper)
NO_MEMORY = frozenset({"gemma-embedding",
                       "bert", "nomic-bert", "jina-bert-v2", "jina-bert-v3", "modern-bert"})   # embed


# --- dsv4: DeepSeek-V4's memory, llama_kv_cache_dsv4 (src/llama-kv-cache-dsv4.cpp) ---------------------
# A K-only raw cache of the window (an iSWA cache whose every layer slides, never unified), and by each block's
# attention.compress_ratios entry a K-only compressed cache of ceil(kv_size / ratio) cells padded to 256: CSA
# (ratio 4, plus the lightning indexer's keys at the same cells) or HCA (ratio 128); each compressor keeps an
# f32 state (kv and score). Every part keeps one stream per sequence whatever -kvu says.
DSV4_CSA_RATIO = 4
DSV4_HCA_RATIO = 128
DSV4_CACHE = frozenset({"deepseek4"})


@dataclass(frozen=True)
class LayerFacts:
    index: int
    kind: AttnKind
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    window: int = 0              # sliding window in tokens, 0 for full attention
    has_kv: bool = True          # False where the layer reuses an earlier layer's cache (gemma3n)
    state_r: int = 0             # recurrent conv/shift state, f32 elements per sequence
    state_s: int = 0             # recurrent SSM/WKV state, f32 elements per sequence
    nextn: bool = False          # an MTP/nextn block appended after the trunk
    # mla: elements one token occupies in the layer's DSA indexer key cache (type_k, K only), 0 for none
    index_k: int = 0
    # glm5: V elements per token in the layer's MSA indexer cache (type_v), 0 for none
    index_v: int = 0
    # dsv4: the layer's DSV4 compress ratio (0 none, 4 CSA, 128 HCA); None outside llama_kv_cache_dsv4
    comp_ratio: int | None = None

    @property
    def k_per_cell(self) -> int:
        """K elements one token occupies in this layer's cache (n_embd_k_gqa)."""
        return self.head_dim_k * self.n_head_kv if self.has_kv else 0

    @property
    def v_per_cell(self) -> int:
        return self.head_dim_v * self.n_head_kv if self.has_kv else 0


@dataclass(frozen=True)
class ModelFacts:
    arch: str
    n_layer: int                 # trunk blocks (llama.cpp's n_layer), nextn blocks excluded
    n_embd: int
    n_vocab: int
    n_ctx_train: int
    n_expert: int
    n_expert_used: int
    n_expert_shared: int
    mla: bool
    known: bool                  # False: KV facts unknown for this architecture
    layers: tuple[LayerFacts, ...]   # trunk layers then nextn layers

    @property
    def n_layer_all(self) -> int:
        return len(self.layers)


class _Meta:
    """Typed access to `{arch}.*` keys with the file named in every error. Keys are gguf-py's
    `Keys` templates (`Keys.Attention.HEAD_COUNT`), formatted with the model's architecture."""

    def __init__(self, model: ModelFile) -> None:
        self.model = model
        self.arch = model.architecture

    def key(self, template: str) -> str:
        return template.format(arch=self.arch)

    def named(self, template: str) -> str:
        """The key as a message names it: a hostile architecture name is not echoed whole."""
        arch = self.arch if len(self.arch) <= QUOTE_CHARS else f"{self.arch[:QUOTE_CHARS]}..."
        return template.format(arch=arch)

    def get(self, template: str, default: Any = None) -> Any:
        return self.model.metadata.get(self.key(template), default)

    def need(self, template: str) -> Any:
        value = self.get(template)
        if value is None:
            raise GGUFError(self.model.path, f"missing required key {self.named(template)}")
        return value

    def per_layer(self, template: str, n: int, default: Any) -> list[Any]:
        """A scalar broadcast to every layer, or a per-layer array (llama.cpp's get_key_or_arr); its length
        is checked once for every per-layer key (check_per_layer_lengths)."""
        value = self.get(template, default)
        return list(value) if isinstance(value, tuple) else [value] * n

    def check_per_layer_lengths(self, n: int) -> None:
        """Every per-layer key given as an array (planner.gguf.keys) has one entry per block: get_key_or_arr
        throws "key %s has wrong array length; expected %u, got %u" for any key llama.cpp reads so, including
        those fitplan does not use."""
        for template, kt in KEY_TYPES.items():
            value = self.get(template)
            if kt.per_layer and isinstance(value, tuple | SkippedArray) and len(value) != n:
                raise GGUFError(self.model.path, f"{self.named(template)} has {len(value)} entries, expected {n} "
                                                 f"(one per block); llama.cpp refuses another length")

    def bounded(self, template: str, low: int, high: int, default: int = 0) -> int:
        """An integer key llama.cpp asserts to lie in [low, high]."""
        value = int(self.get(template, default))
        if not low <= value <= high:
            raise GGUFError(self.model.path, f"{self.named(template)} is {value}; llama.cpp requires {low} to {high}")
        return value


def _vocab_size(model: ModelFile, meta: _Meta, known: bool) -> int:
    tokens = model.metadata.get(Keys.Tokenizer.LIST)
    embd = model.tensor(TOKEN_EMBD)
    rows = embd.shape[1] if embd is not None and len(embd.shape) > 1 else None
    if tokens is not None:
        n, source = len(tokens), Keys.Tokenizer.LIST
    elif meta.get(Keys.LLM.VOCAB_SIZE):
        n, source = int(meta.get(Keys.LLM.VOCAB_SIZE)), meta.named(Keys.LLM.VOCAB_SIZE)
    else:
        return rows or 0
    if known and rows is not None and rows != n:
        # create_tensor(TOKEN_EMBD, {n_embd, n_vocab}): llama.cpp refuses a table of another height
        raise GGUFError(model.path, f"{source} gives {n} tokens but {TOKEN_EMBD} has {rows} rows; llama.cpp "
                                    f"refuses a tensor of the wrong shape")
    return n


def _check_block_tensors(model: ModelFile, n_layer_all: int) -> None:
    """Where a file lays its weights out in blocks, every block has some: llama.cpp creates each block's
    tensors and refuses a file that lacks them ("missing tensor"). A header of metadata alone passes."""
    blocks = {layer_of(t.name)[0] for t in model.tensors} - {None}
    missing = [il for il in range(n_layer_all) if il not in blocks]
    if blocks and missing:
        raise GGUFError(model.path, f"block {missing[0]} has no tensors ({len(missing)} of {n_layer_all} blocks "
                                    f"are empty); llama.cpp refuses a model missing tensors")


def _swa_flags(meta: _Meta, n: int) -> tuple[list[bool], int]:
    """Which layers use a sliding window, and the window; llama.cpp's load_swa_pattern."""
    window = int(meta.get(Keys.Attention.SLIDING_WINDOW, 0) or 0)
    pattern = meta.get(Keys.Attention.SLIDING_WINDOW_PATTERN)
    rule = SWA_RULES.get(meta.arch)
    n_trunk = n - int(meta.get(Keys.LLM.NEXTN_PREDICT_LAYERS, 0) or 0)
    if rule is not None and rule.n_layer_only and n_trunk != rule.n_layer_only:
        return [False] * n, 0
    if isinstance(pattern, tuple):  # per-layer booleans win over any default
        flags = [bool(x) for x in pattern[:n]] + [False] * max(0, n - len(pattern))
        return flags, window
    if rule is None or (rule.needs_window_key and window == 0):
        return [False] * n, 0
    window = window or rule.default_window
    every = int(pattern) if pattern is not None else rule.pattern
    if rule.dense_first:
        return [every == 0 or il % every != 0 for il in range(n)], window
    return [every == 0 or il % every < every - 1 for il in range(n)], window


def _recurrent_flags(meta: _Meta, n: int, n_layer: int, n_head_kv: list[int], n_ff: list[int]) -> list[bool]:
    rule = RECURRENT_RULES.get(meta.arch)
    if rule is None:
        return [False] * n
    if rule in (RecurrentRule.ALL, RecurrentRule.PARALLEL):
        return [True] * n
    if rule is RecurrentRule.NO_KV_HEADS:
        return [kv == 0 for kv in n_head_kv]
    if rule is RecurrentRule.NO_KV_NO_FFN:
        return [kv == 0 and ff == 0 for kv, ff in zip(n_head_kv, n_ff, strict=True)]
    if meta.get(LLM_KV_ATTENTION_RECURRENT_LAYERS) is not None:   # get_key_or_arr: a scalar or one per block
        return [bool(x) for x in meta.per_layer(LLM_KV_ATTENTION_RECURRENT_LAYERS, n, False)]
    interval = int(meta.get(Keys.LLM.FULL_ATTENTION_INTERVAL, 4) or 4)
    # MTP blocks past the trunk are plain attention (src/models/qwen3next.cpp, qwen35.cpp)
    return [il < n_layer and (il + 1) % interval != 0 for il in range(n)]


def _state_sizes(meta: _Meta, n_embd: int, n_head: int) -> tuple[int, int]:
    """Per-sequence recurrent state (r, s) in elements: llama_hparams::n_embd_r / n_embd_s (`n_head`:
    block 0's, llama_hparams::n_head())."""
    wkv_head = int(meta.get(Keys.WKV.HEAD_SIZE, 0) or 0)
    if wkv_head:  # RWKV: token-shift rows and the WKV matrix state
        return int(meta.get(Keys.LLM.TOKEN_SHIFT_COUNT, 2) or 2) * n_embd, n_embd * wkv_head
    d_conv = int(meta.get(Keys.SSM.CONV_KERNEL, 0) or 0)
    # linear (helper): Kimi Delta Attention (kimi-linear, kimi-k3, bailingmoe3, glm5-next): the conv
    # columns of Q, K and V (d_conv - 1 each, 3 when the kernel is unset) and one head_dim^2 state per head
    kda_head = int(meta.get(Keys.KDA.HEAD_DIM, 0) or 0)
    if kda_head and not int(meta.get(Keys.ShortConv.L_CACHE, 0) or 0):
        return 3 * (d_conv - 1 if d_conv > 0 else 3) * n_head * kda_head, kda_head * kda_head * n_head
    d_inner = int(meta.get(Keys.SSM.INNER_SIZE, 0) or 0)
    d_state = int(meta.get(Keys.SSM.STATE_SIZE, 0) or 0)
    n_group = int(meta.get(Keys.SSM.GROUP_COUNT, 0) or 0)
    l_cache = int(meta.get(Keys.ShortConv.L_CACHE, 0) or 0)
    r = n_embd * (l_cache - 1) if l_cache else max(d_conv - 1, 0) * (d_inner + 2 * n_group * d_state)
    return r, d_state * d_inner


def _check_blocks(model: ModelFile, meta: _Meta, n_layer_all: int) -> None:
    """No tensor of a block past block_count: llama.cpp creates tensors for blocks 0..n_layer_all-1 only
    and refuses a file holding tensors it did not create ("wrong number of tensors",
    llama_model_loader::done_getting_tensors)."""
    for t in model.tensors:
        block = layer_of(t.name)[0]
        if block is not None and block >= n_layer_all:
            raise GGUFError(model.path, f"tensor {short(t.name)} is in block {block} but "
                                        f"{meta.named(Keys.LLM.BLOCK_COUNT)} is {n_layer_all}")


def _check_experts(model: ModelFile, meta: _Meta, n_expert: int) -> None:
    """Stacked expert tensors are {.., .., n_expert}: src/models/<arch>.cpp creates every `_exps` tensor
    with n_expert as its last dimension and llama.cpp refuses another shape."""
    for t in model.tensors:
        if len(t.shape) == 3 and is_routed_expert(layer_of(t.name)[1]) and t.shape[2] != n_expert:
            raise GGUFError(model.path, f"tensor {short(t.name)} stacks {t.shape[2]} experts but "
                                        f"{meta.named(Keys.LLM.EXPERT_COUNT)} is {n_expert}; llama.cpp refuses "
                                        f"a tensor of the wrong shape")


def _check_kv_widths(model: ModelFile, layers: list[LayerFacts]) -> None:
    """A layer's K and V projections are n_head_kv x head_dim wide (create_tensor(ATTN_K, {n_embd,
    n_embd_k_gqa}) and ATTN_V's n_embd_v_gqa in src/models/<arch>.cpp); llama.cpp refuses another shape,
    so head counts that disagree with the weights are a broken file, not a cache to size."""
    for lf in layers:
        if not lf.has_kv or lf.kind not in (AttnKind.FULL, AttnKind.SWA):
            continue
        for part, width in (("attn_k", lf.k_per_cell), ("attn_v", lf.v_per_cell)):
            t = model.tensor(f"blk.{lf.index}.{part}.weight")
            if t is not None and len(t.shape) == 2 and t.shape[1] != width:
                raise GGUFError(model.path, f"tensor {t.name} is {t.shape[1]} wide but the head counts make it "
                                            f"{lf.n_head_kv} x {width // max(lf.n_head_kv, 1)} = {width}; "
                                            f"llama.cpp refuses a tensor of the wrong shape")


@dataclass(frozen=True)
class _Header:
    """The header values model_facts derives from, each checked by _checked_header first."""

    n_layer_all: int             # the trunk's blocks and the MTP blocks after them
    n_layer: int                 # the trunk's blocks
    n_embd: int
    n_expert: int
    n_expert_used: int
    known: bool                  # the KV facts of the architecture are known (KNOWN_DENSE, SWA_RULES, ...)


@dataclass(frozen=True)
class _Heads:
    """Per-block head counts and feed-forward widths, and the K and V head sizes (full and sliding-window)."""

    n_head: list[int]
    n_head_kv: list[int]
    n_ff: list[int]
    dk: int
    dv: int
    dk_swa: int
    dv_swa: int
    mla: bool


def model_facts(model: ModelFile) -> ModelFacts:
    """Per-layer architecture facts from a model's metadata. The hostile-input checks run first, as one pass
    (_checked_header: every value llama.cpp would refuse is refused here with one line naming the key), then
    the layers are derived from the checked values; the K and V widths the derivation gives are then held
    against the file's attn_k / attn_v tensors."""
    meta = _Meta(model)
    header = _checked_header(model, meta)
    heads = _heads(meta, header.n_layer_all, header.n_embd)
    layers = _derived_layers(meta, header, heads)
    if header.known and not heads.mla:
        _check_kv_widths(model, layers)
    n_head = heads.n_head[0] if heads.n_head else 0
    layers = _with_indexer_caches(meta, layers, header.n_layer)
    layers = _with_msa_caches(meta, layers, header.n_layer)
    layers = _with_kda_states(meta, layers, n_head)
    layers = _with_dsv4_caches(meta, layers, header.n_layer_all)
    return ModelFacts(
        arch=model.architecture, n_layer=header.n_layer, n_embd=header.n_embd,
        n_vocab=_vocab_size(model, meta, header.known),
        n_ctx_train=int(meta.get(Keys.LLM.CONTEXT_LENGTH, 0) or 0),
        n_expert=header.n_expert,
        n_expert_used=header.n_expert_used,
        n_expert_shared=int(meta.get(Keys.LLM.EXPERT_SHARED_COUNT, 0) or 0),
        mla=heads.mla, known=header.known, layers=tuple(layers),
    )


def _checked_header(model: ModelFile, meta: _Meta) -> _Header:
    """The hostile-input pass: block, embedding and expert counts within what llama.cpp asserts, per-layer
    arrays one entry a block, the tensors' blocks, embedding width and expert stacks agreeing with them, and
    the head count present where the architecture attends."""
    meta.need(Keys.LLM.BLOCK_COUNT)
    n_layer_all = meta.bounded(Keys.LLM.BLOCK_COUNT, 1, LLAMA_MAX_LAYERS)
    meta.check_per_layer_lengths(n_layer_all)
    # the MTP blocks follow the trunk: at least one block is not one (a model of MTP heads alone has no trunk)
    n_nextn = meta.bounded(Keys.LLM.NEXTN_PREDICT_LAYERS, 0, n_layer_all - 1)
    _check_blocks(model, meta, n_layer_all)
    n_embd = int(meta.need(Keys.LLM.EMBEDDING_LENGTH))
    if n_embd == 0:
        raise GGUFError(model.path, f"{meta.named(Keys.LLM.EMBEDDING_LENGTH)} is 0")
    arch = model.architecture
    known = arch in KNOWN_DENSE or arch in SWA_RULES or arch in RECURRENT_RULES
    if known:
        _check_embedding_width(model, meta, n_embd)
    n_expert = meta.bounded(Keys.LLM.EXPERT_COUNT, 0, LLAMA_MAX_EXPERTS)
    if known:
        _check_experts(model, meta, n_expert)
        _check_block_tensors(model, n_layer_all)
    n_expert_used = _checked_experts_used(model, meta, n_layer_all, n_expert)
    recurrent_only = RECURRENT_RULES.get(arch) is RecurrentRule.ALL
    if meta.get(Keys.Attention.HEAD_COUNT) is None and not recurrent_only:
        raise GGUFError(model.path, f"missing required key {meta.named(Keys.Attention.HEAD_COUNT)}")
    return _Header(n_layer_all=n_layer_all, n_layer=n_layer_all - n_nextn, n_embd=n_embd, n_expert=n_expert,
                   n_expert_used=n_expert_used, known=known)


def _check_embedding_width(model: ModelFile, meta: _Meta, n_embd: int) -> None:
    """create_tensor(TOKEN_EMBD, {n_embd, n_vocab}) in every src/models/<arch>.cpp fitplan knows: llama.cpp
    refuses the file ("tensor has wrong shape") where the table is another width."""
    embd = model.tensor(TOKEN_EMBD)
    if embd is not None and embd.shape[0] != n_embd:
        raise GGUFError(model.path, f"{meta.named(Keys.LLM.EMBEDDING_LENGTH)} is {n_embd} but {TOKEN_EMBD} is "
                                    f"{embd.shape[0]} wide; llama.cpp refuses a tensor of the wrong shape")


def _checked_experts_used(model: ModelFile, meta: _Meta, n_layer_all: int, n_expert: int) -> int:
    """The most experts any block uses: load_hparams' GGML_ASSERT(n_expert_used_max <= n_expert), and 0
    without experts."""
    n_expert_used = max([int(x) for x in meta.per_layer(Keys.LLM.EXPERT_USED_COUNT, n_layer_all, 0)], default=0)
    if n_expert_used > n_expert or (n_expert > 0 and n_expert_used == 0):
        raise GGUFError(model.path, f"{meta.named(Keys.LLM.EXPERT_USED_COUNT)} is {n_expert_used} with "
                                    f"{meta.named(Keys.LLM.EXPERT_COUNT)} {n_expert}; llama.cpp asserts 0 < used <= "
                                    f"experts (and no used experts without experts)")
    return n_expert_used


def _heads(meta: _Meta, n_layer_all: int, n_embd: int) -> _Heads:
    """Head counts per block (KV heads default to the heads), and head sizes: n_embd / n_head where the file
    gives none, the sliding-window layers' sizes defaulting to the full ones."""
    n_head = [int(x) for x in meta.per_layer(Keys.Attention.HEAD_COUNT, n_layer_all, 0)]
    n_head_kv = ([int(x) for x in meta.per_layer(Keys.Attention.HEAD_COUNT_KV, n_layer_all, 0)]
                 if meta.get(Keys.Attention.HEAD_COUNT_KV) is not None else list(n_head))
    n_ff = [int(x) for x in meta.per_layer(Keys.LLM.FEED_FORWARD_LENGTH, n_layer_all, 0)]
    head_max = max(n_head) if n_head else 0
    fallback = n_embd // head_max if head_max else 0
    dk = _head_size(meta, Keys.Attention.KEY_LENGTH, fallback)
    dv = _head_size(meta, Keys.Attention.VALUE_LENGTH, fallback)
    return _Heads(n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff, dk=dk, dv=dv,
                  dk_swa=_head_size(meta, Keys.Attention.KEY_LENGTH_SWA, dk),
                  dv_swa=_head_size(meta, Keys.Attention.VALUE_LENGTH_SWA, dv),
                  mla=bool(meta.get(Keys.Attention.KEY_LENGTH_MLA)) and bool(meta.get(Keys.Attention.VALUE_LENGTH_MLA)))


def _head_size(meta: _Meta, template: str, fallback: int) -> int:
    """A head-size key, or `fallback` where it is absent or 0."""
    return int(meta.get(template, 0) or 0) or fallback


def _derived_layers(meta: _Meta, header: _Header, heads: _Heads) -> list[LayerFacts]:
    """Each block's attention kind, cache widths, window and recurrent state."""
    n = header.n_layer_all
    swa, window = _swa_flags(meta, n)
    recurrent = _recurrent_flags(meta, n, header.n_layer, heads.n_head_kv, heads.n_ff)
    r, s = _state_sizes(meta, header.n_embd, heads.n_head[0] if heads.n_head else 0)
    kv_from_start = _kv_from_start(meta, meta.arch, n)
    kv_until = n if kv_from_start is None else kv_from_start
    keeps_kv = meta.arch not in NO_MEMORY
    layers = []
    for il in range(n):
        is_rec = recurrent[il]
        kind = _attention_kind(meta.arch, header.known, is_rec, swa[il], heads.n_head_kv[il])
        attends = kind in (AttnKind.FULL, AttnKind.SWA)
        is_swa = kind is AttnKind.SWA
        layers.append(LayerFacts(
            index=il, kind=kind, n_head=heads.n_head[il], n_head_kv=heads.n_head_kv[il] if attends else 0,
            head_dim_k=_layer_head_size(attends, is_swa, heads.dk, heads.dk_swa),
            head_dim_v=_layer_head_size(attends and not heads.mla, is_swa, heads.dv, heads.dv_swa),
            window=window if is_swa else 0,
            has_kv=attends and keeps_kv and il < kv_until,
            state_r=r if is_rec else 0, state_s=s if is_rec else 0,
            nextn=il >= header.n_layer,
        ))
    return layers


def _attention_kind(arch: str, known: bool, recurrent: bool, swa: bool, n_head_kv: int) -> AttnKind:
    """A block attends where its architecture is known, it has KV heads and it is not recurrent (or its
    recurrence runs beside attention, RecurrentRule.PARALLEL)."""
    parallel = RECURRENT_RULES.get(arch) is RecurrentRule.PARALLEL
    if known and (not recurrent or parallel) and n_head_kv > 0:
        return AttnKind.SWA if swa else AttnKind.FULL
    if recurrent:
        return AttnKind.RECURRENT
    return AttnKind.NONE if known else AttnKind.UNKNOWN


def _layer_head_size(cached: bool, swa: bool, full: int, sliding: int) -> int:
    """A layer's K or V head size: the sliding-window one on SWA layers, 0 where the layer caches none."""
    if not cached:
        return 0
    return sliding if swa else full


def _with_indexer_caches(meta: _Meta, layers: list[LayerFacts], n_layer: int) -> list[LayerFacts]:
    """The trunk layers that own a DSA indexer get its key cache's width (INDEXER_RULES, then the file's
    attention.indexer.types: a scalar for every block or one entry per trunk block, get_key_or_arr)."""
    if meta.arch not in INDEXER_RULES:
        return layers
    if meta.arch in INDEXER_NEEDS_TOP_K and not int(meta.get(Keys.Attention.Indexer.TOP_K, 0) or 0):
        return layers
    width = int(meta.need(Keys.Attention.Indexer.KEY_LENGTH)) * INDEXER_WIDTH.get(meta.arch, 1)
    rule = INDEXER_RULES[meta.arch]
    n_ctx = int(meta.get(Keys.LLM.CONTEXT_LENGTH, 0) or 0)
    owns = [rule(n_ctx, il) for il in range(n_layer)]
    key = LLM_KV_ATTENTION_INDEXER_TYPES
    types = meta.get(key)
    if isinstance(types, tuple | SkippedArray):
        if len(types) != n_layer:
            raise GGUFError(meta.model.path, f"{meta.named(key)} has {len(types)} entries, expected {n_layer} (one "
                                             f"per trunk block); llama.cpp refuses another length")
        owns = [bool(x) for x in types] if isinstance(types, tuple) else owns
    elif types is not None:
        owns = [bool(types)] * n_layer
    return [replace(lf, index_k=width) if lf.index < n_layer and owns[lf.index] and lf.has_kv else lf
            for lf in layers]


def _with_msa_caches(meta: _Meta, layers: list[LayerFacts], n_layer: int) -> list[LayerFacts]:
    """glm5: the trunk blocks past the leading dense ones get the MSA indexer cache's K and V widths
    (one head each: attention.indexer.key_length and the layer's value length)."""
    if meta.arch not in MSA_ARCHS:
        return layers
    width = int(meta.need(Keys.Attention.Indexer.KEY_LENGTH))
    n_dense = int(meta.get(Keys.LLM.LEADING_DENSE_BLOCK_COUNT, 0) or 0)
    return [replace(lf, index_k=width, index_v=lf.head_dim_v) if n_dense <= lf.index < n_layer and lf.has_kv
            else lf for lf in layers]


def _with_kda_states(meta: _Meta, layers: list[LayerFacts], n_head: int) -> list[LayerFacts]:
    """glm5: the recurrent layers of a KDA model get Kimi Delta Attention's state sizes (KDA_STATE_ARCHS)."""
    if meta.arch not in KDA_STATE_ARCHS:
        return layers
    head = int(meta.need(Keys.KDA.HEAD_DIM))
    d_conv = int(meta.get(Keys.SSM.CONV_KERNEL, 0) or 0)
    r = 3 * (d_conv - 1 if d_conv > 0 else 3) * n_head * head
    s = head * head * n_head
    return [replace(lf, state_r=r, state_s=s) if lf.kind is AttnKind.RECURRENT else lf for lf in layers]
def _with_dsv4_caches(meta: _Meta, layers: list[LayerFacts], n_layer_all: int) -> list[LayerFacts]:
    """dsv4: the layers of a llama_kv_cache_dsv4 keep K only (dsv4_make_k_only) and get their compress ratio;
    ratio-4 layers also own the indexer's key cache, attention.indexer.key_length wide (one head)."""
    if meta.arch not in DSV4_CACHE:
        return layers
    key = LLM_KV_ATTENTION_COMPRESS_RATIOS
    ratios = meta.need(key)
    if not isinstance(ratios, tuple) or len(ratios) < n_layer_all:
        # deepseek4.cpp load_arch_hparams: "DeepSeek-V4 compress_ratios is shorter than block_count"
        raise GGUFError(meta.model.path, f"{meta.named(key)} must be an array of at least {n_layer_all} entries "
                                         f"(one per block); llama.cpp refuses a shorter one")
    if any(int(r) not in (0, DSV4_CSA_RATIO, DSV4_HCA_RATIO) for r in ratios[:n_layer_all]):
        raise GGUFError(meta.model.path, f"{meta.named(key)} holds a ratio other than 0, {DSV4_CSA_RATIO} and "
                                         f"{DSV4_HCA_RATIO}; llama.cpp's DeepSeek-V4 loader refuses it")
    width = int(meta.need(Keys.Attention.Indexer.KEY_LENGTH))
    return [replace(lf, head_dim_v=0, comp_ratio=int(ratios[lf.index]),
                    index_k=width if int(ratios[lf.index]) == DSV4_CSA_RATIO else 0) if lf.has_kv else lf
            for lf in layers]


def _kv_from_start(meta: _Meta, arch: str, n: int) -> int | None:
    """Layers at or past this index reuse an earlier layer's cache (llama.cpp n_layer_kv_from_start)."""
    if arch in _KV_FROM_START_DEFAULTS:   # fixed by the loader, whatever the file's shared_kv_layers says
        return _KV_FROM_START_DEFAULTS[arch](n)
    shared = meta.get(Keys.Attention.SHARED_KV_LAYERS)
    if shared:
        return n - int(shared)
    return None


# gemma3n's first 20 blocks own caches, later ones reuse them: load_arch_hparams sets 20 and reads no key
# (src/models/gemma3n.cpp).
_KV_FROM_START_DEFAULTS: dict[str, Callable[[int], int | None]] = {"gemma3n": lambda _n: 20}
