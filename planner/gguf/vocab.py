"""A model's vocabulary as the pinned llama.cpp loads it from the GGUF header: its type, the BOS/EOS
ids and whether they are added, and the token texts (src/llama-vocab.cpp llama_vocab::impl::load).

The header reader (reader.py) leaves long arrays unread; `token_texts` walks the header once more
for the one array a comparison needs (a 262k-token list in a fraction of a second), so only what
asks for the texts pays for them.

Defaults when a key is absent follow llama_vocab::impl::load at the pinned build: each tokenizer
model sets its own BOS/EOS ids, and add_bos/add_eos come from the vocabulary type (SPM and WPM add
BOS, UGM adds EOS) or, for BPE, from the pre-tokenizer (llama3's family, tekken, chameleon add BOS);
tokenizer.ggml.add_bos_token / add_eos_token override them, and Gemma 4's pre-tokenizer forces BOS
on. A default id outside the vocabulary is disabled, a key's id outside it is ignored.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from enum import IntEnum

from gguf import GGUFValueType, Keys

from planner.core.errors import GGUFError
from planner.gguf.cursor import Cursor, short
from planner.gguf.location import open_source
from planner.gguf.reader import GGUF_MAGIC, ModelFile, _read_value, _value_type

LLAMA_TOKEN_NULL = -1


class VocabType(IntEnum):
    """include/llama.h enum llama_vocab_type."""

    NONE = 0
    SPM = 1
    BPE = 2
    WPM = 3
    UGM = 4
    RWKV = 5
    PLAMO2 = 6
    TEST = 7


@dataclass(frozen=True)
class _ModelDefaults:
    vocab_type: VocabType
    bos_id: int
    eos_id: int
    add_bos: bool = False    # llama_vocab::impl's member defaults
    add_eos: bool = False


_N = LLAMA_TOKEN_NULL
# tokenizer.ggml.model -> llama_vocab::impl::load's type and default special tokens and add flags
TOKENIZER_MODELS: dict[str, _ModelDefaults] = {
    "no_vocab": _ModelDefaults(VocabType.NONE, _N, _N),
    "none": _ModelDefaults(VocabType.NONE, _N, _N),
    "llama": _ModelDefaults(VocabType.SPM, 1, 2, add_bos=True),
    "bert": _ModelDefaults(VocabType.WPM, 101, _N, add_bos=True),
    "gpt2": _ModelDefaults(VocabType.BPE, 11, 11),
    "hybriddna": _ModelDefaults(VocabType.BPE, 11, 11),
    "whitespace": _ModelDefaults(VocabType.BPE, 11, 11),
    "t5": _ModelDefaults(VocabType.UGM, _N, 1, add_eos=True),
    "rwkv": _ModelDefaults(VocabType.RWKV, _N, _N),
    "test": _ModelDefaults(VocabType.TEST, _N, _N),
    "plamo2": _ModelDefaults(VocabType.PLAMO2, 1, 2),
    "gemma4": _ModelDefaults(VocabType.BPE, _N, _N),
}
# BPE pre-tokenizers that turn add_bos on (llama_vocab::impl::load's pre-tokenizer ladder)
BPE_PRE_ADD_BOS = frozenset({"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
                             "lfm2", "jina-v5-nano", "tekken", "chameleon"})
# BPE pre-tokenizers that disable the default BOS id
BPE_PRE_NO_BOS = frozenset({"chatglm-bpe", "glm4", "glm5"})
# the pre-tokenizers of LLAMA_VOCAB_PRE_TYPE_GEMMA4, whose add_bos is forced on after the keys are read
GEMMA4_PRE = frozenset({"gemma4", "granite-embed-multi-311m"})


@dataclass(frozen=True)
class Vocab:
    """What common_speculative_are_compatible compares (common/speculative.cpp)."""

    tokenizer_model: str
    vocab_type: VocabType
    n_tokens: int
    add_bos: bool
    add_eos: bool
    bos_id: int          # LLAMA_TOKEN_NULL (-1) when the vocabulary has none
    eos_id: int


def _special(meta: dict, key: str, default: int, n_tokens: int) -> int:
    if default >= n_tokens:          # "default special token ... out of vocab range, disabling"
        default = LLAMA_TOKEN_NULL
    value = meta.get(key)
    if value is None or not 0 <= int(value) < n_tokens:
        return default
    return int(value)


def vocab_of(model: ModelFile) -> Vocab:
    """The vocabulary llama.cpp would load from this header (reads no file)."""
    meta = model.metadata
    name = str(meta.get(Keys.Tokenizer.MODEL, ""))
    defaults = TOKENIZER_MODELS.get(name)
    if defaults is None:
        raise GGUFError(model.path, f"unknown tokenizer: {short(name)}")
    if defaults.vocab_type is VocabType.NONE:   # llama.cpp reads no special token or add flag for it
        return Vocab(name, VocabType.NONE, int(meta.get(Keys.LLM.VOCAB_SIZE.format(arch=model.architecture), 0) or 0),
                     False, False, LLAMA_TOKEN_NULL, LLAMA_TOKEN_NULL)
    pre = "gemma4" if name == "gemma4" else str(meta.get(Keys.Tokenizer.PRE, ""))
    add_bos, add_eos, bos = defaults.add_bos, defaults.add_eos, defaults.bos_id
    if defaults.vocab_type is VocabType.BPE:
        add_bos = add_bos or pre in BPE_PRE_ADD_BOS
        bos = LLAMA_TOKEN_NULL if pre in BPE_PRE_NO_BOS else bos
    tokens = meta.get(Keys.Tokenizer.LIST)
    n_tokens = len(tokens) if tokens is not None else 0
    add_bos = bool(meta.get(Keys.Tokenizer.ADD_BOS, add_bos))
    add_eos = bool(meta.get(Keys.Tokenizer.ADD_EOS, add_eos))
    if defaults.vocab_type is VocabType.BPE and pre in GEMMA4_PRE:
        add_bos = True
    return Vocab(name, defaults.vocab_type, n_tokens, add_bos, add_eos,
                 _special(meta, Keys.Tokenizer.BOS_ID, bos, n_tokens),
                 _special(meta, Keys.Tokenizer.EOS_ID, defaults.eos_id, n_tokens))


def token_texts(model: ModelFile) -> tuple[bytes, ...]:
    """Every token's text (tokenizer.ggml.tokens), as bytes, read from the model's first file."""
    return _token_texts(model.path, model.header_sha256)


@functools.lru_cache(maxsize=8)
def _token_texts(path: str, _header_sha256: str) -> tuple[bytes, ...]:
    """Cached by the header's digest: a file rewritten in place is read again."""
    with open_source(path) as source:
        cur = Cursor(source)
        cur.need(24, "the GGUF preamble")
        if bytes(cur.buf[:4]) != GGUF_MAGIC:
            raise GGUFError(path, "not a GGUF file (bad magic)")
        cur.pos = 8
        cur.unpack("<Q", "tensor count")
        n_kv = cur.unpack("<Q", "metadata count")
        for _ in range(n_kv):
            key = cur.string("a metadata key")
            vtype = _value_type(cur, cur.unpack("<I", f"type of {key!r}"), key)
            if key == Keys.Tokenizer.LIST and vtype == GGUFValueType.ARRAY:
                return _strings(cur, key)
            _read_value(cur, vtype, key)
    raise GGUFError(path, f"cannot find tokenizer vocab in model file ({Keys.Tokenizer.LIST})")


def _strings(cur: Cursor, key: str) -> tuple[bytes, ...]:
    etype = cur.unpack("<I", f"array type of {key!r}")
    if etype != GGUFValueType.STRING:
        raise GGUFError(cur.path, f"invalid gguf type for {key}")
    count = cur.unpack("<Q", f"array length of {key!r}")
    if count * 8 > cur.size - cur.pos:
        raise GGUFError(cur.path, f"hostile header: array {key!r} claims {count} elements")
    out = []
    for _ in range(count):
        length = cur.unpack("<Q", f"length of an element of {key!r}")
        if length > cur.size - cur.pos:
            raise GGUFError(cur.path, f"hostile header: an element of {key!r} claims {length} bytes")
        cur.need(length, f"an element of {key!r}")
        out.append(bytes(cur.buf[cur.pos:cur.pos + length]))
        cur.pos += length
    return tuple(out)
