"""--optimal: the MILP finds placements the greedy order misses, within the same budgets."""
from __future__ import annotations

import pytest
from helpers_sd import comp, gib, gpu, problem

from planner.core.errors import InfeasiblePlacement
from planner.sd.autofit import greedy_fit
from planner.sd.optimal import optimal_fit
from planner.sd.plan import specs
from planner.sd.roles import Kind
from planner.sd.sd_placement import Where
from planner.sd.traffic import traffic_bytes

D, T, V = Kind.DIFFUSION, Kind.TE, Kind.VAE


def test_greedy_offloads_while_optimal_keeps_everything_resident():
    # CUDA0 budget 12, CUDA1 budget 8, RAM budget 2 GiB. diffusion 9, te 5 (largest 0.5), vae 0.2.
    fit = problem([comp(D, 9), comp(T, 5, 0.5), comp(V, 0.2, 0.05)], [gpu("CUDA0", 12), gpu("CUDA1", 8)],
                  ram_budget_gib=2)
    greedy = {p.kind: p for p in greedy_fit(fit)}
    # Greedy computes everything on CUDA0 (largest budget). diffusion: 9 <= 12 - (2 + 0.5) -> resident.
    # te: 5 > 3 - 2 -> RAM? 5 > 2 -> other GPU CUDA1. vae: headroom 2 + 5 (te offloaded) > 3 -> RAM (0.2 <= 2).
    assert greedy[D].params is Where.RESIDENT
    assert (greedy[T].params, greedy[T].params_device) == (Where.OTHER_GPU, "CUDA1")
    assert greedy[V].params is Where.CPU
    best = {p.kind: p for p in optimal_fit(fit, steps=20)}
    assert all(p.params is Where.RESIDENT for p in best.values())
    # te computes on CUDA1 (5 + 2 <= 8); diffusion and vae share CUDA0 (9 + 0.2 + 2 <= 12)
    assert best[D].compute == ("CUDA0",) and best[T].compute == ("CUDA1",)
    for name, budget in (("CUDA0", 12), ("CUDA1", 8)):
        stored = sum(p.params_bytes for p in best.values() if name in p.compute)
        reserve = max((p.reserve_bytes for p in best.values() if name in p.compute), default=0)
        assert stored + reserve <= gib(budget)
    assert traffic_bytes(fit, tuple(best.values())) == 0
    assert traffic_bytes(fit, tuple(greedy.values())) == gib(5) + gib(0.2)  # each copied once per image
    runtime, params = specs(tuple(best.values()), [], [])
    assert (runtime, params) == ("diffusion=CUDA0,te=CUDA1,vae=CUDA0", "")


def test_optimal_agrees_when_greedy_is_already_resident():
    fit = problem([comp(D, 4), comp(T, 2), comp(V, 0.2)], [gpu("CUDA0", 12)], ram_budget_gib=8)
    assert [(p.compute, p.params) for p in optimal_fit(fit, 20)] == [(("CUDA0",), Where.RESIDENT)] * 3


def test_optimal_prefers_ram_over_other_gpu_over_disk():
    # diffusion 10 on a single 8 GiB GPU: cannot be resident anywhere.
    ram = problem([comp(D, 10)], [gpu("CUDA0", 8), gpu("CUDA1", 11)], ram_budget_gib=32, compute={D: ("CUDA0",)})
    assert optimal_fit(ram, 20)[0].params is Where.CPU
    other = problem([comp(D, 10)], [gpu("CUDA0", 8), gpu("CUDA1", 11)], ram_budget_gib=4, compute={D: ("CUDA0",)})
    assert (optimal_fit(other, 20)[0].params, optimal_fit(other, 20)[0].params_device) == (Where.OTHER_GPU, "CUDA1")
    disk = problem([comp(D, 10)], [gpu("CUDA0", 8), gpu("CUDA1", 9)], ram_budget_gib=4, compute={D: ("CUDA0",)})
    assert optimal_fit(disk, 20)[0].params is Where.DISK


def test_optimal_keeps_explicit_compute():
    fit = problem([comp(D, 4), comp(T, 2)], [gpu("CUDA0", 7), gpu("CUDA1", 24)], ram_budget_gib=32,
                  compute={D: ("CUDA0",), T: ()})
    got = {p.kind: p for p in optimal_fit(fit, 20)}
    assert got[D].compute == ("CUDA0",) and got[D].params is Where.RESIDENT
    assert got[T].compute == () and got[T].params is Where.CPU


def test_optimal_raises_when_nothing_fits_the_model():
    # A 6 GiB compute reserve cannot be met: diffusion on CUDA0 with budget 1 GiB, even streaming.
    fit = problem([comp(D, 4)], [gpu("CUDA0", 1)], ram_budget_gib=32, compute={D: ("CUDA0",)})
    with pytest.raises(InfeasiblePlacement):
        optimal_fit(fit, 20)


def test_optimal_uses_the_integrated_gpu_like_auto_fit():
    fit = problem([comp(D, 4)], [gpu("Vulkan0", 60, discrete=False)], ram_budget_gib=64)
    (p,) = optimal_fit(fit, 20)
    assert (p.compute, p.params) == (("Vulkan0",), Where.RESIDENT)
