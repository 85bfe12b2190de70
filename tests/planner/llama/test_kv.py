"""Context bytes per device: every figure below is worked out by hand from the definitions in
llama-context.cpp (n_ctx padded to 256, per-stream n_ctx_seq), llama-kv-cache.cpp (K and V rows of
n_head_kv x head_dim per cell and stream), llama-kv-cache-iswa.cpp (SWA cells = pad(min(kv_size,
n_swa x (unified ? n_seq : 1) + n_ubatch), 256)) and llama-memory-recurrent.cpp (f32 r/s rows per
sequence). f16 = 2 bytes; q8_0 = 34 bytes per 32 values.
"""
from __future__ import annotations

import pytest

from planner.core.errors import FlagError
from planner.gguf.reader import read_model
from planner.llama.context import model_context
from planner.llama.flags import parse_llama_flags
from planner.llama.kv import context_bytes, layer_caches
from planner.llama.placement import HOST, Backend, Device
from planner.llama.settings import context_params, resolve_on
from planner.synth.gguf_factory import deepseek2_spec, gemma3_spec, llama_spec, mamba2_spec

A = Device("A", Backend.RPC, 32, 0, False, "127.0.0.1:1")
B = Device("B", Backend.RPC, 32, 0, False, "127.0.0.1:2")


def _ctx(spec, tmp_path):
    [path] = spec.write(tmp_path / f"{spec.arch}.gguf")
    return model_context(read_model(path))


def _kv(ctx, argv, devices=()):
    return context_bytes(layer_caches(resolve_on(ctx, parse_llama_flags(argv), devices, {})))


@pytest.fixture
def llama(tmp_path):
    # 2 layers, head_dim 256/8 = 32, 2 KV heads: a K or V row is 64 values = 128 bytes in f16
    return _ctx(llama_spec(n_layer=2, n_embd=256, n_head=8, n_head_kv=2), tmp_path)


@pytest.mark.parametrize("argv, expected", [
    (["-c", "1000"], 2 * 2 * 128 * 1024),                       # n_ctx padded to 1024
    (["-c", "0"], 2 * 2 * 128 * 4096),                          # training context 4096
    (["-c", "1000", "-ctk", "q8_0", "-ctv", "q8_0"], 2 * 2 * 68 * 1024),
    (["-c", "1000", "-ctk", "q8_0"], 2 * (68 + 128) * 1024),
    (["-c", "1000", "-np", "4"], 2 * 2 * 128 * 256 * 4),        # 4 streams of pad(1024/4) = 256
    (["-c", "1000", "-np", "3"], 2 * 2 * 128 * 512 * 3),        # 1024/3 = 341 -> 512 cells x 3 streams
    (["-c", "1000", "-np", "4", "-kvu"], 2 * 2 * 128 * 1024),   # one unified stream
])
def test_full_attention_cache(llama, argv, expected):
    assert _kv(llama, argv) == {HOST: expected}


def test_cache_follows_layers_and_nkvo_keeps_it_on_the_host(llama):
    # -ngl all over A:B 1:1 -> 3 placeable layers: layer 0 (0/3) on A, layer 1 (1/3) on A, output (2/3) on B
    per_layer = 2 * 128 * 1024
    assert _kv(llama, ["-c", "1024", "-ts", "1,1"], (A, B)) == {"A": 2 * per_layer}
    assert _kv(llama, ["-c", "1024", "-ts", "1,2"], (A, B)) == {"A": per_layer, "B": per_layer}
    assert _kv(llama, ["-c", "1024", "-ts", "1,2", "-nkvo"], (A, B)) == {HOST: 2 * per_layer}


def test_quantized_v_needs_flash_attention(llama):
    with pytest.raises(FlagError, match="requires Flash Attention"):
        _kv(llama, ["-fa", "off", "-ctv", "q8_0"])


@pytest.fixture
def gemma(tmp_path):
    # gemma3 pattern 6: layers 0-4 and 6 slide over 128 tokens, layer 5 is global; K/V rows 64 values
    return _ctx(gemma3_spec(n_layer=7, n_head_kv=1, head_dim=64, window=128), tmp_path)


@pytest.mark.parametrize("argv, full_cells, swa_cells, streams", [
    (["-c", "4096"], 4096, 768, 1),                    # pad(min(4096, 128 + 512)) = 768
    (["-c", "4096", "-ub", "128"], 4096, 256, 1),      # pad(128 + 128) = 256
    (["-c", "4096", "--swa-full"], 4096, 4096, 1),
    (["-c", "512"], 512, 512, 1),                      # the window never exceeds the cache
    (["-c", "4096", "-np", "4"], 1024, 768, 4),        # per stream: min(1024, 128 + 512)
    (["-c", "4096", "-np", "4", "-kvu"], 4096, 1024, 1),   # unified: 128 x 4 + 512
])
def test_swa_cache(gemma, argv, full_cells, swa_cells, streams):
    row = 2 * 128   # K + V rows of one cell
    assert _kv(gemma, argv) == {HOST: row * streams * (full_cells + 6 * swa_cells)}


def test_mla_cache_holds_k_only(tmp_path):
    # deepseek2 MLA: one K head of kv_lora_rank 128 + rope 32 = 160 values (320 bytes f16), no V
    ctx = _ctx(deepseek2_spec(n_layer=3, kv_lora_rank=128, qk_rope=32), tmp_path)
    assert _kv(ctx, ["-c", "256"]) == {HOST: 3 * 320 * 256}


def test_mla_refuses_different_k_and_v_types(tmp_path):
    # llama_init_from_model: "model does not support different K (q8_0) and V (f16) cache types"
    ctx = _ctx(deepseek2_spec(n_layer=3, kv_lora_rank=128, qk_rope=32), tmp_path)
    with pytest.raises(FlagError, match="different K"):
        _kv(ctx, ["-c", "1024", "-ctk", "q8_0", "-ctv", "f16"])
    assert _kv(ctx, ["-c", "1024", "-ctk", "q8_0", "-ctv", "q8_0"])



@pytest.mark.parametrize("n_seq", [1, 3])
def test_recurrent_state(tmp_path, n_seq):
    # mamba2: r = (d_conv - 1) x (d_inner + 2 n_group d_state) = 3 x 320 f32; s = d_state x d_inner = 16 x 256 f32
    ctx = _ctx(mamba2_spec(n_layer=2, d_conv=4, d_inner=256, d_state=16, n_group=2), tmp_path)
    per_seq = 3 * 320 * 4 + 16 * 256 * 4
    assert _kv(ctx, ["-c", "4096", "-np", str(n_seq)]) == {HOST: 2 * per_seq * n_seq}


def test_context_params_batch_caps():
    cp = context_params(parse_llama_flags(["-c", "300", "-b", "4096", "-ub", "1024"]), 8192)
    # n_batch = min(n_ctx, -b) before padding; n_ubatch = min(n_batch, -ub); n_ctx padded to 512
    assert (cp.n_ctx, cp.n_batch, cp.n_ubatch) == (512, 300, 300)
