"""Stage 3: run the splits in order, each after copying its inputs in (seed 000 "Two kinds
of input, two disciplines", "Copying only the experts this batch selected", the eval
callback; ggml_backend_sched_compute_splits).

Nothing here is asynchronous, so "eager" versus "after the event" differ only in where a
synchronize is issued; the synchronize counts on the backends record it.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from runtime.ggml.backend import Backend
from runtime.ggml.graph import BufferUsage, Graph, Op, Tensor, TensorFlag
from runtime.ggml.passes import Assignment
from runtime.ggml.splits import Split, SplitPlan

# ggml pads the last copied expert run by up to 512 bytes so CUDA's MMQ reads no NaNs.
EXPERT_COPY_PADDING = 512

EvalCallback = Callable[[Tensor, bool], bool]


@dataclass(frozen=True)
class InputCopy:
    """One input brought into one split: how many bytes moved, and for expert weights the
    (first, last) expert runs copied."""

    split: int
    name: str
    src_backend: str
    dst_backend: str
    n_bytes: int
    expert_runs: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Measurement:
    n_splits: int
    n_nodes: int
    compute_buffer_bytes: Mapping[str, int]
    copies: tuple[InputCopy, ...]

    @property
    def copied_bytes(self) -> int:
        return sum(c.n_bytes for c in self.copies)


@dataclass
class RunState:
    """What compute needs from the scheduler for one graph."""

    graph: Graph
    plan: SplitPlan
    assignment: Assignment
    backends: Sequence[Backend]
    cur_copy: int
    callback: EvalCallback | None = None


def copy_tensor(src: Tensor, dst: Tensor) -> int:
    """Byte copy between equal layouts (ggml_backend_tensor_copy); returns bytes moved."""
    data = src.raw_bytes()
    dst.raw_bytes()[:] = data
    return int(data.size)


def _used_experts(ids_tensor: Tensor, n_expert: int) -> np.ndarray:
    ids = ids_tensor.numpy()
    if ids.size and (ids.min() < 0 or ids.max() >= n_expert):
        raise ValueError(f"{ids_tensor.name}: expert id outside [0, {n_expert})")
    used = np.zeros(n_expert, dtype=bool)
    used[ids.reshape(-1)] = True
    return used


def expert_runs(used: np.ndarray) -> list[tuple[int, int]]:
    """Consecutive used experts grouped into (first, last) runs, one transfer each."""
    runs: list[tuple[int, int]] = []
    for e in np.flatnonzero(used):
        if runs and runs[-1][1] == e - 1:
            runs[-1] = (runs[-1][0], int(e))
        else:
            runs.append((int(e), int(e)))
    return runs


def _copy_experts(inp: Tensor, cpy: Tensor, runs: list[tuple[int, int]]) -> int:
    n_expert, expert_size = inp.ne[2], inp.nb[2]
    padding = min(expert_size, EXPERT_COPY_PADDING)
    src, dst = inp.raw_bytes(), cpy.raw_bytes()
    moved = 0
    for first, last in runs:
        start = first * expert_size
        size = (last - first + 1) * expert_size + (padding if last < n_expert - 1 else 0)
        dst[start:start + size] = src[start:start + size]
        moved += size
    return moved


class _RouterIds:
    """The router ids last read back and the experts they select: one readback serves
    consecutive expert matmuls (compute_splits carries it from split to split)."""

    __slots__ = ("ids", "used")

    def __init__(self) -> None:
        self.ids: Tensor | None = None
        self.used: np.ndarray = np.zeros(0, dtype=bool)


def _is_expert_input(state: RunState, split: Split, inp: Tensor, cpy: Tensor) -> bool:
    node = state.graph.nodes[split.i_start] if split.i_end > split.i_start else None
    buf = inp.buffer
    return (node is not None and node.op is Op.MUL_MAT_ID and node.src[0] is cpy
            and buf is not None and buf.usage is BufferUsage.WEIGHTS and buf.is_host)


def _ids_source(state: RunState, split: Split, input_id: int, ids_tensor: Tensor) -> Tensor:
    """If the router ids are a later input of this split they are not copied yet: read the
    original (the ordering hazard seed 000 points out)."""
    for later in split.inputs[input_id + 1:]:
        if state.plan.copies[(later, split.backend_id)][state.cur_copy] is ids_tensor:
            return later
    return ids_tensor


def _copy_inputs(state: RunState, k: int, split: Split, cache: _RouterIds) -> list[InputCopy]:
    backend = state.backends[split.backend_id]
    done: list[InputCopy] = []
    for input_id, inp in enumerate(split.inputs):
        src_backend = state.backends[state.assignment.get(inp)]
        cpy = state.plan.copies[(inp, split.backend_id)][state.cur_copy]
        runs: list[tuple[int, int]] = []
        backend.synchronize()  # the destination slot must not be in use by an earlier graph
        if inp.flags & TensorFlag.INPUT:
            moved = copy_tensor(inp, cpy)  # the caller may overwrite it as soon as we return
        elif _is_expert_input(state, split, inp, cpy):
            src_backend.synchronize()
            ids = _ids_source(state, split, input_id, state.graph.nodes[split.i_start].source(2))
            if cache.ids is not ids:  # one readback serves consecutive matmuls
                cache.ids, cache.used = ids, _used_experts(ids, inp.ne[2])
            runs = expert_runs(cache.used)
            moved = _copy_experts(inp, cpy, runs)
        else:
            src_backend.synchronize()
            moved = copy_tensor(inp, cpy)
        done.append(InputCopy(k, inp.name, src_backend.name, backend.name, moved, tuple(runs)))
    return done


def _run_with_callback(backend: Backend, nodes: Sequence[Tensor], callback: EvalCallback) -> bool:
    """Issue maximal runs of nodes the caller does not want to see, synchronize, and hand
    over the wanted node; False when the caller asks to stop."""
    j0 = 0
    while j0 < len(nodes):
        j1 = j0
        need = callback(nodes[j1], True)
        while not need and j1 < len(nodes) - 1:
            j1 += 1
            need = callback(nodes[j1], True)
        backend.compute(nodes[j0:j1 + 1])
        backend.synchronize()
        if need and not callback(nodes[j1], False):
            return False
        j0 = j1 + 1
    return True


def compute_splits(state: RunState) -> list[InputCopy]:
    """Run every split in order; returns what was copied."""
    copies: list[InputCopy] = []
    cache = _RouterIds()
    for k, split in enumerate(state.plan.splits):
        copies += _copy_inputs(state, k, split, cache)
        backend = state.backends[split.backend_id]
        nodes = state.graph.nodes[split.i_start:split.i_end]
        if state.callback is None:
            backend.compute(nodes)
        else:
            # a refusal stops this split only; later splits still run, as in ggml
            _run_with_callback(backend, nodes, state.callback)
    return copies
