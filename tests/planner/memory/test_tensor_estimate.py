"""`fitplan estimate -- -sm tensor`: the one Meta() row llama.cpp's dry run lists (planner/llama/tensor_parallel.py,
planner/llama/kv.py), figures worked out by hand from ggml-backend-meta.cpp's sizes: a dry run sizes weights, KV
and compute with the meta buffer type's alloc size (the largest member's of the full tensor), while recurrent
states are really allocated, each member's slices in its own buffer, the meta buffer as large as the largest.
"""
from __future__ import annotations

import pytest

from planner.core.errors import FlagError
from planner.gguf.reader import read_model
from planner.llama.context import model_context
from planner.llama.tensor_parallel import state_slices
from planner.memory.estimate import estimate
from planner.synth.gguf_factory import Q, gemma3_spec, llama_spec
from planner.synth.qwen3next_factory import qwen3next_spec

RPC2 = ["-sm", "tensor", "--rpc", "127.0.0.1:1,127.0.0.1:2"]


def _context(spec, tmp_path, name="m.gguf"):
    [path] = spec.write(tmp_path / name)
    return model_context(read_model(path))


def test_dense_meta_row_is_the_single_device_figure(tmp_path):
    """A dry run sizes weights, KV and compute with the meta buffer type's alloc size, the largest
    member's of the full tensor: over equal members, exactly one member holding everything."""
    ctx = _context(llama_spec(), tmp_path)
    one = estimate(ctx, ["--rpc", "127.0.0.1:1", "-c", "1024"])
    meta = estimate(ctx, [*RPC2, "-c", "1024"])
    assert [d.name for d in meta.devices] == ["Meta()", "Host"]
    assert [(d.model_bytes, d.context_bytes, d.compute_bytes) for d in meta.devices] == \
        [(d.model_bytes, d.context_bytes, d.compute_bytes) for d in one.devices]
    assert not meta.pipeline_parallel


def test_qwen3next_states_cut_by_heads(tmp_path):
    """d_state 32, 2 key / 4 value heads, conv 4, Q8_0 ssm_out: granularity lcm(lcm(32, 128), 32) = 128,
    r cut in multiples of 3 x 128 = 384, s in 32 x 128 = 4096. r is (64 x 3 elements) x 2 + 128 x 3 and
    s 32 x 128 = 4096: over 2 members every boundary rounds to 0, so one member holds a layer whole,
    and the rotation (earlier recurrent layers mod 2) alternates which."""
    ctx = _context(qwen3next_spec(), tmp_path)
    ss = [state_slices(ctx.model, ctx.facts, il, 2) for il in range(3)]
    assert [(s.r, s.s) for s in ss if s] == [((0, 768), (0, 4096)), ((768, 0), (4096, 0)), ((0, 768), (0, 4096))]
    one = estimate(ctx, ["--rpc", "127.0.0.1:1", "-c", "1024"])
    meta = estimate(ctx, [*RPC2, "-c", "1024"])
    # three recurrent layers (0, 1, 2); the meta buffer is its larger member's: layers 0 and 2
    layer_states = 768 * 4 + 4096 * 4
    assert one.devices[0].context_bytes - meta.devices[0].context_bytes == layer_states


def test_members_hold_their_slices(tmp_path):
    """llama_spec's 256-wide, 8-head / 2-KV model in f16 over 2 members. KV: head 32, n_embd_k_gqa 64; the
    granularity of a KV tensor is lcm(4 x 32, 64) / 4 = 32 values (whole KV heads), so each member holds one
    head of K and one of V per layer: 2 layers x 2 x 32 x 1024 cells x 2 bytes. Weights: every split tensor's
    pieces add up to it, and the mirrored norms (attn_norm, ffn_norm per layer, output_norm: 256 f32 = 1 KiB
    each) are held whole by both members; compute: each member allocates the whole meta buffer."""
    f16 = llama_spec(attn_type=Q.F16, v_type=Q.F16, ffn_type=Q.F16, down_type=Q.F16, embd_type=Q.F16,
                     out_type=Q.F16)
    est = estimate(_context(f16, tmp_path), [*RPC2, "-c", "1024"])
    meta, members = est.devices[0], est.meta_members
    assert [m.name for m in members] == ["RPC0", "RPC1"]
    assert [m.context_bytes for m in members] == [2 * 2 * 32 * 1024 * 2] * 2
    assert sum(m.model_bytes for m in members) == meta.model_bytes + 5 * 1024
    assert [m.compute_bytes for m in members] == [meta.compute_bytes] * 2
    assert est.to_dict()["meta_members"][0]["name"] == "RPC0"


def test_a_graph_the_meta_backend_cannot_split_is_refused(tmp_path):
    """Gemma 3 with one KV head over 2 members: llama_meta_device_get_split_state gives that head to one
    member (K split along dim 0 as (0, 64)); with one token a ubatch's Kcur [64] reshapes to [64, 1, 1]
    and stays split along dim 0 into the per-row K norm, which handle_per_row refuses
    (ggml-backend-meta.cpp:543; llama-bench -sm tensor aborts so, tests/peer/test_tensor_split_peer.py).
    With four KV heads the split lands on the heads' dim and the model runs."""
    one_kv = _context(gemma3_spec(n_embd=256, n_head=4, n_head_kv=1, head_dim=64, n_ff=512), tmp_path, "g1.gguf")
    with pytest.raises(FlagError, match=r"ggml-backend-meta.cpp:543: GGML_ASSERT.*RMS_NORM"):
        estimate(one_kv, [*RPC2, "-c", "1024"])
    four_kv = _context(gemma3_spec(n_embd=256, n_head=8, n_head_kv=4, head_dim=64, n_ff=512), tmp_path, "g4.gguf")
    assert estimate(four_kv, [*RPC2, "-c", "1024"]).devices[0].name == "Meta()"
