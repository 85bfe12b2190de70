"""LoRA adapter GGUFs with real random weights, laid out as the pinned llama.cpp loads them
(src/llama-adapter.cpp llama_adapter_lora_init_impl; convert_lora_to_gguf.py writes the same):
general.type "adapter", adapter.type "lora", adapter.lora.alpha, and for each patched weight BASE
of ggml shape [ne0, ne1] a pair BASE.lora_a [ne0, r] and BASE.lora_b [r, ne1] (token_embd: A
[r, ne1], B [r, ne0]). Shapes are ggml order (ne0 first); gguf-py's writer takes numpy order.

Nothing here computes a figure a test asserts: tests work their bytes out from the shapes.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFType, GGUFValueType, GGUFWriter, Keys
from gguf.quants import quantize

Q = GGMLQuantizationType
TOKEN_EMBD = "token_embd.weight"


@dataclass(frozen=True)
class LoraTensor:
    name: str
    shape: tuple[int, ...]   # ggml order
    qtype: Q


def lora_layout(bases: Iterable[tuple[str, Sequence[int]]], rank: int, qtype: Q = Q.F16) -> list[LoraTensor]:
    """The A and B tensors for base weights given as (name, ggml shape)."""
    out = []
    for name, shape in bases:
        ne0, ne1 = shape[0], shape[1] if len(shape) > 1 else 1
        if name.endswith(TOKEN_EMBD):
            a, b = (rank, ne1), (rank, ne0)
        else:
            a, b = (ne0, rank), (rank, ne1)
        out += [LoraTensor(name + ".lora_a", a, qtype), LoraTensor(name + ".lora_b", b, qtype)]
    return out


def _values(rng: np.random.Generator, t: LoraTensor) -> np.ndarray:
    values = (rng.standard_normal(tuple(reversed(t.shape))) * 0.01).astype(np.float32)
    if t.qtype == Q.F32:
        return values
    if t.qtype == Q.F16:
        return values.astype(np.float16)
    return quantize(values, t.qtype)


def write_lora(path: Path, arch: str, tensors: Sequence[LoraTensor], alpha: float = 16.0, seed: int = 0,
               general_type: str = GGUFType.ADAPTER, adapter_type: str = "lora",
               invocation_tokens: Sequence[int] | str | None = None) -> Path:
    """Write the adapter (an aLoRA with `invocation_tokens`, a UINT32 array). `general_type` /
    `adapter_type` other than the defaults, or tokens given as a string, make files llama.cpp refuses."""
    rng = np.random.default_rng(seed)
    w = GGUFWriter(path, arch)
    w.add_type(general_type)
    w.add_string(Keys.Adapter.TYPE, adapter_type)
    w.add_float32(Keys.Adapter.LORA_ALPHA, alpha)
    if isinstance(invocation_tokens, str):
        w.add_string(Keys.Adapter.ALORA_INVOCATION_TOKENS, invocation_tokens)
    elif invocation_tokens is not None:
        w.add_key_value(Keys.Adapter.ALORA_INVOCATION_TOKENS, list(invocation_tokens), GGUFValueType.ARRAY,
                        GGUFValueType.UINT32)
    for t in tensors:
        data = _values(rng, t)
        w.add_tensor(t.name, data, raw_dtype=t.qtype if t.qtype not in (Q.F32, Q.F16) else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
