"""Drafters for the speculative-decoding tests: small gemma3-layout models (src/models/gemma3.cpp) whose
vocabulary is copied from a target's header, so the pinned llama.cpp accepts them as its drafter
(common_speculative_are_compatible compares the token texts), written as sparse GGUFs.

gemma3 is SWA only when the file declares `gemma3.attention.sliding_window` (the pinned
llama_model_gemma3::load_hparams), with every layer but each 6th windowed: a 5-layer drafter with a
window has all five layers windowed, one without has none — seed 003 §6's two drafters.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from gguf import GGUFValueType, Keys

from planner.gguf.reader import ModelFile
from planner.gguf.vocab import token_texts
from planner.synth.gguf_factory import ModelSpec, Q, T, Typed, _common, gemma3_spec

# scalar tokenizer keys llama.cpp's vocabulary loader reads, copied as they are
_SCALAR_KEYS = (Keys.Tokenizer.MODEL, Keys.Tokenizer.PRE, Keys.Tokenizer.BOS_ID, Keys.Tokenizer.EOS_ID,
                Keys.Tokenizer.UNK_ID, Keys.Tokenizer.PAD_ID, Keys.Tokenizer.ADD_BOS, Keys.Tokenizer.ADD_EOS)


def vocab_metadata(target: ModelFile) -> dict[str, Any]:
    """The target's tokenizer keys: its token texts and the scalar keys (scores and token types are
    optional to llama.cpp's loader and left out)."""
    meta: dict[str, Any] = {k: target.metadata[k] for k in _SCALAR_KEYS if k in target.metadata}
    meta[Keys.Tokenizer.LIST] = list(token_texts(target))
    return meta


def drafter_spec(vocab: dict[str, Any], *, n_layer: int = 5, n_embd: int = 256, n_head: int = 8,
                 n_head_kv: int = 8, head_dim: int = 128, n_ff: int = 512, window: int | None = None) -> ModelSpec:
    """A gemma3 drafter with this vocabulary: K and V rows of n_head_kv x head_dim per layer."""
    n_vocab = len(vocab[Keys.Tokenizer.LIST])
    spec = gemma3_spec(n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim,
                       n_ff=n_ff, n_vocab=n_vocab, window=window)
    spec.metadata.update(vocab)
    spec.metadata[Keys.LLM.CONTEXT_LENGTH] = 262144
    return spec


def write_drafter(path: Path, target: ModelFile, window: int | None = None, **dims: int) -> Path:
    """Write (once) a drafter sharing `target`'s vocabulary; `dims` as drafter_spec's."""
    if not path.exists():
        partial = path.with_suffix(".partial.gguf")
        [written] = drafter_spec(vocab_metadata(target), window=window, **dims).write(partial)
        written.rename(path)
    return path


def dflash_spec(vocab: dict[str, Any], *, n_embd: int = 640, n_head: int = 4, n_head_kv: int = 1, head_dim: int = 256,
                n_ff: int = 2048, target_layers: tuple[int, ...] = (1, 8, 15), block_size: int = 8,
                output: bool = False, token_embd: bool = False) -> ModelSpec:
    """A one-layer DFlash drafter (src/models/dflash.cpp load_arch_tensors): fc [len(target_layers) n_embd,
    n_embd] over the target's hidden states, enc.output_norm, one qwen3-style block, output_norm; as
    published DFlash files, by default no token_embd and no output (it runs the target's)."""
    n_vocab = len(vocab[Keys.Tokenizer.LIST])
    spec = ModelSpec("dflash")
    _common(spec, 1, n_embd, n_vocab)
    spec.metadata.update(vocab)
    spec.metadata.update({
        Keys.Attention.HEAD_COUNT: n_head, Keys.Attention.HEAD_COUNT_KV: n_head_kv,
        Keys.Attention.KEY_LENGTH: head_dim, Keys.Attention.VALUE_LENGTH: head_dim,
        Keys.LLM.FEED_FORWARD_LENGTH: n_ff, Keys.Rope.FREQ_BASE: 1000000.0,
        "{arch}.target_layers": Typed(list(target_layers), GGUFValueType.ARRAY, GGUFValueType.INT32),
        "{arch}.block_size": block_size,
    })
    if token_embd:
        spec.add(T.TOKEN_EMBD, Q.F16, (n_embd, n_vocab))
    spec.add(T.OUTPUT_NORM, Q.F32, (n_embd,))
    if output:
        spec.add(T.OUTPUT, Q.F16, (n_embd, n_vocab))
    spec.tensors.append(("fc.weight", Q.F16, (len(target_layers) * n_embd, n_embd)))
    spec.tensors.append(("enc.output_norm.weight", Q.F32, (n_embd,)))
    spec.add(T.ATTN_NORM, Q.F32, (n_embd,), 0)
    spec.add(T.ATTN_Q, Q.F16, (n_embd, n_head * head_dim), 0)
    spec.add(T.ATTN_K, Q.F16, (n_embd, n_head_kv * head_dim), 0)
    spec.add(T.ATTN_V, Q.F16, (n_embd, n_head_kv * head_dim), 0)
    spec.add(T.ATTN_OUT, Q.F16, (n_head * head_dim, n_embd), 0)
    spec.add(T.ATTN_Q_NORM, Q.F32, (head_dim,), 0)
    spec.add(T.ATTN_K_NORM, Q.F32, (head_dim,), 0)
    spec.add(T.FFN_NORM, Q.F32, (n_embd,), 0)
    spec.add(T.FFN_GATE, Q.F16, (n_embd, n_ff), 0)
    spec.add(T.FFN_DOWN, Q.F16, (n_ff, n_embd), 0)
    spec.add(T.FFN_UP, Q.F16, (n_embd, n_ff), 0)
    return spec
