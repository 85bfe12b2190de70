"""Hostile and malformed GGUF headers (issue #22): each is refused with one GGUFError that names the file,
the key or tensor, and where it is — as the pinned llama.cpp refuses it (ggml/src/gguf.cpp,
src/llama-model-loader.cpp, src/llama-model.cpp) — never coerced, planned, or echoed at length.

The files are a small valid llama model written by gguf-py (gguf_factory), re-written field by field
(gguf_fields) with one lie each.
"""
from __future__ import annotations

import os
import signal
import struct

import pytest
from gguf import GGUFValueType as VT
from gguf import Keys

from planner.core.errors import GGUFError
from planner.gguf.reader import read_model
from planner.gguf.source import FileSource
from planner.model import arch
from planner.model.arch import AttnKind, model_facts
from planner.synth.gguf_factory import ModelSpec, Q, T, Typed, llama_spec, qwen3moe_spec
from planner.synth.gguf_fields import Gguf, enc_value, load
from planner.synth.qwen3next_factory import qwen3next_spec

MAX_MESSAGE = 300   # one line that quotes a bounded prefix of what it refuses


def _base(tmp_path) -> Gguf:
    [path] = llama_spec(n_layer=2).write(tmp_path / "base.gguf")
    return load(path)


def _refused(path, *words: str) -> GGUFError:
    with pytest.raises(GGUFError) as info:
        model_facts(read_model(path))
    message = str(info.value)
    assert "\n" not in message and len(message) < MAX_MESSAGE, message
    for w in words:
        assert w in message, message
    return info.value


@pytest.mark.parametrize("vtype, value", [
    (VT.STRING, "12"),      # llama.cpp does not read '12' as 12
    (VT.BOOL, True),        # nor true as 1
    (VT.FLOAT32, 2.5),      # nor 2.5 as 2
    (VT.FLOAT32, float("nan")),
    (VT.UINT64, 1 << 40),   # a u32 key stored as u64: GKV<uint32_t> wants GGUF_TYPE_UINT32 exactly
    (VT.INT32, 12),
])
def test_a_key_of_the_wrong_type_is_refused_naming_key_and_offset(tmp_path, vtype, value):
    g = _base(tmp_path)
    g.set("llama.block_count", vtype, value)
    err = _refused(g.write(tmp_path / "m.gguf"), "llama.block_count", vtype.name, "UINT32", "byte")
    assert err.offset is not None
    entry = g.kv("llama.block_count")
    assert entry is not None
    # the entry starts with its key's length: 8 bytes, then the key itself
    data = (tmp_path / "m.gguf").read_bytes()
    assert data[err.offset + 8:err.offset + 8 + len(entry.key)] == entry.key


def test_an_array_where_llama_cpp_reads_a_scalar_is_refused(tmp_path):
    g = _base(tmp_path)
    g.set("llama.attention.sliding_window", VT.ARRAY, [1, 2, 3], VT.UINT32)
    _refused(g.write(tmp_path / "m.gguf"), "llama.attention.sliding_window", "an array of UINT32")


def test_a_per_layer_array_must_have_one_entry_per_layer(tmp_path):
    g = _base(tmp_path)
    g.set("llama.attention.head_count_kv", VT.ARRAY, [2, 2, 2], VT.UINT32)
    _refused(g.write(tmp_path / "m.gguf"), "llama.attention.head_count_kv", "3 entries, expected 2")


@pytest.mark.parametrize("value, words", [
    (0, ("llama.block_count is 0",)),
    (600, ("llama.block_count is 600", "1 to 512")),     # LLAMA_MAX_LAYERS
])
def test_block_count_outside_what_llama_cpp_asserts(tmp_path, value, words):
    g = _base(tmp_path)
    g.set("llama.block_count", VT.UINT32, value)
    _refused(g.write(tmp_path / "m.gguf"), *words)


@pytest.mark.parametrize("n_expert, n_used", [(4, 8), (0, 2), (4, 0)])
def test_experts_used_outside_what_llama_cpp_asserts(tmp_path, n_expert, n_used):
    """load_hparams: GGML_ASSERT(n_expert_used_max <= n_expert), > 0 with experts, 0 without."""
    g = _base(tmp_path)
    g.set("llama.expert_count", VT.UINT32, n_expert)
    g.set("llama.expert_used_count", VT.UINT32, n_used)
    _refused(g.write(tmp_path / "m.gguf"), f"llama.expert_used_count is {n_used}", f"llama.expert_count {n_expert}")


