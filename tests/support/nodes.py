"""Reading fitplan-dump-nodes output (scripts/dump_nodes.cpp) and lining it up with the runtime's
nodes: both list the computed (non-view) nodes in graph order, so the k-th of one is the k-th of
the other when the graphs have the same shape."""
from __future__ import annotations

import struct
import subprocess
from collections.abc import Mapping
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


@dataclass(frozen=True)
class Record:
    """One node as fitplan-dump-nodes writes it: name, op (ggml_op_desc's spelling: a UNARY or GLU node
    as its kind), whether it is a view, its ggml type id, ne, nb and its data."""
    name: str
    op: str
    is_view: bool
    gtype: int
    ne: tuple[int, ...]
    nb: tuple[int, ...]
    raw: bytes


def read_records(path: Path) -> list[Record]:
    """Every node of one step file, views included, in graph order."""
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
        ne, nb = take("<4q"), take("<4q")
        (size,) = take("<Q")
        out.append(Record(name, op, bool(is_view), gtype, tuple(ne), tuple(nb), data[o:o + size]))
        o += size
    return out


def node_shapes(path: Path, kinds: Mapping[str, str] | None = None) -> list[tuple[str, tuple[int, ...],
                                                                                  tuple[int, ...]]]:
    """(op, ne, nb) of every node of one step file, views included; `kinds` renames ops (a UNARY or GLU
    kind such as SILU to the op the runtime's node carries, keeping the kind in op_params)."""
    kinds = kinds or {}
    return [(kinds.get(r.op, r.op), r.ne, r.nb) for r in read_records(path)]


def _read(path: Path) -> list[Node]:
    return [Node(r.name, r.op, np.frombuffer(r.raw, NUMPY_OF_GGML[r.gtype])) for r in read_records(path)
            if not r.is_view and r.op not in NOT_COMPUTED and r.gtype in NUMPY_OF_GGML]


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
