"""The safetensors header reader: sizes as stable-diffusion.cpp loads them; hostile headers refused."""
from __future__ import annotations

import json
import struct

import pytest

from planner.core.errors import BadInput
from planner.sd.safetensors_header import read_safetensors


def test_sizes_by_dtype(st_file):
    path = st_file("m.safetensors", {
        "a": ("F16", [3, 5]), "b": ("F32", [7]), "c": ("BF16", [2, 2]),
        # sd.cpp loads F8 as F16 and F64/I64 as 32-bit (safetensors_io.cpp)
        "d": ("F8_E4M3", [10]), "e": ("F64", [4]), "f": ("I64", [3]), "g": ("I8", [9]),
    })
    got = {t.name: t.n_bytes for t in read_safetensors(path)}
    assert got == {"a": 15 * 2, "b": 7 * 4, "c": 4 * 2, "d": 10 * 2, "e": 4 * 4, "f": 3 * 4, "g": 9}


def test_metadata_entry_is_not_a_tensor(tmp_path):
    raw = json.dumps({"__metadata__": {"format": "pt"},
                      "w": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}}).encode()
    path = tmp_path / "m.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 4)
    assert [t.name for t in read_safetensors(path)] == ["w"]


def _raw(tmp_path, header_len: int, body: bytes) -> str:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", header_len) + body)
    return str(path)


def test_header_length_larger_than_file_is_refused_in_one_line(tmp_path):
    path = _raw(tmp_path, 1 << 40, b"{}")
    with pytest.raises(BadInput) as e:
        read_safetensors(path)
    assert "larger than the file" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("body,problem", [
    (b"not json", "not valid JSON"),
    (b"[1, 2]", "not a JSON object"),
    (json.dumps({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}).encode(), "unsupported dtype"),
    (json.dumps({"w": {"dtype": "F16", "shape": [-1], "data_offsets": [0, 0]}}).encode(), "malformed"),
    (json.dumps({"w": {"dtype": "F16", "shape": [4], "data_offsets": [0]}}).encode(), "malformed"),
])
def test_malformed_headers(tmp_path, body, problem):
    path = _raw(tmp_path, len(body), body)
    with pytest.raises(BadInput, match=problem):
        read_safetensors(path)


def test_offsets_outside_the_data_are_refused(tmp_path):
    body = json.dumps({"w": {"dtype": "F16", "shape": [4], "data_offsets": [0, 8]}}).encode()
    path = _raw(tmp_path, len(body), body + b"\0" * 4)
    with pytest.raises(BadInput, match="outside the 4-byte data section"):
        read_safetensors(path)


def test_a_header_only_file_is_read(tmp_path):
    """The JSON header and no data (what a planner needs, without the weights) is a valid input."""
    body = json.dumps({"w": {"dtype": "F16", "shape": [4], "data_offsets": [0, 8]}}).encode()
    path = _raw(tmp_path, len(body), body)
    assert [(t.name, t.n_bytes) for t in read_safetensors(path)] == [("w", 8)]


def test_data_size_must_match_shape(tmp_path):
    body = json.dumps({"w": {"dtype": "F16", "shape": [4], "data_offsets": [0, 6]}}).encode()
    path = _raw(tmp_path, len(body), body + b"\0" * 6)
    with pytest.raises(BadInput, match="6 data bytes for 4 F16 values"):
        read_safetensors(path)


def test_too_short_file(tmp_path):
    path = tmp_path / "short.safetensors"
    path.write_bytes(b"\1\2")
    with pytest.raises(BadInput, match="too short"):
        read_safetensors(path)


@pytest.mark.parametrize("body, words", [
    # nested arrays past Python's recursion limit: json.loads would raise RecursionError
    ('{"w": {"dtype": "F16", "shape": ' + "[" * 100_000 + "]" * 100_000 + ', "data_offsets": [0, 4]}}',
     ("nests arrays or objects too deeply",)),
    ('{"x": ' + '{"a":' * 50_000 + "1" + "}" * 50_000 + "}", ("nests arrays or objects too deeply",)),
    # a 5,000-digit integer: int() would raise ValueError past sys.get_int_max_str_digits()
    ('{"w": {"dtype": "F16", "shape": [2], "data_offsets": [0, ' + "9" * 5000 + "]}}",
     ("an integer of 5000 digits",)),
    # a list where the dtype string goes: `dtype in DTYPE_BYTES` would raise TypeError (unhashable)
    ('{"w": {"dtype": ["F16"], "shape": [2], "data_offsets": [0, 4]}}', ("unsupported dtype ['F16']",)),
    ('{"w": {"dtype": {"a": 1}, "shape": [2], "data_offsets": [0, 4]}}', ("unsupported dtype",)),
    # NaN is not JSON; nor is a bool a dimension
    ('{"w": {"dtype": "F16", "shape": [NaN], "data_offsets": [0, 4]}}', ("NaN (not JSON)",)),
    ('{"w": {"dtype": "F16", "shape": [true, 2], "data_offsets": [0, 4]}}', ("malformed shape",)),
    # a 5,000-character dtype is quoted as a prefix
    ('{"w": {"dtype": "' + "x" * 5000 + '", "shape": [2], "data_offsets": [0, 4]}}', ("5002 characters",)),
], ids=["nested-arrays", "nested-objects", "5000-digits", "list-dtype", "object-dtype", "nan", "bool-dim",
        "long-dtype"])
def test_hostile_json_is_refused_in_one_bounded_line(tmp_path, body, words):
    raw = body.encode()
    path = _raw(tmp_path, len(raw), raw + b"\0" * 4)
    with pytest.raises(BadInput) as e:
        read_safetensors(path)
    message = str(e.value)
    assert "\n" not in message and len(message) < 300, message
    for w in words:
        assert w in message