@pytest.mark.parametrize("vtype, value, words", [
    (VT.UINT32, 0, ("general.alignment 0 is not a power of two",)),
    (VT.STRING, "32", ("general.alignment", "STRING", "UINT32")),
])
def test_alignment_lies(tmp_path, vtype, value, words):
    g = _base(tmp_path)
    g.set("general.alignment", vtype, value)
    _refused(g.write(tmp_path / "m.gguf"), *words)


def test_a_key_listed_twice(tmp_path):
    g = _base(tmp_path)
    g.kvs.append(g.kvs[1])
    _refused(g.write(tmp_path / "m.gguf"), "listed twice", "first at byte")


def test_a_tensor_listed_twice(tmp_path):
    g = _base(tmp_path)
    g.tis.append(g.tis[0])
    _refused(g.write(tmp_path / "m.gguf"), "token_embd.weight", "listed twice")


@pytest.mark.parametrize("lie", ["misaligned", "overlapping", "swapped"])
def test_tensor_data_out_of_order_is_refused(tmp_path, lie):
    g = _base(tmp_path)
    if lie == "misaligned":
        g.tis[2].offset += 1
    elif lie == "overlapping":
        g.tis[2].offset = g.tis[1].offset
    else:
        g.tis[1].offset, g.tis[2].offset = g.tis[2].offset, g.tis[1].offset
    _refused(g.write(tmp_path / "m.gguf"), "data offset", "expected")


def test_no_tensors(tmp_path):
    g = _base(tmp_path)
    g.tis = []
    g.data_bytes = 0
    _refused(g.write(tmp_path / "m.gguf"), "lists no tensors")


def test_a_tensor_name_past_ggml_max_name(tmp_path):
    g = _base(tmp_path)
    g.tis[0].name = b"x" * 64     # GGML_MAX_NAME: 63 bytes at most
    _refused(g.write(tmp_path / "m.gguf"), "name of tensor 0 is 64 bytes long")


def test_a_shape_past_int64(tmp_path):
    g = _base(tmp_path)
    g.tis[0].dims = [256, 1 << 62, 4]
    _refused(g.write(tmp_path / "m.gguf"), "more elements than int64 holds")


def test_a_long_key_is_quoted_as_a_prefix(tmp_path):
    g = _base(tmp_path)
    key = "llama." + "k" * 100_000
    g.set(key, VT.STRING, "x")
    g.kvs.append(g.kvs[-1])
    err = _refused(g.write(tmp_path / "m.gguf"), "listed twice", "100006 characters")
    assert str(err).count("k") < 100


def _split(tmp_path):
    return llama_spec(n_layer=2).write(tmp_path / "sp.gguf", shards=2)


def test_a_shard_that_is_a_copy_of_the_first(tmp_path):
    first, second = _split(tmp_path)
    second.write_bytes(first.read_bytes())
    _refused(first, "shard 2 of 2 says split.no 0, expected 1")


def test_split_count_as_a_string(tmp_path):
    first, _ = _split(tmp_path)
    g = load(first)
    g.set(Keys.Split.LLM_KV_SPLIT_COUNT, VT.STRING, "2")
    _refused(g.write(first), "split.count", "STRING", "UINT16")


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)

    def hung(*_):
        raise TimeoutError("open() waited for a writer")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(5)
    try:
        with pytest.raises(GGUFError, match="not a regular file"):
            FileSource(str(fifo))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_valid_typed_keys_still_read(tmp_path):
    """Per-layer arrays of INT32 (get_arr accepts UINT32 and INT32) and a bool SWA pattern array."""
    spec = llama_spec(n_layer=2)
    spec.metadata[Keys.Attention.HEAD_COUNT_KV] = Typed([2, 2], VT.ARRAY, VT.INT32)
    [path] = spec.write(tmp_path / "m.gguf")
    facts = model_facts(read_model(path))
    assert [lf.n_head_kv for lf in facts.layers] == [2, 2]


def test_the_walker_re_encodes_gguf_py_byte_for_byte(tmp_path):
    spec = ModelSpec("llama", {Keys.LLM.BLOCK_COUNT: 1, Keys.LLM.EMBEDDING_LENGTH: 64})
    spec.add(T.OUTPUT_NORM, Q.F32, (64,))
    [path] = spec.write(tmp_path / "m.gguf")
    g = load(path)
    assert g.encode() == path.read_bytes()[:len(g.encode())]
    assert enc_value(VT.UINT32, 7) == struct.pack("<I", 7)


def test_embedding_length_that_disagrees_with_token_embd(tmp_path):
    """create_tensor(TOKEN_EMBD, {n_embd, n_vocab}): llama.cpp refuses a token_embd of another width; a
    u32 of 2^32 - 1 would otherwise size every activation."""
    g = _base(tmp_path)
    g.set("llama.embedding_length", VT.UINT32, (1 << 32) - 1)
    _refused(g.write(tmp_path / "m.gguf"), "llama.embedding_length is 4294967295", "token_embd.weight is 256 wide")


