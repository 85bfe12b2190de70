"""`plan` resolves each candidate's flags once (issue 41).

The case is bench/bench_plan.py's: a 128-layer MoE over 8 rpc devices at 2 GiB each. A candidate is a set
of flags the search builds a setting for (context, cache type, -ub, op offload; planner/search/problem.py
make_setting), plus the `-sm tensor` option it weighs (planner/search/tensor_plan.py). Every resolution
goes through planner/llama/settings.py `resolve_unplaced` once (resolve_settings, resolve_on and
resolve_flags all do), so counting its calls counts resolutions; each placement the search tries on a
candidate (-ngl, -ts, -ot) is placed on that resolution (`placed`) and resolves nothing again.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from bench.bench_plan import DEVICE_BUDGET, N_DEVICES, rpc_inventory, write_moe_128
from planner.core.errors import FlagError
from planner.core.units import GiB, MiB
from planner.llama import settings
from planner.llama.context import model_context
from planner.llama.flags import LlamaFlags, OverrideArg, OverrideKind
from planner.llama.settings import placed, resolve_flags, resolve_settings
from planner.search import problem, search
from planner.search.result import PlanRequest

ENDPOINTS = [f"127.0.0.1:{50100 + i}" for i in range(N_DEVICES)]
INVENTORY = rpc_inventory(ENDPOINTS, 24 * GiB)
MAX_VRAM = ",".join(f"RPC{i}={DEVICE_BUDGET // MiB}MiB" for i in range(N_DEVICES))


@pytest.fixture(scope="module")
def moe_128(tmp_path_factory):
    return str(write_moe_128(tmp_path_factory.mktemp("bench_plan")))


def _counting(monkeypatch, module, name, record):
    """Wrap module.name so that each call's result (or arguments) is recorded by `record`."""
    real = getattr(module, name)

    def wrapped(*args, **kwargs):
        out = real(*args, **kwargs)
        record(args, out)
        return out

    monkeypatch.setattr(module, name, wrapped)


def test_plan_resolves_each_candidate_once(moe_128, monkeypatch):
    resolved: list[LlamaFlags] = []
    built: list[LlamaFlags] = []
    evaluated: list[tuple[int, object]] = []
    tensor: list[LlamaFlags] = []
    _counting(monkeypatch, settings, "resolve_unplaced", lambda a, out: resolved.append(a[1]))
    _counting(monkeypatch, search, "make_setting", lambda a, out: built.append(out.flags))
    _counting(monkeypatch, search, "_candidate", lambda a, out: evaluated.append((a[4], a[5])))
    _counting(monkeypatch, search, "tensor_option", lambda a, out: tensor.append(out.flags))
    # as a fresh `fitplan plan` process finds them
    monkeypatch.setattr(problem, "RESOLVED_CACHE", {})
    monkeypatch.setattr(problem, "PROBE_CACHE", {})

    result = search.plan(moe_128, INVENTORY, PlanRequest(n_ctx=8192), max_vram=MAX_VRAM)

    candidates = set(built) | set(tensor)
    assert result.flags.n_gpu_layers > 0   # a plan that uses the devices, as bench_plan prints it
    assert len(resolved) == len(set(resolved)), "a flag set was resolved twice"
    assert set(resolved) == candidates
    assert len(resolved) == len(candidates)
    # the search evaluates candidates more often than it resolves them: the exact pass reuses the
    # analytic pass's resolution, and variants that differ only in where the output matrix lives
    # (-ot, a placement) share one
    assert len(evaluated) > len(set(built))
    assert len(set(built)) == len({(n_ctx, replace(v, output_on_host=False)) for n_ctx, v in evaluated})


def _placements(ctx, flags: LlamaFlags) -> list[LlamaFlags]:
    n = ctx.facts.n_layer_all
    experts = OverrideArg(OverrideKind.OT, r"blk\.(0|1|2)\.ffn_(up|down|gate)_(ch|)exps=CPU")
    return [
        flags,
        replace(flags, n_gpu_layers=0),
        replace(flags, n_gpu_layers=n + 1),
        replace(flags, n_gpu_layers=40, tensor_split=(3.0, 5.0, 4.0, 4.0, 6.0, 6.0, 6.0, 6.0)),
        replace(flags, n_gpu_layers=n + 1, tensor_split=(1.0,) + (0.0,) * 7),
        replace(flags, n_gpu_layers=n + 1, override_args=(experts,)),
        replace(flags, n_gpu_layers=n + 1, override_args=(OverrideArg(OverrideKind.NCMOE, "8"),)),
    ]


@pytest.mark.parametrize("flash_attn", ["auto", "off"])
def test_placed_equals_a_full_resolution(moe_128, flash_attn):
    """Placing on a resolution gives the settings a resolution from scratch gives, whatever the placement."""
    ctx = model_context(moe_128)
    flags = LlamaFlags(n_ctx=8192, n_ubatch=256, flash_attn=flash_attn, rpc=tuple(ENDPOINTS))
    base = resolve_flags(ctx, flags, INVENTORY)
    for g in _placements(ctx, flags):
        assert placed(base, g) == resolve_settings(ctx, g, INVENTORY)


def test_placed_refuses_what_needs_resolving_again(moe_128):
    ctx = model_context(moe_128)
    flags = LlamaFlags(n_ctx=8192, rpc=tuple(ENDPOINTS))
    base = resolve_flags(ctx, flags, INVENTORY)
    with pytest.raises(ValueError, match="beyond -ngl, -ts and -ot"):
        placed(base, replace(flags, n_ctx=4096))


def test_placed_checks_each_placements_overrides(moe_128):
    """An -ot rule to a device the model leaves out aborts llama.cpp (planner/llama/expressible.py): a placement
    that adds one is refused as a full resolution refuses it."""
    ctx = model_context(moe_128)
    flags = LlamaFlags(n_ctx=8192, rpc=tuple(ENDPOINTS), devices=tuple(f"RPC{i}" for i in range(N_DEVICES - 1)))
    base = resolve_flags(ctx, flags, INVENTORY)
    rule = OverrideArg(OverrideKind.OT, rf"blk\.0\.ffn_down_exps=RPC0[{ENDPOINTS[-1]}]")
    bad = replace(flags, override_args=(rule,))
    with pytest.raises(FlagError) as full:
        resolve_settings(ctx, bad, INVENTORY)
    with pytest.raises(FlagError) as on_base:
        placed(base, bad)
    assert str(on_base.value) == str(full.value)
    assert "is not one of the model's devices" in str(full.value)
