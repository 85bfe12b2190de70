"""planner/gguf/vocab.py: the vocabulary llama.cpp loads from a header, defaults from the pinned
src/llama-vocab.cpp llama_vocab::impl::load written out by hand."""
from __future__ import annotations

from typing import Any

from gguf import Keys

from planner.gguf.reader import ModelFile, read_model
from planner.gguf.vocab import LLAMA_TOKEN_NULL, VocabType, token_texts, vocab_of
from planner.synth.draft_models import drafter_spec


def _model(n: int = 200, **keys: Any) -> ModelFile:
    meta: dict[str, Any] = {Keys.Tokenizer.LIST: tuple(f"t{i}" for i in range(n))}
    meta.update({getattr(Keys.Tokenizer, k): v for k, v in keys.items()})
    return ModelFile("mem.gguf", 3, "llama", meta, ())


def test_spm_adds_bos_1_and_no_eos_by_default():
    v = vocab_of(_model(MODEL="llama"))
    assert (v.vocab_type, v.add_bos, v.add_eos) == (VocabType.SPM, True, False)
    assert (v.bos_id, v.eos_id, v.n_tokens) == (1, 2, 200)


def test_bpe_bos_follows_the_pre_tokenizer():
    assert vocab_of(_model(MODEL="gpt2", PRE="default")).add_bos is False
    assert vocab_of(_model(MODEL="gpt2", PRE="llama-bpe")).add_bos is True
    assert vocab_of(_model(MODEL="gpt2", PRE="glm4")).bos_id == LLAMA_TOKEN_NULL
    assert vocab_of(_model(MODEL="gpt2", PRE="default")).bos_id == 11
    # Gemma 4's pre-tokenizer turns BOS on even against the key
    assert vocab_of(_model(MODEL="gemma4", ADD_BOS=False)).add_bos is True


def test_t5_adds_eos_and_wpm_bos_101():
    t5 = vocab_of(_model(MODEL="t5"))
    assert (t5.vocab_type, t5.add_bos, t5.add_eos, t5.bos_id, t5.eos_id) == (VocabType.UGM, False, True,
                                                                              LLAMA_TOKEN_NULL, 1)
    assert vocab_of(_model(MODEL="bert")).bos_id == 101


def test_keys_override_and_out_of_range_ids_fall_back():
    v = vocab_of(_model(MODEL="llama", ADD_BOS=False, ADD_EOS=True, BOS_ID=7, EOS_ID=8))
    assert (v.add_bos, v.add_eos, v.bos_id, v.eos_id) == (False, True, 7, 8)
    # a key past the vocabulary keeps the default; a default past it is disabled
    assert vocab_of(_model(MODEL="llama", BOS_ID=500)).bos_id == 1
    assert vocab_of(_model(50, MODEL="bert")).bos_id == LLAMA_TOKEN_NULL


def test_no_vocab_takes_its_size_from_the_architecture_key():
    m = ModelFile("mem.gguf", 3, "llama", {Keys.Tokenizer.MODEL: "no_vocab", "llama.vocab_size": 64}, ())
    v = vocab_of(m)
    assert (v.vocab_type, v.n_tokens, v.add_bos, v.bos_id) == (VocabType.NONE, 64, False, LLAMA_TOKEN_NULL)


def test_token_texts_read_the_whole_list(tmp_path):
    texts = [f"tok-{i}" for i in range(5000)]   # longer than the header reader materialises
    path = tmp_path / "m.gguf"
    drafter_spec({Keys.Tokenizer.MODEL: "llama", Keys.Tokenizer.LIST: texts}, n_layer=1, n_embd=64, n_head=2,
                 n_head_kv=1, head_dim=32).write(path)
    assert token_texts(read_model(str(path))) == tuple(t.encode() for t in texts)
