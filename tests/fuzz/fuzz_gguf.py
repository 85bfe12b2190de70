"""GGUF and safetensors lies for tests/fuzz/fuzz_inputs.py, made from valid files written by gguf-py
(planner/synth/gguf_factory.py) and re-written field by field (planner/synth/gguf_fields.py). The rules a lie
breaks are ggml/src/gguf.cpp's (gguf_init_from_file_impl) and src/llama-model-loader.cpp's (GKV::get_kv
asserts the type) at the pinned llama.cpp; the harness uses them only as the oracle of what must be
refused (exit 2).
"""
from __future__ import annotations

import json
import math
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from gguf import GGUFValueType as VT

from planner.synth.gguf_fields import Gguf

# --- lies --------------------------------------------------------------------------------------------

# What the pinned llama.cpp reads each key as (llama-model.cpp load_hparams; llama-model-loader.cpp's
# GKV asserts the type): the oracle of "a key of the wrong type is refused". Per-layer keys may be an
# array of the type (get_key_or_arr).
KEY_TYPES: dict[str, VT] = {
    "block_count": VT.UINT32, "embedding_length": VT.UINT32, "context_length": VT.UINT32,
    "feed_forward_length": VT.UINT32, "attention.head_count": VT.UINT32, "attention.head_count_kv": VT.UINT32,
    "attention.key_length": VT.UINT32, "attention.value_length": VT.UINT32, "expert_count": VT.UINT32,
    "expert_used_count": VT.UINT32, "attention.sliding_window": VT.UINT32, "vocab_size": VT.UINT32,
    "ssm.conv_kernel": VT.UINT32, "ssm.inner_size": VT.UINT32, "ssm.state_size": VT.UINT32,
    "ssm.group_count": VT.UINT32, "ssm.time_step_rank": VT.UINT32, "nextn_predict_layers": VT.UINT32,
    "expert_shared_count": VT.UINT32, "full_attention_interval": VT.UINT32,
}
GENERAL_TYPES: dict[str, VT] = {"general.alignment": VT.UINT32, "general.architecture": VT.STRING,
                                "general.file_type": VT.UINT32, "split.count": VT.UINT16}
PER_LAYER = {"feed_forward_length", "attention.head_count", "attention.head_count_kv", "expert_used_count"}

# (type, value, sub-type) lies; a right-typed absurd value is allowed any clean exit, a wrong type must be 2
LIE_VALUES: list[tuple[VT, object, VT | None]] = [
    (VT.STRING, "12", None), (VT.STRING, "", None), (VT.BOOL, True, None), (VT.FLOAT32, 2.5, None),
    (VT.FLOAT32, math.nan, None), (VT.FLOAT32, math.inf, None), (VT.FLOAT64, -math.inf, None),
    (VT.UINT64, 1 << 40, None), (VT.UINT64, 1 << 63, None), (VT.UINT64, (1 << 64) - 1, None),
    (VT.INT32, -1, None), (VT.INT64, -(1 << 63), None), (VT.UINT32, 0, None), (VT.UINT32, (1 << 32) - 1, None),
    (VT.UINT32, 1 << 20, None), (VT.UINT32, 3, None), (VT.INT32, 12, None), (VT.UINT8, 7, None),
    (VT.ARRAY, [1, 2, 3], VT.UINT32), (VT.ARRAY, [], VT.UINT32), (VT.ARRAY, ["a", "b"], VT.STRING),
    (VT.ARRAY, [0] * 600, VT.UINT32), (VT.ARRAY, [1.5, math.nan], VT.FLOAT32), (VT.STRING, "9" * 5000, None),
]


def lie_is_wrong_type(key_suffix: str, general: bool, lie: tuple[VT, object, VT | None]) -> bool:
    want = GENERAL_TYPES.get(key_suffix) if general else KEY_TYPES.get(key_suffix)
    if want is None:
        return False
    vtype, _, sub = lie
    if vtype == VT.ARRAY:
        return not (key_suffix in PER_LAYER and sub in (VT.UINT32, VT.INT32))
    return vtype != want


@dataclass(frozen=True)
class Made:
    """One generated model input: the file to name on the command line, and whether it must be refused."""

    path: Path
    must_refuse: bool
    what: str


Lie = Callable[[random.Random, Gguf, Path], Made]


