"""A dry run's reserve against a real load's (ModelRunner.reserve(dry_run)).

llama.cpp pins each layer's opening norm to the layer's device while it builds a graph of fewer than
32 tokens or under full offload (llama-context.cpp graph_get_cb). llama-fit-params' no_alloc dry run
sizes the first prompt graph with ggml_backend_sched_reserve_size, which resets the scheduler before
splitting and so forgets those pins; a real load's ggml_backend_sched_reserve keeps them
(ggml-backend.cpp). Under full offload with pipeline parallelism (two RPC devices), the dry run's norm
opening the second device's first layer is computed on the first device and crosses as a second
hidden-row input next to the residual: GGML_SCHED_MAX_COPIES = 4 copies of an [n_embd, n_ubatch] f32
tensor that the allocator never frees (the copies are flagged input and output). Expected figures are
derived here from that rule; tests/peer/test_server_outputs_peer.py checks llama-server live.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from planner.llama.context import model_context
from planner.llama.flags import parse_llama_flags
from planner.llama.settings import resolve_settings
from planner.synth.tiny_models import Dims, write_tiny
from runtime.engine.runner import ModelRunner
from runtime.ggml.profiles import GGML_SCHED_MAX_COPIES

DIMS = Dims(n_layer=4)
RPC2 = ["--rpc", "127.0.0.1:50001,127.0.0.1:50002"]
F32 = 4


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return write_tiny(tmp_path_factory.mktemp("pins") / "llama4.gguf", "llama", DIMS)


def _compute(model: Path, argv: list[str], n_outputs_max: int | None, dry_run: bool) -> Mapping[str, int]:
    settings = resolve_settings(model_context(str(model)), parse_llama_flags(["-c", "256", *argv]))
    runner = ModelRunner(settings, {}, n_outputs_max)
    runner.load_weights(copy_data=False)
    runner.alloc_kv()
    return runner.reserve(dry_run).compute_bytes


@pytest.mark.parametrize(("n_ubatch", "n_outputs_max"), [(64, 1), (256, 1), (256, None)])
def test_dry_run_drops_the_norm_pins_a_real_load_keeps(model, n_ubatch, n_outputs_max):
    argv = [*RPC2, "-ngl", "99", "-ts", "1,1", "-b", str(n_ubatch), "-ub", str(n_ubatch)]
    dry = _compute(model, argv, n_outputs_max, dry_run=True)
    real = _compute(model, argv, n_outputs_max, dry_run=False)
    hidden_row = DIMS.n_embd * n_ubatch * F32
    assert dry["RPC1"] - real["RPC1"] == GGML_SCHED_MAX_COPIES * hidden_row
    assert dry["RPC0"] == real["RPC0"] and dry["CPU"] == real["CPU"]


@pytest.mark.parametrize("argv", [["-ngl", "0"], [*RPC2, "-ngl", "3", "-ts", "1,3"]])
def test_without_full_offload_a_prompt_graph_has_no_pins_to_drop(model, argv):
    """Partial offload and a prompt of 32 tokens or more: graph_get_cb pins nothing, so both agree."""
    argv = [*argv, "-b", "64", "-ub", "64"]
    assert _compute(model, argv, 1, dry_run=True) == _compute(model, argv, 1, dry_run=False)