@pytest.mark.parametrize("key, value, words", [
    ("llama.block_count", 600, "llama.block_count is 600"),
    ("llama.embedding_length", (1 << 32) - 1, "token_embd.weight is 256 wide"),
    ("llama.expert_used_count", 2, "llama.expert_used_count is 2"),
])
def test_the_header_is_checked_in_one_pass_before_anything_is_derived(tmp_path, monkeypatch, key, value, words):
    """model_facts refuses a hostile value in its checking pass (_checked_header), before the derivation of the
    layers starts: with the derivation made to fail, the hostile header still gets its one-line refusal and the
    derivation is never reached; the sound header reaches it."""
    reached = []

    def derivation(*args):
        reached.append(args)
        raise RuntimeError("the derivation ran")

    monkeypatch.setattr(arch, "_heads", derivation)
    g = _base(tmp_path)
    g.set(key, VT.UINT32, value)
    _refused(g.write(tmp_path / "m.gguf"), words)
    assert reached == []
    with pytest.raises(RuntimeError, match="the derivation ran"):
        model_facts(read_model(tmp_path / "base.gguf"))
    assert len(reached) == 1


def test_a_long_architecture_name_is_not_echoed(tmp_path):
    g = _base(tmp_path)
    g.set("general.architecture", VT.STRING, "9" * 5000)
    err = _refused(g.write(tmp_path / "m.gguf"), "missing required key")
    assert str(err).count("9") < 100


def test_tensors_of_blocks_past_block_count(tmp_path):
    """llama.cpp creates blocks 0..block_count-1 and refuses a file with tensors it did not create."""
    g = _base(tmp_path)
    g.set("llama.block_count", VT.UINT32, 1)
    _refused(g.write(tmp_path / "m.gguf"), "is in block 1", "llama.block_count is 1")


def test_expert_count_that_disagrees_with_the_stacked_experts(tmp_path):
    """create_tensor(FFN_*_EXPS, {.., .., n_expert}): qwen3moe's 8 stacked experts with expert_count 7."""
    [path] = qwen3moe_spec().write(tmp_path / "base.gguf")
    g = load(path)
    g.set("qwen3moe.expert_count", VT.UINT32, 7)
    _refused(g.write(tmp_path / "m.gguf"), "stacks 8 experts", "qwen3moe.expert_count is 7")


def test_control_bytes_in_a_name_are_quoted_within_the_bound(tmp_path):
    g = _base(tmp_path)
    g.tis[0].name = b"blk.0.x" + b"\x01" * 50
    g.tis[0].dims = [1] * 7      # refused for its dimension count, quoting the name
    err = _refused(g.write(tmp_path / "m.gguf"), "has 7 dimensions", "(57 characters)")
    assert str(err).count("\\x01") < 20


def test_a_block_without_tensors(tmp_path):
    """block_count 3 on a 2-block file: llama.cpp misses block 2's tensors and refuses the file."""
    g = _base(tmp_path)
    g.set("llama.block_count", VT.UINT32, 3)
    _refused(g.write(tmp_path / "m.gguf"), "block 2 has no tensors")


def test_vocab_size_that_disagrees_with_token_embd(tmp_path):
    g = _base(tmp_path)
    g.set("llama.vocab_size", VT.UINT32, 1 << 31)
    _refused(g.write(tmp_path / "m.gguf"), "2147483648 tokens", "token_embd.weight has 1000 rows")


def test_head_count_kv_that_disagrees_with_the_k_projection(tmp_path):
    """llama_spec: n_embd 256, 8 heads of 32, 2 KV heads -> attn_k is 64 wide; 3 KV heads would make it 96."""
    g = _base(tmp_path)
    g.set("llama.attention.head_count_kv", VT.UINT32, 3)
    _refused(g.write(tmp_path / "m.gguf"), "blk.0.attn_k.weight is 64 wide", "3 x 32 = 96")


def _qwen3moe(tmp_path) -> Gguf:
    [path] = qwen3moe_spec().write(tmp_path / "base.gguf")
    return load(path)


