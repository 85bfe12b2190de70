"""The runtime's `-sm tensor` against llama.cpp's on two loopback rpc-servers (issue #20, must-show 2).

A llama-architecture GGUF with random F32 weights (planner/synth/tiny_models.py; F32 so that neither
side quantizes activations for its matmuls) is continued greedily by llama-server under
`-sm tensor -dev RPC0,RPC1 -ngl 99` for 32 tokens with the top-5 logprobs of every step; the runtime,
under the same flags (its Meta() backend over two members), is teacher-forced on that continuation
the way llama-server batched it (the prompt as one batch, then one token at a time). At each of the
32 positions, its logprob of each of llama.cpp's top-5 tokens must be within 0.01 of llama.cpp's,
and its top-1 must be llama.cpp's unless llama.cpp's first two are within that tolerance.

(Gemma 3 is not used: llama.cpp's token generation aborts under -sm tensor, issue #20.)
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from planner.llama.flags import parse_llama_flags
from planner.running.tool_runs import TokenProbs, llama_server
from planner.synth.tiny_models import Dims, write_tiny
from runtime.engine.runner import ModelRunner

pytestmark = pytest.mark.peer

N_PREDICT = 32
N_PROBS = 5
TOLERANCE = 0.01
PROMPT = [1, 5, 9, 33, 7, 100, 42, 200]
DIMS = Dims(n_ff=256)   # two 128-element FFN slices: both members hold a share of every matrix


def _flags(endpoints: list[str]) -> list[str]:
    return ["-c", "256", "-sm", "tensor", "--rpc", ",".join(endpoints), "-dev", "RPC0,RPC1", "-ngl", "99"]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny(tmp_path_factory.mktemp("tp") / "llama-tp.gguf", "llama", DIMS, seed=3, all_f32=True)


@pytest.fixture(scope="module")
def llama_steps(model: Path, llama_tools: Path, rpc_endpoints: list[str]) -> tuple[list[TokenProbs], str]:
    with llama_server(llama_tools, str(model), _flags(rpc_endpoints)) as server:
        steps = server.greedy(PROMPT, N_PREDICT, n_probs=N_PROBS)
        return steps, server.log_text()


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64) - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def _forced(runner: ModelRunner, steps: list[TokenProbs]) -> np.ndarray:
    rows = [_log_softmax(runner.decode(PROMPT, all_logits=False))[-1]]
    for step in steps[:-1]:
        rows.append(_log_softmax(runner.decode([step.token], all_logits=False))[-1])
    return np.array(rows)


def test_llama_cpp_ran_a_meta_device_over_both_servers(llama_steps) -> None:
    _, log = llama_steps
    assert "creating a Meta device with 2 devices" in log, log[-2000:]   # llama_prepare_model_devices
    assert "Meta() model buffer size" in log


def test_top5_logprobs_within_0_01_of_llama_cpp_over_32_positions(model: Path, llama_steps,
                                                                  rpc_endpoints: list[str]) -> None:
    steps, _ = llama_steps
    assert len(steps) == N_PREDICT and all(len(s.top) == N_PROBS for s in steps)
    runner = ModelRunner.load(str(model), parse_llama_flags(_flags(rpc_endpoints)), n_outputs_max=1)
    assert [b.name for b in runner.sched.backends] == ["Meta()", "CPU"]
    ours = _forced(runner, steps)
    gaps = np.array([[ours[k][tok] - lp for tok, lp in step.top] for k, step in enumerate(steps)])
    assert np.abs(gaps).max() <= TOLERANCE, np.abs(gaps).max()
    for k, step in enumerate(steps):
        tie = step.top[0][1] - step.top[1][1] < TOLERANCE
        assert tie or int(np.argmax(ours[k])) == step.token, k
    # the runtime's meta backend reduced twice per layer at every generated token
    reduces = runner.steps[-1].reduces
    assert reduces is not None and reduces.n_reduces == 2 * DIMS.n_layer
