"""The training context as the ceiling: --ctx max stops at it unless allowed (then the header's RoPE
scaling factor sets the ceiling and its keys are reported); an explicit -c above it is planned with a
warning, once, when each sequence's context (llama.cpp's n_ctx_seq) passes it; --explain says where the
context came from."""
from __future__ import annotations

import logging

import pytest
from gguf import Keys

from planner.cli import main
from planner.core.units import GiB
from planner.hardware.budgets import resolve_budgets
from planner.hardware.inventory import Backend, DeviceKind, DeviceSpec, HostSpec, Inventory
from planner.llama.context import model_context
from planner.search.contexts import max_context, rope_scaling
from planner.search.result import PlanRequest
from planner.search.search import plan
from planner.search.verdict import verdict
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


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "training context" in r.getMessage()]


@pytest.mark.parametrize("n_ctx, n_parallel, said", [
    (4 * TRAIN, 4, None),               # four slots of TRAIN each: llama.cpp's n_ctx_seq is TRAIN, no warning
    (8 * TRAIN, 4, f"context {2 * TRAIN} per sequence (-c {8 * TRAIN} over -np 4) is above"),
    (2 * TRAIN, 1, f"context {2 * TRAIN} is above"),
])
def test_the_warning_compares_each_sequences_context(plain, caplog, n_ctx, n_parallel, said):
    """src/llama-context.cpp warns when n_ctx_seq = n_ctx / n_seq (without a unified cache) passes
    n_ctx_train, not the total of every sequence's cells."""
    with caplog.at_level(logging.WARNING):
        plan(plain, BIG, PlanRequest(n_ctx=n_ctx, n_parallel=n_parallel))
    assert [said in w for w in _warnings(caplog)] == ([] if said is None else [True])


TWO = Inventory(BIG.devices + (DeviceSpec("CUDA1", DeviceKind.GPU, Backend.CUDA, 24 * GiB, 24 * GiB, int(900e9),
                                          int(50e12), int(25e9)),), HOST)


@pytest.mark.parametrize("n_ctx, warned", [(None, False), (2 * TRAIN, True)])
def test_a_verdict_warns_once_about_each_clients_context(plain, caplog, n_ctx, warned):
    """--verdict --clients 4 plans every arrangement (several plans with 1, 2 and 4 slots); each client's context
    is what llama.cpp compares, and the warning is said once, not once per plan."""
    with caplog.at_level(logging.WARNING):
        verdict(plain, TWO, resolve_budgets(TWO, None, None), PlanRequest(n_ctx=n_ctx), n_clients=4)
    assert _warnings(caplog) == ([f"context {2 * TRAIN} is above the model's training context {TRAIN}: llama.cpp "
                                  f"runs it, but what the model makes of positions past {TRAIN} depends on its "
                                  f"RoPE scaling (the header has no RoPE-scaling keys)"] if warned else [])


def test_ctx_max_gives_each_slot_the_training_context(plain, caplog):
    """-c is shared by the -np slots, so --ctx max -np 4 stops at 4 x n_ctx_train (each slot's n_ctx_seq at
    the training context), not at n_ctx_train split four ways; and it warns about nothing."""
    with caplog.at_level(logging.WARNING):
        result = plan(plain, BIG, PlanRequest(max_ctx=True, n_parallel=4), with_explain=True)
    assert result.n_ctx == 4 * TRAIN and _warnings(caplog) == []
    assert (f"context {4 * TRAIN}: the largest that fits (--ctx max, at most {4 * TRAIN}: the training context "
            f"{TRAIN} for each of 4 slots)") in result.explain
