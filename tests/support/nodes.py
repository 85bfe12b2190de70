"""Reading fitplan-dump-nodes output (scripts/dump_nodes.cpp) and lining it up with the runtime's
nodes: both list the computed (non-view) nodes in graph order, so the k-th of one is the k-th of
the other when the graphs have the same shape."""
from __future__ import annotations

import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from runtime.engine.runner import ModelRunner

# ggml type ids of the node types compared (ggml.h enum ggml_type)
NUMPY_OF_GGML = {0: np.float32, 1: np.float16, 26: np.int32}
# ops that move or select data rather than compute it (ggml_op_desc names)
NOT_COMPUTED = frozenset({"VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE", "NONE", "CPY", "SET_ROWS", "CONT", "GET_ROWS"})


@dataclass(frozen=True)
class Node:
    name: str
    op: str
    values: np.ndarray   # flat, in the node's type


def _read(path: Path) -> list[Node]:
    data = path.read_bytes()
    out, o = [], 0

    def take(fmt: str):
        nonlocal o
        vals = struct.unpack_from(fmt, data, o)
        o += struct.calcsize(fmt)
        return vals

    while o < len(data):
        (n,) = take("<I")
        name = data[o:o + n].decode()
        o += n
        (n,) = take("<I")
        op = data[o:o + n].decode()
        o += n
        is_view, gtype = take("<II")
        take("<4q")
        take("<4q")
        (size,) = take("<Q")
        raw = data[o:o + size]
        o += size
        if not is_view and op not in NOT_COMPUTED and gtype in NUMPY_OF_GGML:
            out.append(Node(name, op, np.frombuffer(raw, NUMPY_OF_GGML[gtype])))
    return out


def llama_nodes(bin_dir: Path, model: str, n_ctx: int, batches: list[int], tokens: list[int],
                out_dir: Path) -> list[list[Node]]:
    """llama.cpp's computed nodes per batch."""
    argv = [str(bin_dir / "fitplan-dump-nodes"), model, str(out_dir), str(n_ctx), ",".join(map(str, batches)),
            *map(str, tokens)]
    subprocess.run(argv, check=True, capture_output=True, timeout=600)
    return [_read(out_dir / f"step{k}.bin") for k in range(len(batches))]


def runtime_nodes(runner: ModelRunner, batches: list[int], tokens: list[int]) -> list[list[Node]]:
    """The runtime's computed nodes per batch, captured as each is computed."""
    steps: list[list[Node]] = []

    def observe(t) -> None:
        if t.op.value not in NOT_COMPUTED:
            steps[-1].append(Node(t.name, t.op.value, np.array(t.numpy(), copy=True).reshape(-1)))

    for b in runner.backends.values():
        b.observer = observe
    runner.reset()
    at = 0
    try:
        for size in batches:
            steps.append([])
            runner.decode(tokens[at:at + size], all_logits=False)
            at += size
    finally:
        for b in runner.backends.values():
            b.observer = None
    return steps
