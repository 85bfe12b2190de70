"""The scheduler sees a meta device as one backend (seed 000: llama.cpp hands ggml_backend_sched_new
[Meta(CUDA0,CUDA1), CPU], two backends): its splits and copies work unchanged, and the result of
a tensor-parallel MLP equals the CPU's. Expected values come from numpy on the same weights."""
from __future__ import annotations

import numpy as np
import pytest

from runtime.ggml import build as B
from runtime.ggml.backend import BufferType, alloc_tensors, make_cpu, make_virtual
from runtime.ggml.graph import BufferUsage, GGMLType, Graph, Tensor
from runtime.ggml.meta import MIRRORED, SplitAxis, SplitState, split_along
from runtime.ggml.meta_device import MetaBackend, MetaDevice
from runtime.ggml.sched import Scheduler

F32 = GGMLType.F32
E, FF, T, V = 8, 16, 5, 12
A0, A1 = SplitAxis.AXIS_0, SplitAxis.AXIS_1


def _weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"up": rng.standard_normal((FF, E)).astype(np.float32) / 3,     # numpy order: [ne1, ne0]
            "down": rng.standard_normal((E, FF)).astype(np.float32) / 4,
            "norm": (1 + 0.1 * rng.standard_normal(E)).astype(np.float32),
            "out": rng.standard_normal((V, E)).astype(np.float32) / 3}


def _graph(values: dict[str, np.ndarray], buft: BufferType) -> tuple[Graph, dict[str, Tensor], Tensor]:
    """x -> up (column-parallel) -> silu -> down (row-parallel) -> + x -> rms_norm * g -> out."""
    w = {"up": B.new_tensor(F32, [E, FF], "up"), "down": B.new_tensor(F32, [FF, E], "down"),
         "norm": B.new_tensor(F32, [E], "norm"), "out": B.new_tensor(F32, [E, V], "out")}
    alloc_tensors(buft, list(w.values()), BufferUsage.WEIGHTS)
    for name, t in w.items():
        t.set_data(values[name])
    x = B.new_input(F32, [E, T], "x")
    h = B.silu(B.mul_mat(w["up"], x, "h"), "a")
    r = B.add(B.mul_mat(w["down"], h, "o"), x, "r")
    y = B.mul(B.rms_norm(r, 1e-6, "n"), w["norm"], "y")
    out = B.mul_mat(w["out"], y, "logits")
    return Graph.build(out), w, x


# by member count; over 3, FF's 16 columns as 8 + 8 + 0: the third member computes nothing of the MLP
STATES = {2: {"up": split_along(A1, (8, 8)), "down": split_along(A0, (8, 8)), "out": split_along(A1, (8, 4))},
          3: {"up": split_along(A1, (8, 8, 0)), "down": split_along(A0, (8, 8, 0)), "out": split_along(A1, (4, 4, 4))}}


def _static(n: int):
    def state(t: Tensor) -> SplitState:
        return STATES[n].get(t.name, MIRRORED)
    return state


def _expected(values: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    # numpy order [T, E]: rows are tokens
    h = x @ values["up"].T
    a = h / (1 + np.exp(-h))
    r = a @ values["down"].T + x
    y = r / np.sqrt((r * r).mean(-1, keepdims=True) + 1e-6) * values["norm"]
    return y @ values["out"].T


@pytest.mark.parametrize("n", [2, 3])
def test_the_scheduler_runs_a_meta_backend_like_any_other(n):
    rng = np.random.default_rng(1)
    values, xv = _weights(rng), rng.standard_normal((T, E)).astype(np.float32)
    members = [make_virtual(f"GPU{j}", 1 << 24) for j in range(n)]
    meta = MetaBackend(MetaDevice(members), _static(n))
    cpu = make_cpu()
    graph, _, x = _graph(values, meta.buffer_type)
    sched = Scheduler([meta, cpu])
    sched.compute(graph, {x: xv})
    assert [b.name for b in sched.backends] == ["Meta(" + ",".join(f"GPU{j}" for j in range(n)) + ")", "CPU"]
    # one split on the meta backend: x is copied in, everything else reads its weights
    assert [(sched.backends[s.backend_id].name, [i.name for i in s.inputs]) for s in sched.splits] == \
        [(meta.name, ["x"])]
    got = graph.nodes[-1].get_data()
    np.testing.assert_allclose(got, _expected(values, xv), rtol=1e-5, atol=1e-5)
    # the down projection was reduced once, over every member; an empty third member skipped h, a, o
    assert meta.last_run is not None and len(meta.last_run.reduces) == 1
    names = [t.name for t in graph.nodes]
    skipped = [{names[k] for k in s} for s in meta.last_run.cut.skipped]
    assert skipped == ([set(), set()] if n == 2 else [set(), set(), {"h", "a", "o"}])


def test_the_meta_device_combines_its_members_buffer_types():
    small = make_virtual("GPU0", 1 << 20, alignment=64, max_alloc=1 << 16)
    big = make_virtual("GPU1", 1 << 21, alignment=256)
    dev = MetaDevice([small, big])
    assert (dev.buffer_type.alignment, dev.buffer_type.max_size, dev.buffer_type.is_host) == (256, 1 << 16, False)
    assert dev.memory().total == 3 << 20