@pytest.mark.parametrize("vtype, value, sub, words", [
    (VT.STRING, "128", None, ("STRING", "UINT32")),
    (VT.BOOL, True, None, ("BOOL", "UINT32")),
    (VT.FLOAT32, 128.0, None, ("FLOAT32", "UINT32")),
    (VT.FLOAT32, float("nan"), None, ("FLOAT32", "UINT32")),
    (VT.UINT64, 128, None, ("UINT64", "UINT32")),
    (VT.ARRAY, [1.5, 2.5], VT.FLOAT32, ("an array of FLOAT32",)),
    (VT.ARRAY, ["a", "b"], VT.STRING, ("an array of STRING",)),
    (VT.ARRAY, [128, 128, 128], VT.UINT32, ("3 entries, expected 2",)),
    (VT.ARRAY, [], VT.UINT32, ("0 entries, expected 2",)),
    (VT.ARRAY, [0] * 600, VT.UINT32, ("600 entries, expected 2",)),
])
def test_a_key_fitplan_does_not_read_is_typed_as_llama_cpp_reads_it(tmp_path, vtype, value, sub, words):
    """qwen3moe.cpp: get_key_or_arr(LLM_KV_EXPERT_FEED_FORWARD_LENGTH, n_ff_exp_arr, n_layer_all): a UINT32, or
    an array of BOOL/UINT32/INT32 with one entry per block; llama.cpp refuses the file otherwise, though
    fitplan itself sizes the experts from their tensors."""
    g = _qwen3moe(tmp_path)
    g.set("qwen3moe.expert_feed_forward_length", vtype, value, sub)
    _refused(g.write(tmp_path / "m.gguf"), "qwen3moe.expert_feed_forward_length", *words)


@pytest.mark.parametrize("key", ["qwen3moe.expert_shared_feed_forward_length", "qwen3moe.attention.q_lora_rank",
                                 "qwen3moe.ssm.inner_size", "qwen3moe.pooling_type", "qwen3moe.hrm.h_cycles"])
def test_every_u32_hyperparameter_llama_cpp_reads_is_typed(tmp_path, key):
    g = _qwen3moe(tmp_path)
    g.set(key, VT.INT32, 4)
    _refused(g.write(tmp_path / "m.gguf"), key, "INT32", "UINT32")


@pytest.mark.parametrize("key, vtype, value, sub", [
    ("qwen3moe.expert_feed_forward_length", VT.ARRAY, [128, 128], VT.INT32),
    ("qwen3moe.attention.head_count", VT.ARRAY, [8, 8], VT.UINT32),
    ("qwen3moe.attention.sliding_window_pattern", VT.ARRAY, [0, 0], VT.UINT32),
])
def test_what_llama_cpp_accepts_for_an_integer_key_still_reads(tmp_path, key, vtype, value, sub):
    g = _qwen3moe(tmp_path)
    g.set(key, vtype, value, sub)
    facts = model_facts(read_model(g.write(tmp_path / "m.gguf")))
    assert facts.n_expert == 8 and [lf.n_head for lf in facts.layers] == [8, 8]


@pytest.mark.parametrize("vtype, value, sub, recurrent", [
    (VT.UINT32, 0, None, [False] * 4),                                   # a scalar: every block's flag
    (VT.ARRAY, [True, False, True, False], VT.BOOL, [True, False, True, False]),
    (VT.ARRAY, [0, 1, 1, 0], VT.UINT32, [False, True, True, False]),     # std::array get_arr takes BOOL/U32/I32
])
def test_recurrent_layers_as_llama_cpp_reads_them(tmp_path, vtype, value, sub, recurrent):
    """qwen3next.cpp: get_key_or_arr(LLM_KV_ATTENTION_RECURRENT_LAYERS, is_recr_impl, n_layer_all); without the
    key every 4th block attends (full_attention_interval)."""
    [path] = qwen3next_spec(n_layer=4).write(tmp_path / "base.gguf")
    assert [lf.kind for lf in model_facts(read_model(path)).layers].count(AttnKind.RECURRENT) == 3
    g = load(path)
    g.set("qwen3next.attention.recurrent_layers", vtype, value, sub)
    facts = model_facts(read_model(g.write(tmp_path / "m.gguf")))
    assert [lf.kind is AttnKind.RECURRENT for lf in facts.layers] == recurrent



def test_a_dimension_of_2_to_the_40_is_refused_though_the_data_layout_holds(tmp_path):
    """The last tensor's dimension lies (so no later offset betrays it) and its data would end 4 TiB past a
    small file, which a header-only file may: the shape alone is refused, as no llama.cpp tensor is 2^32 wide.
    (The pinned llama-fit-params answers "failed to load model"; tests/peer/test_hostile_peer.py.)"""
    spec = llama_spec(n_layer=2)
    last = "blk.1.ffn_norm.weight"
    spec.tensors = [t for t in spec.tensors if t[0] != last] + [t for t in spec.tensors if t[0] == last]
    [path] = spec.write(tmp_path / "base.gguf")
    g = load(path)
    g.tis[-1].dims = [1 << 40]
    _refused(g.write(tmp_path / "m.gguf"), "blk.1.ffn_norm.weight", "[1099511627776]", "2^32")
