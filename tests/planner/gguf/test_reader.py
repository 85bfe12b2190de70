"""The GGUF header reader: tensor index, metadata, split models, and refusal of bad or hostile files.

Expected sizes are worked out by hand from ggml's block tables (gguf-py GGML_QUANT_SIZES, which
mirror ggml.c's type_traits): Q4_K = 256 values in 144 bytes, Q6_K = 256 in 210, Q8_0 = 32 in 34,
Q5_0 = 32 in 22, F16 = 2 bytes, F32 = 4 bytes; a tensor is rows x (ne0 / block x block bytes).
"""
from __future__ import annotations

import os
import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from planner.core.errors import GGUFError
from planner.gguf.reader import SkippedArray, read_model
from planner.synth.gguf_factory import T, Typed, llama_spec, tname, write_model


def _write_real(path: Path) -> None:
    """A small file with real bytes, written the ordinary way (GGUFWriter.add_tensor)."""
    w = GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_embedding_length(256)
    w.add_head_count(4)
    w.add_file_type(15)
    w.add_string("general.name", "tiny")
    w.add_float32("llama.rope.freq_base", 500000.0)
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    w.add_array("llama.some_small_array", [1, 2, 3])
    w.add_tensor("token_embd.weight", np.zeros((10, 256), dtype=np.float16))          # F16, numpy order
    w.add_tensor("output_norm.weight", np.zeros(256, dtype=np.float32))                # F32
    # quantized data as raw bytes: numpy shape (rows, bytes per row); the writer turns it into ggml's
    w.add_tensor("blk.0.attn_q.weight", np.zeros((256, 144), dtype=np.uint8), raw_dtype=Q.Q4_K)
    w.add_tensor("blk.0.attn_v.weight", np.zeros((64, 8 * 34), dtype=np.uint8), raw_dtype=Q.Q8_0)
    w.add_tensor("blk.0.ffn_down.weight", np.zeros((3, 256, 2 * 210), dtype=np.uint8), raw_dtype=Q.Q6_K)
    w.add_tensor("blk.0.attn_k.weight", np.zeros((64, 256 // 32 * 22), dtype=np.uint8), raw_dtype=Q.Q5_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_tensor_index_of_a_real_file(tmp_path):
    path = tmp_path / "real.gguf"
    _write_real(path)
    m = read_model(path)
    by_name = {t.name: t for t in m.tensors}
    expected = {  # name: (type, ggml shape, bytes by hand)
        "token_embd.weight": (Q.F16, (256, 10), 256 * 10 * 2),
        "output_norm.weight": (Q.F32, (256,), 256 * 4),
        "blk.0.attn_q.weight": (Q.Q4_K, (256, 256), 256 * (256 // 256 * 144)),
        "blk.0.attn_v.weight": (Q.Q8_0, (256, 64), 64 * (256 // 32 * 34)),
        "blk.0.ffn_down.weight": (Q.Q6_K, (512, 256, 3), 3 * 256 * (512 // 256 * 210)),
        "blk.0.attn_k.weight": (Q.Q5_0, (256, 64), 64 * (256 // 32 * 22)),
    }
    assert set(by_name) == set(expected)
    for name, (qtype, shape, n_bytes) in expected.items():
        t = by_name[name]
        assert (t.ggml_type, t.shape, t.n_bytes) == (qtype, shape, n_bytes), name
    assert m.n_params == 2560 + 256 + 65536 + 16384 + 393216 + 16384
    assert m.total_tensor_bytes == sum(v[2] for v in expected.values())
    # gguf-py's own (slow, independent) reader agrees on every size
    assert {t.name: int(t.n_bytes) for t in GGUFReader(path).tensors} == {k: v[2] for k, v in expected.items()}


def test_metadata_values_of_a_real_file(tmp_path):
    path = tmp_path / "real.gguf"
    _write_real(path)
    m = read_model(path)
    assert (m.version, m.architecture, m.file_type) == (3, "llama", 15)
    assert m.metadata["llama.block_count"] == 1
    assert m.metadata["general.name"] == "tiny"
    assert m.metadata["llama.rope.freq_base"] == pytest.approx(500000.0)
    assert m.metadata["tokenizer.ggml.add_bos_token"] is True
    assert m.metadata["llama.some_small_array"] == (1, 2, 3)
    assert m.tensor("blk.0.attn_q.weight").shape == (256, 256)
    assert m.tensor("no.such.tensor") is None


def test_long_arrays_are_skipped_and_what_follows_is_still_read(tmp_path):
    tokens = [f"token-{i}" for i in range(5000)]
    meta = {
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": Typed([0.5] * 6000, GGUFValueType.ARRAY, GGUFValueType.FLOAT32),
        "{arch}.block_count": 2,  # after the arrays: the skip arithmetic must land exactly here
        "general.name": "after the arrays",
    }
    [path] = write_model(tmp_path / "m.gguf", "llama", meta, [("output_norm.weight", Q.F32, (64,))])
    m = read_model(path)
    assert isinstance(m.metadata["tokenizer.ggml.tokens"], SkippedArray)
    assert len(m.metadata["tokenizer.ggml.tokens"]) == 5000
    assert m.metadata["tokenizer.ggml.tokens"].element_type == GGUFValueType.STRING
    assert len(m.metadata["tokenizer.ggml.scores"]) == 6000
    assert m.metadata["llama.block_count"] == 2
    assert m.metadata["general.name"] == "after the arrays"
    assert m.tensor("output_norm.weight").n_bytes == 256


def test_sparse_8b_class_file_reads_without_touching_data(tmp_path):
    # 32 layers of llama 3 8B at Q4_K/Q6_K: the data region is a hole, the header is real
    spec = llama_spec(n_layer=32, n_embd=4096, n_head=32, n_head_kv=8, n_ff=14336, n_vocab=128256)
    [path] = spec.write(tmp_path / "8b.gguf")
    st = os.stat(path)
    assert st.st_size > 4 * 2**30 and st.st_blocks * 512 < 64 * 2**20
    m = read_model(path)
    # ffn_down of one layer: 4096 rows of 14336 Q6_K values = 4096 * 56 * 210 bytes
    assert m.tensor(tname(T.FFN_DOWN, 31)).n_bytes == 4096 * (14336 // 256) * 210
    assert m.tensor(tname(T.ATTN_K, 0)).shape == (4096, 1024)
    assert len(m.tensors) == 3 + 32 * 9


def test_split_model_reads_every_shard(tmp_path):
    spec = llama_spec(n_layer=2)
    paths = spec.write(tmp_path / "model.gguf", shards=2)
    assert [p.name for p in paths] == ["model-00001-of-00002.gguf", "model-00002-of-00002.gguf"]
    for start in paths:  # either shard may be named on the command line
        m = read_model(start)
        assert m.path == str(paths[0])
        assert m.shard_paths == tuple(str(p) for p in paths)
        assert [t.name for t in m.tensors] == [t[0] for t in spec.tensors]
        assert {t.shard for t in m.tensors} == {0, 1}
        assert m.metadata["llama.block_count"] == 2  # metadata comes from the first shard
        assert m.metadata["split.count"] == 2
    # the second shard alone holds only the split keys and its tensors
    assert "llama.block_count" not in GGUFReader(paths[1]).fields


def test_missing_shard(tmp_path):
    paths = llama_spec().write(tmp_path / "model.gguf", shards=2)
    paths[1].unlink()
    with pytest.raises(GGUFError, match=r"missing shard 2 of 2"):
        read_model(paths[0])


def test_version_2_is_read_and_others_refused(tmp_path):
    [path] = llama_spec().write(tmp_path / "m.gguf")
    raw = bytearray(path.read_bytes())
    raw[4:8] = struct.pack("<I", 2)  # v2 has v3's layout (64-bit counts)
    path.write_bytes(raw)
    assert read_model(path).version == 2
    for version in (1, 4):
        raw[4:8] = struct.pack("<I", version)
        path.write_bytes(raw)
        with pytest.raises(GGUFError, match=f"unsupported GGUF version {version}"):
            read_model(path)


def test_custom_alignment_and_truncated_data(tmp_path):
    tensors = [("a.weight", Q.F32, (3,)), ("b.weight", Q.Q8_0, (32, 2))]
    [path] = write_model(tmp_path / "m.gguf", "llama", {}, tensors, alignment=64)
    m = read_model(path)
    assert [t.n_bytes for t in m.tensors] == [12, 68]
    assert m.has_weights
    # b starts at the 64-aligned offset 64 and needs 68 bytes: one byte less and it is cut off.
    # The header is whole, so the file still plans; it only has no weights to read.
    size = path.stat().st_size
    os.truncate(path, size - (64 + 64 - 68) - 1)
    cut = read_model(path)
    assert [t.n_bytes for t in cut.tensors] == [12, 68] and not cut.has_weights
    assert cut.header_sha256 == m.header_sha256


def test_alignment_must_be_a_power_of_two(tmp_path):
    [path] = write_model(tmp_path / "m.gguf", "llama", {"general.alignment": 48}, [("a.weight", Q.F32, (4,))])
    with pytest.raises(GGUFError, match="not a power of two"):
        read_model(path)


def test_row_length_must_fill_whole_blocks(tmp_path):
    [path] = write_model(tmp_path / "m.gguf", "llama", {}, [("a.weight", Q.Q4_K, (256, 1))])
    raw = bytearray(path.read_bytes())
    at = raw.index(b"a.weight") + len(b"a.weight") + 4  # after the name and n_dims: ne0
    raw[at:at + 8] = struct.pack("<Q", 100)
    path.write_bytes(raw)
    with pytest.raises(GGUFError, match=r"row length 100 is not a multiple of Q4_K's block size 256"):
        read_model(path)


# --- hand-made headers -------------------------------------------------------------------------

def _string(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


def _header(n_tensors: int, n_kv: int, version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv)


def _kv_string(k: bytes, v: bytes) -> bytes:
    return _string(k) + struct.pack("<I", GGUFValueType.STRING) + _string(v)


ARCH_KV = _kv_string(b"general.architecture", b"llama")


def _peak_alloc(fn) -> int:
    tracemalloc.start()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


@pytest.mark.parametrize("body, problem", [
    # a metadata key whose length claims 2^62 bytes
    (_header(0, 1) + struct.pack("<Q", 2**62) + b"x" * 64, "a metadata key claims 4611686018427387904 bytes"),
    # a string value claiming a terabyte
    (_header(0, 1) + _string(b"general.name") + struct.pack("<IQ", GGUFValueType.STRING, 2**40),
     "value of 'general.name' claims 1099511627776 bytes"),
    # a uint8 array of a billion elements in a file of a hundred bytes
    (_header(0, 1) + _string(b"tokenizer.ggml.token_type")
     + struct.pack("<IIQ", GGUFValueType.ARRAY, GGUFValueType.UINT8, 10**9) + b"\0" * 32,
     "array 'tokenizer.ggml.token_type' claims 1000000000 elements"),
    # a string array of 2^40 elements
    (_header(0, 1) + _string(b"tokenizer.ggml.tokens")
     + struct.pack("<IIQ", GGUFValueType.ARRAY, GGUFValueType.STRING, 2**40) + b"\0" * 32,
     "array 'tokenizer.ggml.tokens' claims 1099511627776 elements"),
    # a long string array whose 5000th element claims more bytes than remain
    (_header(0, 1) + _string(b"tokenizer.ggml.tokens")
     + struct.pack("<IIQ", GGUFValueType.ARRAY, GGUFValueType.STRING, 5000)
     + _string(b"t") * 4999 + struct.pack("<Q", 2**50) + b"\0" * 64,
     "an element of array 'tokenizer.ggml.tokens' claims 1125899906842624 bytes"),
    # 2^40 tensors announced in a 100-byte file
    (_header(2**40, 1) + ARCH_KV, "1099511627776 tensors cannot fit"),
    # 2^50 metadata entries
    (_header(0, 2**50) + ARCH_KV, "1125899906842624 metadata entries cannot fit"),
    # a tensor name claiming 2^60 bytes
    (_header(1, 1) + ARCH_KV + struct.pack("<Q", 2**60) + b"\0" * 64,
     "name of tensor 0 is 1152921504606846976 bytes long"),
    # a tensor with 7 dimensions
    (_header(1, 1) + ARCH_KV + _string(b"t") + struct.pack("<I", 7) + b"\0" * 64, "has 7 dimensions"),
])
def test_hostile_headers_are_refused_before_allocating(tmp_path, body, problem):
    path = tmp_path / "hostile.gguf"
    path.write_bytes(body)
    caught: list[GGUFError] = []

    def read() -> None:
        with pytest.raises(GGUFError) as info:
            read_model(path)
        caught.append(info.value)

    peak = _peak_alloc(read)
    assert problem in caught[0].problem
    assert caught[0].path == str(path)
    assert peak < 4 * 2**20  # nothing sized by the hostile length was allocated


@pytest.mark.parametrize("body, problem", [
    (b"", "not a GGUF file (it is empty)"),
    (b"PK\x03\x04 this is a zip", "not a GGUF file (bad magic)"),
    (b"GGU", "not a GGUF file (bad magic)"),
    (b"GGUF\x03\x00", "truncated header: version"),
    (_header(0, 1) + _string(b"general.architecture"), "truncated header: type of 'general.architecture'"),
    (_header(0, 1) + _string(b"k") + struct.pack("<I", 99), "unknown metadata value type 99 for key 'k'"),
    (_header(0, 1) + _string(b"k") + struct.pack("<IIQ", GGUFValueType.ARRAY, GGUFValueType.ARRAY, 1)
     + b"\0" * 16, "nested arrays"),
    (_header(0, 0), "missing required key general.architecture"),
    # tensor type 4 was Q4_2, removed from ggml; 99 was never a type
    (_header(1, 1) + ARCH_KV + _string(b"blk.0.attn_q.weight") + struct.pack("<IQQIQ", 2, 32, 1, 4, 0)
     + b"\0" * 64, "tensor 'blk.0.attn_q.weight' has unknown ggml type 4"),
    (_header(1, 1) + ARCH_KV + _string(b"x") + struct.pack("<IQIQ", 1, 32, 99, 0) + b"\0" * 64,
     "tensor 'x' has unknown ggml type 99"),
])
def test_bad_files(tmp_path, body, problem):
    path = tmp_path / "bad.gguf"
    path.write_bytes(body)
    with pytest.raises(GGUFError) as info:
        read_model(path)
    assert problem in info.value.problem
    assert str(path) in str(info.value)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(GGUFError, match="no such file"):
        read_model(tmp_path / "absent.gguf")
    with pytest.raises(GGUFError, match="not a regular file"):
        read_model(tmp_path)
