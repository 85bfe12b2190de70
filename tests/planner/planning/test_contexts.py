"""The training context as the ceiling: --ctx max stops at it unless allowed (then the header's RoPE
scaling factor sets the ceiling and its keys are reported); an explicit -c above it is planned with a
warning; --explain says where the context came from."""
from __future__ import annotations

import logging

import pytest
from gguf import Keys

from planner.cli import main
from planner.core.units import GiB
from planner.hardware.inventory import Backend, DeviceKind, DeviceSpec, HostSpec, Inventory
from planner.llama.context import model_context
from planner.planning.contexts import max_context, rope_scaling
from planner.planning.result import PlanRequest
from planner.planning.search import plan
from planner.synth.gguf_factory import llama_spec

TRAIN = 4096
HOST = HostSpec(64 * GiB, 60 * GiB, int(60e9), "test host", int(1e12))
BIG = Inventory((DeviceSpec("CUDA0", DeviceKind.GPU, Backend.CUDA, 24 * GiB, 24 * GiB, int(900e9), int(50e12),
                            int(25e9)),), HOST)


def _model(tmp_path, scaled: bool) -> str:
    spec = llama_spec(n_layer=4, n_embd=256, n_head=4, n_head_kv=2, n_ff=512, n_vocab=1000)
    spec.metadata[Keys.LLM.CONTEXT_LENGTH] = TRAIN
    if scaled:   # a YaRN extension, as published models carry it
        spec.metadata[Keys.Rope.SCALING_TYPE] = "yarn"
        spec.metadata[Keys.Rope.SCALING_FACTOR] = 2.0
        spec.metadata[Keys.Rope.SCALING_ORIG_CTX_LEN] = TRAIN
    [path] = spec.write(tmp_path / f"llama-{'yarn' if scaled else 'plain'}.gguf")
    return str(path)


@pytest.fixture
def plain(tmp_path):
    return model_context(_model(tmp_path, scaled=False))


@pytest.fixture
def yarn(tmp_path):
    return model_context(_model(tmp_path, scaled=True))


def test_ctx_max_stops_at_the_training_context(plain):
    result = plan(plain, BIG, PlanRequest(max_ctx=True), with_explain=True)
    assert result.n_ctx == TRAIN   # 24 GiB would hold far more
    assert any(line.startswith(f"context {TRAIN}: the largest that fits (--ctx max, at most {TRAIN}")
               for line in result.explain)


def test_allowed_above_train_the_rope_factor_sets_the_ceiling_and_its_keys_are_reported(yarn, caplog):
    assert rope_scaling(yarn) == {"llama.rope.scaling.factor": 2.0, "llama.rope.scaling.original_context_length": TRAIN,
                                  "llama.rope.scaling.type": "yarn"}
    request = PlanRequest(max_ctx=True, allow_ctx_above_train=True)
    assert max_context(yarn, request) == 2 * TRAIN
    with caplog.at_level(logging.WARNING):
        result = plan(yarn, BIG, request, with_explain=True)
    assert result.n_ctx == 2 * TRAIN
    [warning] = [r.getMessage() for r in caplog.records if "training context" in r.getMessage()]
    assert f"context {2 * TRAIN} is above the model's training context {TRAIN}" in warning
    assert "llama.rope.scaling.type=yarn" in warning and "llama.rope.scaling.factor=2.0" in warning
    assert any("--allow-ctx-above-train" in line for line in result.explain)


def test_without_scaling_keys_the_allowed_ceiling_is_a_stated_policy(plain):
    assert max_context(plain, PlanRequest(max_ctx=True, allow_ctx_above_train=True)) == 4 * TRAIN


def test_an_explicit_ctx_above_train_is_planned_with_a_warning(tmp_path, capsys, caplog):
    path = _model(tmp_path, scaled=False)
    argv = ["plan", path, "--device", "CUDA0=24GiB", "--ram", "64GiB", "--ctx", str(4 * TRAIN), "--explain"]
    with caplog.at_level(logging.WARNING):   # on stderr as "fitplan: ..." outside pytest
        assert main(argv) == 0
    out, _ = capsys.readouterr()
    assert f"context {4 * TRAIN}, 1 slot(s)" in out
    [warning] = [r.getMessage() for r in caplog.records if "training context" in r.getMessage()]
    assert f"context {4 * TRAIN} is above the model's training context {TRAIN}: llama.cpp runs it" in warning
    assert "the header has no RoPE-scaling keys" in warning
    assert f"context {4 * TRAIN}: given (-c {4 * TRAIN}); context {4 * TRAIN} is above" in out


def test_explain_names_the_training_context_as_the_default(plain):
    result = plan(plain, BIG, PlanRequest(), with_explain=True)
    assert f"context {TRAIN}: the model's training context (llama.context_length)" in result.explain
    given = plan(plain, BIG, PlanRequest(n_ctx=1024), with_explain=True)
    assert "context 1024: given (-c 1024)" in given.explain
