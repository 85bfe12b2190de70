"""Architecture facts per layer: which layers attend (full or sliding window), which are recurrent,
head counts and head sizes, recurrent state sizes.

Every expected figure is worked out here from llama.cpp's rules at the pinned build:
- set_swa_pattern (src/llama-hparams.cpp): layer il is SWA when il % n_pattern < n_pattern - 1;
  gemma3 uses n_pattern 6 and only when the file sets a sliding window (src/models/gemma3.cpp).
- n_embd_head_k defaults to n_embd / n_head unless attention.key_length is set (llama-model.cpp).
- n_embd_r = (d_conv - 1) * (d_inner + 2 * n_group * d_state), n_embd_s = d_state * d_inner
  (llama_hparams::n_embd_r / n_embd_s); LFM2's short conv: n_embd_r = n_embd * (l_cache - 1).
- granitehybrid / lfm2: a layer is recurrent iff its head_count_kv is 0; qwen3next: every
  full_attention_interval-th trunk block attends, MTP blocks are never recurrent.
"""
from __future__ import annotations

import pytest
from gguf import GGUFValueType, Keys

from planner.core.errors import GGUFError
from planner.gguf.reader import read_model
from planner.model.arch import AttnKind, model_facts
from planner.registry.examples import resolve_model
from planner.synth.gguf_factory import (
    ModelSpec,
    Q,
    T,
    Typed,
    deepseek2_spec,
    gemma3_spec,
    granitehybrid_spec,
    llama_spec,
    mamba2_spec,
    qwen3moe_spec,
    write_model,
)

FULL, SWA, REC = AttnKind.FULL, AttnKind.SWA, AttnKind.RECURRENT


def _facts(spec: ModelSpec, tmp_path):
    if not spec.tensors:   # a GGUF without tensors is refused; these tests are about metadata
        spec.add(T.OUTPUT_NORM, Q.F32, (64,))
    [path] = spec.write(tmp_path / f"{spec.arch}.gguf")
    return model_facts(read_model(path))


def test_gemma3_270m_real_file():
    facts = model_facts(read_model(resolve_model("example:gemma3-270m")))
    assert (facts.arch, facts.n_layer, facts.n_embd, facts.n_vocab) == ("gemma3", 18, 640, 262144)
    full = [lf.index for lf in facts.layers if lf.kind is FULL]
    swa = [lf.index for lf in facts.layers if lf.kind is SWA]
    assert full == [5, 11, 17]  # il % 6 == 5
    assert len(swa) == 15
    assert {lf.window for lf in facts.layers if lf.kind is SWA} == {512}
    assert {lf.window for lf in facts.layers if lf.kind is FULL} == {0}
    # one KV head of 256 (gemma3.attention.key_length / value_length)
    assert {(lf.n_head_kv, lf.head_dim_k, lf.head_dim_v, lf.k_per_cell, lf.v_per_cell) for lf in facts.layers} \
        == {(1, 256, 256, 256, 256)}


def test_llama_gqa(tmp_path):
    facts = _facts(llama_spec(n_layer=2, n_embd=256, n_head=8, n_head_kv=2, n_vocab=1000), tmp_path)
    assert facts.known and not facts.mla
    assert (facts.n_layer, facts.n_embd, facts.n_vocab, facts.n_ctx_train, facts.n_expert) == (2, 256, 1000, 4096, 0)
    for lf in facts.layers:
        # head_dim = 256 / 8 = 32; K per token = 2 KV heads x 32
        assert (lf.kind, lf.n_head, lf.n_head_kv, lf.head_dim_k, lf.head_dim_v) == (FULL, 8, 2, 32, 32)
        assert (lf.k_per_cell, lf.v_per_cell, lf.window, lf.state_r, lf.state_s) == (64, 64, 0, 0, 0)


def test_per_layer_head_count_kv_array(tmp_path):
    facts = _facts(llama_spec(n_layer=3, n_embd=256, n_head=8, n_head_kv=[2, 4, 8]), tmp_path)
    assert [lf.k_per_cell for lf in facts.layers] == [2 * 32, 4 * 32, 8 * 32]


def test_vocab_from_tokenizer_list_wins(tmp_path):
    spec = llama_spec(n_vocab=1000)
    spec.metadata[Keys.Tokenizer.LIST] = [f"t{i}" for i in range(1000)]
    del spec.metadata[Keys.LLM.VOCAB_SIZE]
    assert _facts(spec, tmp_path).n_vocab == 1000


def test_qwen3moe_decoupled_head_dim_and_experts(tmp_path):
    facts = _facts(qwen3moe_spec(n_embd=256, n_head=8, n_head_kv=2, head_dim=64, n_expert=8, n_expert_used=2),
                   tmp_path)
    assert (facts.n_expert, facts.n_expert_used, facts.n_expert_shared) == (8, 2, 0)
    # key_length 64 wins over n_embd / n_head = 32
    assert {(lf.kind, lf.head_dim_k, lf.k_per_cell, lf.v_per_cell) for lf in facts.layers} == {(FULL, 64, 128, 128)}


