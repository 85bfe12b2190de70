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

from gguf import Keys

from planner.gguf.reader import ModelFile
from planner.gguf.vocab import token_texts
from planner.synth.gguf_factory import ModelSpec, gemma3_spec

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
