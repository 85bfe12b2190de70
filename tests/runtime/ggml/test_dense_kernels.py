"""Kernels the llama-like dense architectures add (runtime/ggml/kernels.py): ggml_sqr, ggml_xielu and
ggml_swiglu over one source, against values worked out from each op's definition in ggml."""
from __future__ import annotations

import math

import numpy as np

from runtime.ggml import build as B
from runtime.ggml.graph import GGMLType, Graph
from runtime.ggml.sched import Scheduler

F32 = GGMLType.F32


def _run(cpu, out, inputs):
    Scheduler([cpu]).compute(Graph.build(out), inputs=inputs)
    return out.get_data()


def test_relu_squared(cpu):
    x = B.new_input(F32, [3], "x")
    got = _run(cpu, B.sqr(B.unary(x, "RELU")), {x: [-2.0, 0.5, 3.0]})
    np.testing.assert_allclose(got, [0.0, 0.25, 9.0])


def test_xielu_is_quadratic_above_zero_and_expm1_below(cpu):
    """op_xielu with ggml_xielu's params: alpha_p x^2 + beta x for x > 0, (expm1(min(x, eps)) - x) alpha_n
    + beta x otherwise (the caller passes the softplus'd alphas, as ggml_xielu stores them)."""
    x = B.new_input(F32, [3], "x")
    node = B.unary(x, "XIELU")
    node.op_params.update(alpha_n=1.5, alpha_p=0.5, beta=0.25, eps=-1e-6)
    got = _run(cpu, node, {x: [2.0, -1.0, 0.0]})
    want = [0.5 * 4 + 0.25 * 2, (math.expm1(-1.0) + 1.0) * 1.5 - 0.25, (math.expm1(-1e-6) - 0.0) * 1.5]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-9)


def test_swiglu_of_one_source_gates_its_second_half_with_its_first(cpu):
    x = B.new_input(F32, [4, 1], "x")
    got = _run(cpu, B.swiglu_halves(x), {x: np.array([[1.0, -1.0, 3.0, 2.0]], np.float32)})
    silu = [v / (1 + math.exp(-v)) for v in (1.0, -1.0)]
    np.testing.assert_allclose(got.reshape(-1), [silu[0] * 3.0, silu[1] * 2.0], rtol=1e-6)
