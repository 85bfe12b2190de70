"""LoRA adapters' buffers (planner/memory/lora_memory.py) against bytes worked out by hand from the shapes.

The target: a sparse llama from gguf_factory (2 layers, n_embd 64, 4 heads of 16, 2 KV heads,
so attn_q is [64, 64] and attn_v [64, 32]; n_ff 128; 256 tokens), attention in Q4_0 (repacked on a
CPU whose repack table takes Q4_0), V in F32, the FFN in Q8_0. Adapters: real random F16/Q8_0
weights from planner/synth/lora_factory.py. llama.cpp's rules: src/llama-adapter.cpp
llama_adapter_lora_init_impl and ggml-alloc.c ggml_backend_alloc_ctx_tensors_from_buft.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as Q

from planner.core.errors import GGUFError
from planner.llama.context import model_context
from planner.llama.flags import LoraArg, parse_llama_flags
from planner.llama.placement import HOST, Device
from planner.llama.settings import LlamaSettings, resolve_on
from planner.memory.lora_memory import UNCOUNTED_NOTE, estimate_lora, estimate_loras
from planner.synth.gguf_factory import llama_spec
from planner.synth.lora_factory import LoraTensor, lora_layout, write_lora
from runtime.ggml.profiles import Backend

REPACK = {Q.Q4_0: 8}   # the x86 AVX2 table's Q4_0 entry (ggml-cpu/repack.cpp)
Q_SHAPE, V_SHAPE = (64, 64), (64, 32)


def _target(tmp: Path, tied: bool = False) -> Path:
    spec = llama_spec(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_vocab=256, attn_type=Q.Q4_0,
                      v_type=Q.F32, ffn_type=Q.Q8_0, down_type=Q.Q8_0, embd_type=Q.Q8_0,
                      out_type=None if tied else Q.Q8_0)
    return spec.write(tmp / ("tied.gguf" if tied else "target.gguf"))[0]


def _settings(model: Path, argv: list[str], devices: tuple[Device, ...] = ()) -> LlamaSettings:
    return resolve_on(model_context(str(model)), parse_llama_flags(argv), devices, REPACK)


def _qv(layers: range) -> list[tuple[str, tuple[int, int]]]:
    return [(f"blk.{i}.attn_{x}.weight", shape) for i in layers for x, shape in (("q", Q_SHAPE), ("v", V_SHAPE))]


def _adapter(tmp: Path, tensors: list[LoraTensor], name: str = "a.gguf", arch: str = "llama", **kw) -> Path:
    return write_lora(tmp / name, arch, tensors, **kw)


def test_host_adapter_bytes_and_repack_fallback(tmp_path):
    model = _target(tmp_path)
    lora = _adapter(tmp_path, lora_layout(_qv(range(2)), rank=8))
    est, = estimate_loras(_settings(model, ["-ngl", "0", "--lora", str(lora)]))
    # F16, rank 8: attn_q A [64, 8] 1024 + B [8, 64] 1024; attn_v A [64, 8] 1024 + B [8, 32] 512;
    # all multiples of the CPU's 32-byte alignment. attn_q is repacked (CPU_REPACK): its pair goes to
    # the plain CPU buffer type, on the Host row as well.
    assert [(d.name, d.model_bytes, d.context_bytes, d.compute_bytes) for d in est.devices] == \
        [(HOST, 2 * (2048 + 1536), 0, 0)]
    assert est.kind == "lora" and est.path == str(lora)
    assert UNCOUNTED_NOTE in est.notes
    assert any("CPU_REPACK" in n and n.startswith("2 patched") for n in est.notes)


def test_layer_split_rows_and_alignment_padding(tmp_path):
    model = _target(tmp_path)
    lora = _adapter(tmp_path, lora_layout(_qv(range(2)), rank=3))
    devices = (Device("RPC0", Backend.RPC, 256, 0, False, "127.0.0.1:1"),
               Device("RPC1", Backend.RPC, 32, 0, False, "127.0.0.1:2"))
    # -ngl 99 -ts 1,3: layer il of 3 (2 + the output) goes to the first device whose cumulative share
    # (0.25, 1) is above il / 3: layer 0 on RPC0, layer 1 and the output on RPC1
    est, = estimate_loras(_settings(model, ["-ngl", "99", "-ts", "1,3", "--lora", str(lora)], devices))
    # rank 3, F16: A [64, 3] 384, B [3, 64] 384 (attn_q), B [3, 32] 192 (attn_v).
    # RPC0 pads each to 256: 512 + 512 + 512 + 256; RPC1 to 32: 384 + 384 + 384 + 192.
    assert [(d.name, d.model_bytes) for d in est.devices] == [("RPC0", 1792), ("RPC1", 1344)]
    assert not any("CPU_REPACK" in n for n in est.notes)


def test_cuda_row_padding_of_a_quantized_adapter(tmp_path):
    model = _target(tmp_path)
    lora = _adapter(tmp_path, lora_layout([("blk.0.attn_q.weight", Q_SHAPE)], rank=32, qtype=Q.Q8_0))
    cuda = (Device("CUDA0", Backend.CUDA, 128, 0, True),)
    est, = estimate_loras(_settings(model, ["-ngl", "99", "--lora", str(lora)], cuda))
    # Q8_0 (32 values in 34 bytes). A [64, 32]: 32 rows x 68 = 2176, plus ggml-cuda's get_alloc_size
    # padding of one row to 512 values: row_size(448) = 14 x 34 = 476 -> 2652, aligned to 128: 2688.
    # B [32, 64]: 64 rows x 34 = 2176, plus row_size(480) = 15 x 34 = 510 -> 2686 -> 2688.
    assert [(d.name, d.model_bytes) for d in est.devices] == [("CUDA0", 2688 + 2688)]


def test_token_embd_pair_is_transposed_and_norms_are_skipped(tmp_path):
    model = _target(tmp_path)
    tensors = [*lora_layout([("token_embd.weight", (64, 256))], rank=4),
               LoraTensor("blk.0.attn_norm.weight", (64,), Q.F32)]
    lora = _adapter(tmp_path, tensors)
    est, = estimate_loras(_settings(model, ["-ngl", "0", "--lora", str(lora)]))
    # token_embd [64, 256]: A [4, 256] 2048, B [4, 64] 512 (F16); the norm is never allocated
    assert [(d.name, d.model_bytes) for d in est.devices] == [(HOST, 2048 + 512)]


def test_two_adapters_in_order_and_scale_zero(tmp_path):
    model = _target(tmp_path)
    first = _adapter(tmp_path, lora_layout(_qv(range(1)), rank=8), "first.gguf")
    second = _adapter(tmp_path, lora_layout(_qv(range(1, 2)), rank=8), "second.gguf")
    ests = estimate_loras(_settings(model, ["-ngl", "0", "--lora", str(first), "--lora-scaled", f"{second}:0"]))
    assert [e.path for e in ests] == [str(first), str(second)]
    assert [e.devices[0].model_bytes for e in ests] == [2048 + 1536, 2048 + 1536]
    assert any("scale 0" in n for n in ests[1].notes) and not any("scale 0" in n for n in ests[0].notes)


def _refused(tmp_path: Path, tensors: list[LoraTensor], match: str, tied: bool = False, **kw) -> None:
    model = _target(tmp_path, tied)
    lora = _adapter(tmp_path, tensors, **kw)
    with pytest.raises(GGUFError, match=match):
        estimate_lora(_settings(model, ["-ngl", "0"]), LoraArg(str(lora)))


Q0 = [("blk.0.attn_q.weight", Q_SHAPE)]


@pytest.mark.parametrize("kw, match", [
    ({"arch": "qwen2"}, "model arch and LoRA arch mismatch"),
    ({"general_type": "model"}, "general.type to be 'adapter'"),
    ({"adapter_type": "control_vector"}, "adapter.type to be 'lora'"),
    ({"invocation_tokens": "1,2"}, "invocation_tokens"),
])
def test_header_refusals(tmp_path, kw, match):
    _refused(tmp_path, lora_layout(Q0, rank=4), match, **kw)


def test_tensor_refusals(tmp_path):
    a, b = lora_layout(Q0, rank=4)
    _refused(tmp_path, [a, b, LoraTensor("blk.0.attn_q.weight.lora_c", (4,), Q.F32)], "unexpected suffix")
    _refused(tmp_path, [a], "missing one component")
    _refused(tmp_path, lora_layout([("blk.7.attn_q.weight", Q_SHAPE)], rank=4), "does not exist in base model")
    _refused(tmp_path, lora_layout([("blk.0.attn_q.weight", (128, 64))], rank=4), "incorrect shape")
    _refused(tmp_path, [a, LoraTensor(b.name, (5, 64), Q.F16)], "not transposed")


def test_tied_embeddings_refusals(tmp_path):
    # a tied model has no output.weight of its own (its output matrix is named token_embd.weight)
    _refused(tmp_path, lora_layout([("output.weight", (64, 256))], rank=4), "does not exist in base model", tied=True)
    _refused(tmp_path, lora_layout([("token_embd.weight", (64, 256))], rank=4), "tied embeddings", tied=True)


def test_tied_embeddings_pair_held_back_is_a_note(tmp_path):
    model = _target(tmp_path, tied=True)
    lora = _adapter(tmp_path, lora_layout([("token_embd.weight", (64, 256))], rank=4))
    for argv in (["--lora-init-without-apply", "--lora", str(lora)], ["--lora-scaled", f"{lora}:0"]):
        est, = estimate_loras(_settings(model, ["-ngl", "0", *argv]))
        # A [4, 256] 2048 + B [4, 64] 512 (F16) on the host: loaded, it aborts only once applied
        assert [(d.name, d.model_bytes) for d in est.devices] == [(HOST, 2048 + 512)]
        assert any("tied embeddings" in n and "once the adapter is applied" in n for n in est.notes)


def test_alora_tokens_are_accepted(tmp_path):
    model = _target(tmp_path)
    lora = _adapter(tmp_path, lora_layout(Q0, rank=4), invocation_tokens=[1, 2, 3])
    est = estimate_lora(_settings(model, ["-ngl", "0"]), LoraArg(str(lora)))
    assert est.devices[0].model_bytes == 64 * 4 * 2 + 4 * 64 * 2