def test_gemma3_swa_pattern(tmp_path):
    facts = _facts(gemma3_spec(n_layer=7, window=128), tmp_path)
    assert [lf.kind for lf in facts.layers] == [SWA, SWA, SWA, SWA, SWA, FULL, SWA]
    assert [lf.window for lf in facts.layers] == [128] * 5 + [0, 128]
    assert {(lf.n_head_kv, lf.head_dim_k, lf.k_per_cell) for lf in facts.layers} == {(1, 64, 64)}


def test_gemma3_without_window_is_all_full(tmp_path):
    facts = _facts(gemma3_spec(n_layer=7, window=None), tmp_path)
    assert [lf.kind for lf in facts.layers] == [FULL] * 7
    assert {lf.window for lf in facts.layers} == {0}


def test_gemma3_pattern_from_the_file(tmp_path):
    every_2nd = _facts(gemma3_spec(n_layer=4, window=64, swa_pattern=2), tmp_path)
    assert [lf.kind for lf in every_2nd.layers] == [SWA, FULL, SWA, FULL]  # il % 2 < 1
    explicit = _facts(gemma3_spec(n_layer=4, window=64, swa_pattern=[False, True, True, False]), tmp_path)
    assert [lf.kind for lf in explicit.layers] == [FULL, SWA, SWA, FULL]


def test_deepseek2_mla_k_only(tmp_path):
    facts = _facts(deepseek2_spec(n_layer=3, kv_lora_rank=128, qk_rope=32, n_expert=4, n_expert_shared=1), tmp_path)
    assert facts.mla
    assert (facts.n_expert, facts.n_expert_used, facts.n_expert_shared) == (4, 2, 1)
    for lf in facts.layers:
        # the cache holds the compressed latent plus the rope part: 128 + 32, one head; no V
        assert (lf.kind, lf.n_head_kv, lf.head_dim_k, lf.k_per_cell, lf.v_per_cell) == (FULL, 1, 160, 160, 0)


def test_granitehybrid(tmp_path):
    facts = _facts(granitehybrid_spec(n_embd=128, n_head=4, head_count_kv=(0, 0, 2, 0), d_conv=4, d_state=16,
                                      n_group=1), tmp_path)
    assert [lf.kind for lf in facts.layers] == [REC, REC, FULL, REC]
    d_inner = 2 * 128
    r, s = (4 - 1) * (d_inner + 2 * 1 * 16), 16 * d_inner
    for lf in facts.layers:
        if lf.kind is REC:
            assert (lf.state_r, lf.state_s, lf.k_per_cell, lf.v_per_cell) == (r, s, 0, 0)
        else:  # head_dim 128 / 4 = 32, 2 KV heads
            assert (lf.state_r, lf.state_s, lf.k_per_cell, lf.v_per_cell) == (0, 0, 64, 64)


def test_mamba2_is_all_recurrent(tmp_path):
    facts = _facts(mamba2_spec(n_layer=2, n_embd=128, d_conv=4, d_inner=256, d_state=16, n_group=2), tmp_path)
    assert facts.known
    r, s = (4 - 1) * (256 + 2 * 2 * 16), 16 * 256
    assert [(lf.kind, lf.state_r, lf.state_s, lf.k_per_cell) for lf in facts.layers] == [(REC, r, s, 0)] * 2


def _qwen3next(tmp_path, extra: dict) -> ModelSpec:
    spec = ModelSpec("qwen3next", {
        Keys.LLM.BLOCK_COUNT: 5, Keys.LLM.NEXTN_PREDICT_LAYERS: 1, Keys.LLM.EMBEDDING_LENGTH: 256,
        Keys.LLM.CONTEXT_LENGTH: 4096, Keys.Attention.HEAD_COUNT: 8, Keys.Attention.HEAD_COUNT_KV: 2,
        Keys.Attention.KEY_LENGTH: 64, Keys.Attention.VALUE_LENGTH: 64, Keys.SSM.CONV_KERNEL: 4,
        Keys.SSM.INNER_SIZE: 512, Keys.SSM.STATE_SIZE: 64, Keys.SSM.GROUP_COUNT: 4, Keys.SSM.TIME_STEP_RANK: 8,
        **extra,
    })
    return _facts(spec, tmp_path)