def _arch(g: Gguf) -> str:
    kv = g.kv("general.architecture")
    return kv.payload[8:].decode() if kv is not None else "llama"


def lie_key_value(rng: random.Random, g: Gguf, out: Path) -> Made:
    general = rng.random() < 0.25
    suffix = rng.choice(sorted(GENERAL_TYPES if general else KEY_TYPES))
    key = suffix if general else f"{_arch(g)}.{suffix}"
    lie = rng.choice(LIE_VALUES)
    if suffix == "split.count" and lie[0] != VT.UINT16:
        g.set("split.no", VT.UINT16, 0)
    g.set(key, lie[0], lie[1], lie[2])
    bad_alignment = suffix == "general.alignment" and lie[1] in (0, 3, (1 << 32) - 1)
    wrong = lie_is_wrong_type(suffix, general, lie) or bad_alignment
    return Made(g.write(out), wrong, f"{key} := {lie[0].name} {str(lie[1])[:40]}")


# float keys llama.cpp reads as FLOAT32 (rope, norms, scales), for right-typed absurd values
F32_KEYS = ("rope.freq_base", "rope.scaling.factor", "rope.scaling.yarn_log_multiplier", "expert_weights_scale",
            "attention.layer_norm_rms_epsilon", "attention.scale", "final_logit_softcapping",
            "attn_logit_softcapping", "embedding_scale", "residual_scale", "logit_scale")


def lie_right_type(rng: random.Random, g: Gguf, out: Path) -> Made:
    """A key of the type llama.cpp reads, holding an absurd value: planned or refused, but cleanly."""
    if rng.random() < 0.3:
        key = f"{_arch(g)}.{rng.choice(F32_KEYS)}"
        fvalue = rng.choice([math.nan, math.inf, -math.inf, 0.0, -1.0, 3e38, 1e-45])
        if "scaling.factor" in key:
            g.set(f"{_arch(g)}.rope.scaling.type", VT.STRING, rng.choice(["linear", "yarn", "longrope"]))
        g.set(key, VT.FLOAT32, fvalue)
        return Made(g.write(out), False, f"{key} := {fvalue}")
    suffix = rng.choice(sorted(KEY_TYPES))
    key = f"{_arch(g)}.{suffix}"
    value = rng.choice([0, 1, 3, 7, 1 << 16, 1 << 20, 1 << 31, (1 << 32) - 1])
    if suffix in PER_LAYER and rng.random() < 0.3:
        n = struct.unpack("<I", g.kv(f"{_arch(g)}.block_count").payload)[0]  # type: ignore[union-attr]
        g.set(key, VT.ARRAY, [rng.choice([0, 1, value]) for _ in range(n)], VT.UINT32)
    else:
        g.set(key, VT.UINT32, value)
    return Made(g.write(out), False, f"{key} := {value}")


def lie_missing_key(rng: random.Random, g: Gguf, out: Path) -> Made:
    e = rng.choice(g.kvs)
    g.kvs.remove(e)
    required = e.key.decode().endswith((".block_count", ".embedding_length")) or e.key == b"general.architecture"
    return Made(g.write(out), required, f"drop {e.key.decode()[:60]}")


def lie_duplicate(rng: random.Random, g: Gguf, out: Path) -> Made:
    if rng.random() < 0.5 and g.tis:
        t = rng.choice(g.tis)
        g.tis.append(replace(t, dims=list(t.dims)))
        return Made(g.write(out), True, f"tensor {t.name.decode()} twice")
    e = rng.choice(g.kvs)
    g.kvs.insert(rng.randrange(len(g.kvs) + 1), replace(e))
    return Made(g.write(out), True, f"key {e.key.decode()[:60]} twice")


def _t_none(g: Gguf, t: int, rng: random.Random) -> bool:
    g.tis = []
    return True


def _t_misaligned(g: Gguf, t: int, rng: random.Random) -> bool:
    g.tis[t].offset += rng.choice([1, 3, 17])
    return True


def _t_overlap(g: Gguf, t: int, rng: random.Random) -> bool:
    if t == 0:
        return False
    g.tis[t].offset = g.tis[t - 1].offset
    return True


