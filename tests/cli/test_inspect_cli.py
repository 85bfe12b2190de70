"""`fitplan inspect` through the CLI entry point: output formats and one-line errors (exit 2)."""
from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import pytest
from gguf import GGUFValueType, Keys

from planner.cli import main
from planner.synth.gguf_factory import gemma3_spec, llama_spec, qwen3moe_spec

MIB = 2**20


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["inspect", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _string(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


def _header(n_tensors: int, n_kv: int) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv)


ARCH_KV = _string(b"general.architecture") + struct.pack("<I", GGUFValueType.STRING) + _string(b"llama")


def _raw(tmp_path: Path, body: bytes) -> Path:
    path = tmp_path / "bad.gguf"
    path.write_bytes(body)
    return path


def _valid(tmp_path: Path) -> Path:
    return llama_spec().write(tmp_path / "ok.gguf")[0]


def _patched(tmp_path: Path, at: int, value: int, fmt: str) -> Path:
    path = _valid(tmp_path)
    raw = bytearray(path.read_bytes())
    struct.pack_into(fmt, raw, at, value)
    path.write_bytes(raw)
    return path


def _unknown_type(tmp_path: Path) -> Path:
    body = (_header(1, 1) + ARCH_KV + _string(b"blk.0.attn_q.weight") + struct.pack("<IQIQ", 1, 32, 99, 0)
            + b"\0" * 64)
    return _raw(tmp_path, body)


def _missing_shard(tmp_path: Path) -> Path:
    paths = llama_spec().write(tmp_path / "split.gguf", shards=2)
    paths[1].unlink()
    return paths[0]


def _no_block_count(tmp_path: Path) -> Path:
    spec = llama_spec()
    del spec.metadata[Keys.LLM.BLOCK_COUNT]
    return spec.write(tmp_path / "nobc.gguf")[0]


ERROR_CASES = {
    "not a GGUF file": (lambda p: _raw(p, b"<html>not a model</html>"), "not a GGUF file"),
    "truncated header": (lambda p: _raw(p, _header(0, 1) + _string(b"general.architecture")), "truncated header"),
    "unsupported version": (lambda p: _patched(p, 4, 7, "<I"), "unsupported GGUF version 7"),
    "unknown ggml type": (_unknown_type, "unknown ggml type 99"),
    "missing shard": (_missing_shard, "missing shard 2 of 2"),
    "missing block_count": (_no_block_count, "missing required key llama.block_count"),
    "hostile string length": (lambda p: _raw(p, _header(0, 1) + _string(b"general.name")
                                             + struct.pack("<IQ", GGUFValueType.STRING, 2**61)), "hostile header"),
    "hostile array length": (lambda p: _raw(p, _header(0, 1) + _string(b"tokenizer.ggml.scores")
                                            + struct.pack("<IIQ", GGUFValueType.ARRAY, GGUFValueType.FLOAT32, 2**58)
                                            + b"\0" * 16), "hostile header"),
    "hostile tensor count": (lambda p: _raw(p, _header(2**62, 1) + ARCH_KV), "hostile header"),
    "a directory": (lambda p: p, "not a regular file"),
    "no such file": (lambda p: p / "absent.gguf", "no such file"),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_bad_model_is_one_line_and_exit_2(tmp_path, capsys, case):
    make, problem = ERROR_CASES[case]
    path = make(tmp_path)
    code, out, err = _run(capsys, str(path))
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("fitplan: error: ")
    assert str(path) in lines[0] and problem in lines[0]
    assert "Traceback" not in out + err


def test_bad_cache_type_is_exit_2(tmp_path, capsys):
    code, _, err = _run(capsys, str(_valid(tmp_path)), "-ctk", "q3_k")
    assert code == 2
    assert err.strip().splitlines() == ["fitplan: error: unsupported cache type 'q3_k': expected one of "
                                        "f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1"]


def _ints_only(node) -> None:
    """Every byte figure in the JSON is a plain int (never a float, never a formatted string)."""
    for k, v in node.items():
        if k in ("bytes", "weight_bytes", "k_bytes_per_cell", "v_bytes_per_cell", "state_bytes_per_seq") \
                or k.endswith("_bytes"):
            assert type(v) is int, (k, v)
        if isinstance(v, dict):
            _ints_only(v)
        if isinstance(v, list):
            for item in v:
                if isinstance(item, dict):
                    _ints_only(item)


def _table_rows(text: str) -> list[list[str]]:
    """The per-layer rows of the table: cells split on runs of two or more spaces."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("layer "))
    rows = []
    for line in lines[start + 2:]:
        if not line.strip():
            break
        rows.append(re.split(r"\s{2,}", line.strip()))
    return rows


def test_json_has_int_bytes_and_the_tables_content(tmp_path, capsys):
    spec = gemma3_spec(n_layer=7, n_embd=128, n_head=4, n_head_kv=1, head_dim=64, window=128)
    path = spec.write(tmp_path / "g.gguf")[0]
    code, out, _ = _run(capsys, str(path), "--format", "json")
    assert code == 0
    doc = json.loads(out)
    _ints_only(doc)
    assert (doc["architecture"], doc["n_layer"], doc["kv_facts_known"], doc["tied_embeddings"]) == (
        "gemma3", 7, True, True)
    assert [lay["kind"] for lay in doc["layers"]] == ["swa"] * 5 + ["full", "swa"]
    assert {(lay["k_bytes_per_cell"], lay["v_bytes_per_cell"]) for lay in doc["layers"]} == {(64 * 2, 64 * 2)}
    ffn = 2 * 256 * 4 * 34 + 128 * 8 * 34  # gate, up Q8_0 {128, 256}; down {256, 128}
    assert {lay["weights"]["ffn"] for lay in doc["layers"]} == {ffn}
    assert doc["totals"]["weight_bytes"] == doc["total_tensor_bytes"]

    code, table, _ = _run(capsys, str(path))
    assert code == 0
    rows = _table_rows(table)
    assert len(rows) == 7 + 1  # the layers and a total row
    groups = ["attention", "ffn", "experts", "shared_experts", "norms_other"]
    for row, lay in zip(rows, doc["layers"], strict=False):
        kind = lay["kind"] + (f"/{lay['window']}" if lay["window"] else "")
        kv_1k = (lay["k_bytes_per_cell"] + lay["v_bytes_per_cell"]) * 1024
        assert row == [str(lay["layer"]), kind, *(f"{lay['weights'][g] / MIB:.2f}" for g in groups),
                       f"{lay['weight_bytes'] / MIB:.2f}", f"{kv_1k / MIB:.2f}",
                       f"{lay['state_bytes_per_seq'] / MIB:.2f}"]
    for t in doc["non_repeating"]:
        assert re.search(rf"^{re.escape(t['name'])}\s+{t['type']}\s+{t['bytes'] / MIB:.2f}$", table, re.M)


def test_cache_type_flags(tmp_path, capsys):
    path = qwen3moe_spec(n_head_kv=2, head_dim=64).write(tmp_path / "q.gguf")[0]
    code, out, _ = _run(capsys, str(path), "--format", "json", "-ctk", "q8_0", "-ctv", "q4_0")
    assert code == 0
    doc = json.loads(out)
    assert (doc["cache_type_k"], doc["cache_type_v"]) == ("q8_0", "q4_0")
    assert {(lay["k_bytes_per_cell"], lay["v_bytes_per_cell"]) for lay in doc["layers"]} == {(4 * 34, 4 * 18)}
    assert doc["experts"] == {"count": 8, "used": 2, "shared": 0}


def test_unknown_architecture(tmp_path, capsys):
    path = llama_spec(arch="zyxformer", n_layer=2, n_embd=256, n_ff=512).write(tmp_path / "z.gguf")[0]
    code, table, _ = _run(capsys, str(path))
    assert code == 0
    assert "KV facts unknown for this architecture" in table
    rows = _table_rows(table)
    assert [r[1] for r in rows[:2]] == ["unknown", "unknown"]
    code, out, _ = _run(capsys, str(path), "--format", "json")
    doc = json.loads(out)
    assert doc["kv_facts_known"] is False
    # ffn: gate, up Q4_K {256, 512} + down Q6_K {512, 256}
    assert [lay["weights"]["ffn"] for lay in doc["layers"]] == [2 * 512 * 144 + 256 * 2 * 210] * 2
    assert {(lay["k_bytes_per_cell"], lay["v_bytes_per_cell"]) for lay in doc["layers"]} == {(0, 0)}


def test_example_gemma3_270m(capsys):
    code, out, _ = _run(capsys, "example:gemma3-270m", "--format", "json")
    assert code == 0
    doc = json.loads(out)
    assert (doc["architecture"], doc["n_layer"], doc["total_tensor_bytes"]) == ("gemma3", 18, 246_587_904)
    assert [lay["kind"] for lay in doc["layers"]].count("swa") == 15
    assert {(lay["k_bytes_per_cell"], lay["v_bytes_per_cell"]) for lay in doc["layers"]} == {(512, 512)}
    assert doc["totals"]["layer_weight_bytes"] + doc["totals"]["non_repeating_bytes"] == 246_587_904