def test_qwen3next_interval_and_mtp_block(tmp_path):
    facts = _qwen3next(tmp_path, {Keys.LLM.FULL_ATTENTION_INTERVAL: 4})
    assert facts.n_layer == 4 and facts.n_layer_all == 5
    # trunk: (il + 1) % 4 != 0 is linear attention; the MTP block (il 4) is plain attention
    assert [lf.kind for lf in facts.layers] == [REC, REC, REC, FULL, FULL]
    assert [lf.nextn for lf in facts.layers] == [False] * 4 + [True]
    r, s = (4 - 1) * (512 + 2 * 4 * 64), 64 * 512
    assert [(lf.state_r, lf.state_s) for lf in facts.layers] == [(r, s)] * 3 + [(0, 0)] * 2
    assert [lf.k_per_cell for lf in facts.layers] == [0, 0, 0, 128, 128]


def test_qwen3next_explicit_recurrent_layers(tmp_path):
    flags = Typed([True, False, True, False, False], GGUFValueType.ARRAY, GGUFValueType.BOOL)
    facts = _qwen3next(tmp_path, {"{arch}.attention.recurrent_layers": flags})
    assert [lf.kind for lf in facts.layers] == [REC, FULL, REC, FULL, FULL]


def test_lfm2_short_conv(tmp_path):
    spec = ModelSpec("lfm2", {
        Keys.LLM.BLOCK_COUNT: 3, Keys.LLM.EMBEDDING_LENGTH: 128, Keys.LLM.CONTEXT_LENGTH: 4096,
        Keys.Attention.HEAD_COUNT: 4, Keys.LLM.FEED_FORWARD_LENGTH: 256, Keys.ShortConv.L_CACHE: 3,
        Keys.Attention.HEAD_COUNT_KV: Typed([0, 2, 0], GGUFValueType.ARRAY, GGUFValueType.UINT32),
    })
    facts = _facts(spec, tmp_path)
    assert [lf.kind for lf in facts.layers] == [REC, FULL, REC]
    assert [(lf.state_r, lf.state_s) for lf in facts.layers] == [(128 * (3 - 1), 0), (0, 0), (128 * 2, 0)]
    assert facts.layers[1].k_per_cell == 2 * (128 // 4)


def test_lfm2_with_a_window_slides_every_attention_layer(tmp_path):
    # src/models/lfm2.cpp: with sliding_window > 0 every non-recurrent layer is SWA (LFM2.5 audio tokenizer)
    spec = ModelSpec("lfm2", {
        Keys.LLM.BLOCK_COUNT: 4, Keys.LLM.EMBEDDING_LENGTH: 128, Keys.LLM.CONTEXT_LENGTH: 4096,
        Keys.Attention.HEAD_COUNT: 4, Keys.LLM.FEED_FORWARD_LENGTH: 256, Keys.ShortConv.L_CACHE: 3,
        Keys.Attention.HEAD_COUNT_KV: Typed([0, 2, 2, 0], GGUFValueType.ARRAY, GGUFValueType.UINT32),
        Keys.Attention.SLIDING_WINDOW: 30,
    })
    facts = _facts(spec, tmp_path)
    assert [lf.kind for lf in facts.layers] == [REC, SWA, SWA, REC]
    assert [lf.window for lf in facts.layers] == [0, 30, 30, 0]


def test_unknown_architecture_keeps_weights_but_not_kv(tmp_path):
    facts = _facts(llama_spec(arch="zyxformer", n_layer=2), tmp_path)
    assert not facts.known
    assert [lf.kind for lf in facts.layers] == [AttnKind.UNKNOWN] * 2
    assert {(lf.k_per_cell, lf.v_per_cell, lf.state_r, lf.state_s) for lf in facts.layers} == {(0, 0, 0, 0)}


@pytest.mark.parametrize("drop", [Keys.LLM.BLOCK_COUNT, Keys.LLM.EMBEDDING_LENGTH, Keys.Attention.HEAD_COUNT])
def test_missing_required_keys(tmp_path, drop):
    spec = llama_spec()
    del spec.metadata[drop]
    [path] = spec.write(tmp_path / "m.gguf")
    with pytest.raises(GGUFError, match=f"missing required key {drop.format(arch='llama')}"):
        model_facts(read_model(path))


def test_per_layer_array_too_short(tmp_path):
    spec = llama_spec(n_layer=3)
    spec.metadata[Keys.Attention.HEAD_COUNT_KV] = [2, 2]
    [path] = spec.write(tmp_path / "m.gguf")
    with pytest.raises(GGUFError, match="llama.attention.head_count_kv has 2 entries, expected 3"):
        model_facts(read_model(path))


def test_mamba2_needs_no_head_count(tmp_path):
    spec = mamba2_spec()
    del spec.metadata[Keys.Attention.HEAD_COUNT]
    [path] = write_model(tmp_path / "m.gguf", spec.arch, spec.metadata, spec.tensors)
    assert [lf.kind for lf in model_facts(read_model(path)).layers] == [REC, REC]