def _t_far(g: Gguf, t: int, rng: random.Random) -> bool:
    g.tis[t].offset = rng.choice([1 << 40, 1 << 62, (1 << 64) - 32])
    return True


def _t_dims(g: Gguf, t: int, rng: random.Random) -> bool:
    ti = g.tis[t]
    kind = rng.choice(["none", "five", "zero", "huge", "2^63"])
    if kind == "none":
        ti.dims = []
    elif kind == "five":
        ti.dims = ti.dims + [1] * (5 - len(ti.dims))
    elif kind == "zero":
        ti.dims[-1] = 0
    else:
        ti.dims[-1] = 1 << 40 if kind == "huge" else (1 << 63) + 1
    return kind != "zero"


def _t_type(g: Gguf, t: int, rng: random.Random) -> bool:
    g.tis[t].ggml_type = rng.choice([99, 1 << 31, 4, 5])    # 4, 5: Q4_2/Q4_3, removed from ggml
    return True


def _t_name(g: Gguf, t: int, rng: random.Random) -> bool:
    n = rng.choice([0, 58, 64, 5000])    # ggml.h GGML_MAX_NAME 64: 63 bytes at most
    g.tis[t].name = b"blk.0." + b"x" * n if n else b""
    return n + 6 >= 64


def _t_swap(g: Gguf, t: int, rng: random.Random) -> bool:
    """Two tensors swap offsets: each in the other's bytes (gguf.cpp wants them in index order)."""
    if t == 0 or g.tis[t].offset == g.tis[t - 1].offset:
        return False
    g.tis[t].offset, g.tis[t - 1].offset = g.tis[t - 1].offset, g.tis[t].offset
    return True


TENSOR_LIES: dict[str, Callable[[Gguf, int, random.Random], bool]] = {
    "none": _t_none, "misaligned": _t_misaligned, "overlap": _t_overlap, "far": _t_far, "dims": _t_dims,
    "type": _t_type, "name": _t_name, "swap": _t_swap,
}


def lie_tensors(rng: random.Random, g: Gguf, out: Path) -> Made:
    kind = rng.choice(sorted(TENSOR_LIES))
    t = rng.randrange(len(g.tis))
    name = g.tis[t].name[:40].decode(errors="replace")
    must = TENSOR_LIES[kind](g, t, rng)
    return Made(g.write(out), must, f"tensor {name}: {kind}")


def lie_counts(rng: random.Random, g: Gguf, out: Path) -> Made:
    kind = rng.choice(["n_tensors", "n_kv", "version"])
    if kind == "version":
        g.version = rng.choice([0, 1, 4, 1 << 31, 0x03000000])
    else:
        real = len(g.tis) if kind == "n_tensors" else len(g.kvs)
        lie = rng.choice([real + 1, real - 1 if real else 1 << 20, 1 << 40, (1 << 63) + 5, (1 << 64) - 1])
        if kind == "n_tensors":
            g.n_tensors = lie
        else:
            g.n_kv = lie
        # one tensor fewer is a valid file: the last entry's bytes become padding before the data
        return Made(g.write(out), not (kind == "n_tensors" and lie == real - 1), f"{kind} {real} -> {lie}")
    return Made(g.write(out), True, kind)


def lie_length(rng: random.Random, g: Gguf, out: Path) -> Made:
    """Overwrite one length field (a key, name, string or array count) with a lie."""
    data = bytearray(g.encode())
    lengths = [off for off, kind in g.boundaries if kind == "length"]
    off = rng.choice(lengths)
    real = struct.unpack_from("<Q", data, off)[0]
    lie = rng.choice([real + 1, max(real - 1, 0), 40_000_000, 1 << 40, 1 << 63, (1 << 64) - 1, len(data)])
    struct.pack_into("<Q", data, off, lie)
    out.write_bytes(bytes(data))
    with open(out, "r+b") as f:
        f.truncate(len(data) + g.data_bytes)
    return Made(out, abs(lie - real) > 1, f"length at byte {off}: {real} -> {lie}")


def lie_type_field(rng: random.Random, g: Gguf, out: Path) -> Made:
    data = bytearray(g.encode())
    types = [off for off, kind in g.boundaries if kind == "type"]
    off = rng.choice(types)
    lie = rng.choice([13, 99, 1 << 31, (1 << 32) - 1, VT.ARRAY, VT.STRING, VT.UINT64])
    must = lie > 12
    struct.pack_into("<I", data, off, lie)
    out.write_bytes(bytes(data))
    return Made(out, must, f"type at byte {off} := {lie}")


