"""The AllReduce side of a `-sm tensor` validate run: what the runtime's meta backend moved per
generated token, beside what the pinned llama.cpp does for the same model and member count.

llama.cpp's figures, from ggml/src/ggml-backend-meta.cpp at the pin:
- reduce points (ggml_backend_meta_graph_compute): the graph is cut into subgraphs, a new one
  after every node whose split state is PARTIAL (after the delayed reduce, get_i_delayed) and
  at the last node; every subgraph but the last (`i < n_subgraphs - 1`) ends in an AllReduce.
  In a llama-shaped layer (llama, qwen2/3, their MoE) the PARTIAL nodes are the attention output
  projection and the FFN (or expert-sum) down projection, a row-parallel weight split on dim 0
  times an input split on dim 0; the delay never merges the two (the FFN's rms_norm reads the
  attention's sum), so 2 reduces per layer, each of the [n_embd, n_tokens] f32 residual.
- bytes per reduce (allreduce_fallback, the generic path; CUDA with NCCL reduces there instead):
  with P the largest power of two <= N (`offset_j` = N/2 rounded down to a power of two, P =
  2 x offset_j_max), the N - P excess members push their tensor once (the fold), then log2 P
  butterfly steps each push from all P members, then the reduced tensor is copied back to the
  N - P excess members: (2 (N - P) + P log2 P) tensors of B bytes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

F32_BYTES = 4
REDUCES_PER_LAYER = 2   # attention output, FFN down: see the module docstring


def llama_cpp_bytes_per_reduce(n_devices: int, nbytes: int) -> int:
    """Bytes allreduce_fallback pushes between members to reduce one tensor of `nbytes` over N."""
    if n_devices < 2:
        return 0   # n_backends > 1: no reduce at all
    p = 1 << (n_devices.bit_length() - 1)
    return (2 * (n_devices - p) + p * int(math.log2(p))) * nbytes


@dataclass(frozen=True)
class AllReduceReport:
    """Per generated token (one-token graphs): reduce points and bytes moved between members,
    measured by the runtime and derived for llama.cpp; `n_layer` counts the layers on the meta device."""

    n_devices: int
    n_layer: int
    reduces_per_token: int
    bytes_per_token: int
    llama_cpp_reduces_per_token: int
    llama_cpp_bytes_per_token: int

    @property
    def reduces_per_layer(self) -> float:
        return self.reduces_per_token / max(1, self.n_layer)

    @property
    def llama_cpp_reduces_per_layer(self) -> float:
        return self.llama_cpp_reduces_per_token / max(1, self.n_layer)

    def to_dict(self) -> dict[str, Any]:
        return {"n_devices": self.n_devices, "n_layer": self.n_layer, "reduces_per_layer": self.reduces_per_layer,
                "bytes_per_token": self.bytes_per_token,
                "llama_cpp": {"reduces_per_layer": self.llama_cpp_reduces_per_layer,
                              "bytes_per_token": self.llama_cpp_bytes_per_token}}

    def line(self) -> str:
        return (f"allreduce over {self.n_devices} members per token ({self.n_layer} layers on the meta device): "
                f"{self.reduces_per_layer:g} reduces per layer, "
                f"{self.bytes_per_token} B moved (llama.cpp: {self.llama_cpp_reduces_per_layer:g} per layer, "
                f"{self.llama_cpp_bytes_per_token} B)")


def allreduce_report(n_devices: int, n_layer: int, n_embd: int, reduces_per_token: int,
                     bytes_per_token: int) -> AllReduceReport:
    """The runtime's measured figures beside llama.cpp's for one-token graphs of a llama-shaped model."""
    per_reduce = llama_cpp_bytes_per_reduce(n_devices, n_embd * F32_BYTES)
    n = REDUCES_PER_LAYER * n_layer if n_devices > 1 else 0
    return AllReduceReport(n_devices, n_layer, reduces_per_token, bytes_per_token, n, n * per_reduce)