def lie_truncate(rng: random.Random, g: Gguf, out: Path) -> Made:
    g.encode()
    cuts = [off for off, _ in g.boundaries] + [off + 1 for off, _ in g.boundaries[:-1]]
    cut = rng.choice(cuts)
    end = g.boundaries[-1][0]
    return Made(g.write(out, truncate_at=cut), cut < end, f"truncated at byte {cut} of {end}")


def lie_flip(rng: random.Random, g: Gguf, out: Path) -> Made:
    data = bytearray(g.encode())
    for _ in range(rng.choice([1, 2, 4, 16])):
        data[rng.randrange(len(data))] = rng.randrange(256)
    out.write_bytes(bytes(data))
    with open(out, "r+b") as f:
        f.truncate(len(data) + g.data_bytes)
    return Made(out, False, "byte flips")


GGUF_LIES: dict[str, Lie] = {
    "key_value": lie_key_value, "right_type": lie_right_type, "missing_key": lie_missing_key,
    "duplicate": lie_duplicate,
    "tensors": lie_tensors, "counts": lie_counts, "length": lie_length, "type_field": lie_type_field,
    "truncate": lie_truncate, "flip": lie_flip,
}
GGUF_WEIGHTS = {"key_value": 6, "right_type": 4, "missing_key": 2, "duplicate": 1, "tensors": 3, "counts": 1,
                "length": 3, "type_field": 1, "truncate": 3, "flip": 2}


def split_lie(rng: random.Random, shards: list[Gguf], directory: Path) -> Made:
    """A two-shard model (NAME-0000i-of-00002.gguf) with one shard lying."""
    names = [directory / f"sp-{i + 1:05d}-of-{len(shards):05d}.gguf" for i in range(len(shards))]
    gs = [replace(s, kvs=[replace(e) for e in s.kvs], tis=[replace(t) for t in s.tis]) for s in shards]
    kind = rng.choice(["copy_first", "missing", "count_string", "count_lie", "no_lie", "no_string", "valid"])
    must = True
    if kind == "copy_first":
        gs[1] = gs[0]
    elif kind == "count_string":
        gs[0].set("split.count", VT.STRING, str(len(gs)))
    elif kind == "count_lie":
        count = rng.choice([0, 3, 65535])
        gs[0].set("split.count", VT.UINT16, count)
        must = count != 0   # llama.cpp reads split.count 0 as "not split" (n_split > 1 is false)
    elif kind == "no_lie":
        gs[1].set("split.no", VT.UINT16, rng.choice([0, 5]))
    elif kind == "no_string":
        gs[1].set("split.no", VT.STRING, "1")
    elif kind == "valid":
        must = False
    for i, g in enumerate(gs):
        if not (kind == "missing" and i == 1):
            g.write(names[i])
    return Made(names[0], must, f"split: {kind}")


# --- safetensors -------------------------------------------------------------------------------------

SD_TENSORS = {"model.diffusion_model.double_blocks.0.img_attn.qkv.weight": ("F16", [64, 64]),
              "text_encoders.t5xxl.transformer.encoder.block.0.layer.0.w": ("F16", [32, 64]),
              "first_stage_model.decoder.conv_in.weight": ("F32", [16, 8])}
ST_BYTES = {"F16": 2, "F32": 4}


def _st_valid() -> dict[str, object]:
    header: dict[str, object] = {}
    offset = 0
    for name, (dtype, shape) in SD_TENSORS.items():
        n = math.prod(shape) * ST_BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    header["__metadata__"] = {"format": "pt"}
    return header


def _nested(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


@dataclass
class _StLie:
    """One safetensors lie under construction: the header dict, or raw JSON text replacing it."""

    header: dict[str, object]
    entry: dict[str, object]
    name: str
    raw: str | None = None
    length: int | None = None    # a lying header length
    must: bool = True


def _st_text(lie: _StLie) -> str:
    return json.dumps(lie.header)


def _st_nested_shape(rng: random.Random, lie: _StLie) -> None:
    lie.raw = _st_text(lie).replace(json.dumps(lie.entry["shape"]), _nested(rng.choice([100, 5000, 100000])), 1)


def _st_nested_value(rng: random.Random, lie: _StLie) -> None:
    lie.raw = _st_text(lie)[:-1] + ', "x": ' + _nested(rng.choice([5000, 100000])) + "}"


def _st_deep_object(rng: random.Random, lie: _StLie) -> None:
    d = rng.choice([5000, 50000])
    lie.raw = _st_text(lie)[:-1] + ', "x": ' + '{"a":' * d + "1" + "}" * d + "}"


def _st_bigint(rng: random.Random, lie: _StLie) -> None:
    big = "9" * rng.choice([400, 5000, 50000])
    lie.raw = _st_text(lie).replace(json.dumps(lie.entry["data_offsets"]), f"[0, {big}]", 1)


def _st_dtype(rng: random.Random, lie: _StLie) -> None:
    lie.entry["dtype"] = rng.choice([["F16"], "F128", "", None, 16, {"a": 1}, "x" * 5000])


def _st_length(rng: random.Random, lie: _StLie) -> None:
    lie.length = rng.choice([0, 1, 1 << 40, 1 << 63, (1 << 64) - 1, 200_000_000])


def _st_not_json(rng: random.Random, lie: _StLie) -> None:
    lie.raw = rng.choice(["{", "\xff\xfe", "not json", "{'a': 1}", "", "[]", "1", '"x"', "null"])


def _st_dup_key(rng: random.Random, lie: _StLie) -> None:
    lie.raw = _st_text(lie)[:-1] + f", {json.dumps(lie.name)}: {json.dumps(lie.entry)}" + "}"
    lie.must = False   # JSON allows it (the last wins); refused or not, it must be clean


def _st_overlap(rng: random.Random, lie: _StLie) -> None:
    offsets = lie.entry["data_offsets"]
    assert isinstance(offsets, list)
    lie.entry["data_offsets"] = [0, offsets[1] - offsets[0]]
    lie.must = False


def _st_shape(rng: random.Random, lie: _StLie) -> None:
    kind = rng.choice(["negative", "float", "nan", "huge", "bool"])
    if kind == "nan":
        lie.raw = _st_text(lie).replace(json.dumps(lie.entry["shape"]), "[NaN, Infinity]", 1)
    else:
        lie.entry["shape"] = {"negative": [-1, 64], "float": [1.5, 64], "huge": [1 << 62, 1 << 62],
                              "bool": [True, 64]}[kind]


def _st_meta(rng: random.Random, lie: _StLie) -> None:
    lie.header["__metadata__"] = rng.choice([[1, 2], "x", 5, {"a": {"b": [1]}}])
    lie.must = False


def _st_valid_lie(rng: random.Random, lie: _StLie) -> None:
    lie.must = False


ST_LIES: dict[str, Callable[[random.Random, _StLie], None]] = {
    "nested_shape": _st_nested_shape, "nested_value": _st_nested_value, "deep_object": _st_deep_object,
    "bigint": _st_bigint, "dtype": _st_dtype, "length": _st_length, "not_json": _st_not_json,
    "dup_key": _st_dup_key, "overlap": _st_overlap, "shape": _st_shape, "meta": _st_meta, "valid": _st_valid_lie,
}


def safetensors_lie(rng: random.Random, out: Path) -> Made:
    header = _st_valid()
    data_bytes = sum(math.prod(s) * ST_BYTES[d] for d, s in SD_TENSORS.values())
    name = rng.choice(list(SD_TENSORS))
    entry = header[name]
    assert isinstance(entry, dict)
    kind = rng.choice(sorted(ST_LIES))
    lie = _StLie(header, entry, name)
    ST_LIES[kind](rng, lie)
    body = (lie.raw if lie.raw is not None else json.dumps(header)).encode("utf-8", errors="surrogateescape")
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(body) if lie.length is None else lie.length) + body)
        f.truncate(8 + len(body) + data_bytes)
    return Made(out, lie.must, f"safetensors: {kind}")


def safetensors_valid(out: Path) -> Path:
    body = json.dumps(_st_valid()).encode()
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(body)) + body)
        f.truncate(8 + len(body) + sum(math.prod(s) * ST_BYTES[d] for d, s in SD_TENSORS.values()))
    return out
