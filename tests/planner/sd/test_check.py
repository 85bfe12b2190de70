"""Budget checks of a finished placement: seed 002's runtime scratch margin and CPU compute in RAM."""
from __future__ import annotations

from planner.core.units import GiB, MiB
from planner.sd.autofit import follow_assignments
from planner.sd.check import overcommit, runtime_cap
from planner.sd.components import Component
from planner.sd.roles import Kind
from planner.sd.sd_placement import FitInput, GpuBudget


def fit_of(gpu: GpuBudget, compute_on_gpu: bool = True, ram: int | None = None) -> FitInput:
    # 3 GiB of diffusion weights, its compute buffer 1 GiB (a figure from sd-cli's corpus)
    comps = (Component(Kind.DIFFUSION, 3 * GiB, 64 * MiB, compute_bytes=1 * GiB),)
    where = (gpu.name,) if compute_on_gpu else ()
    return FitInput(comps, (gpu,), ram, ram, ((Kind.DIFFUSION, where), (Kind.TE, None), (Kind.VAE, None)))


def test_explicit_budget_still_leaves_the_scratch_margin():
    # --max-vram cuda0=5 on a card with 4.25 GiB free: the budget is min(5, 4.25) = 4.25 GiB, but the
    # runtime keeps 512 MiB of free memory for scratch: 3.75 GiB for 3 GiB + 1 GiB -> over
    gpu = GpuBudget("CUDA0", free_bytes=4 * GiB + 256 * MiB, budget_bytes=4 * GiB + 256 * MiB)
    assert runtime_cap(gpu) == 3 * GiB + 768 * MiB
    fit = fit_of(gpu)
    warnings = overcommit(fit, follow_assignments(fit, {}))
    assert warnings == ("CUDA0 needs 4096 MiB (weights 3072 + compute 1024) but its budget is 3840 MiB "
                        "(free 4352 MiB less 512 MiB of scratch)",)
    roomy = GpuBudget("CUDA0", free_bytes=5 * GiB, budget_bytes=4 * GiB + 512 * MiB)
    assert runtime_cap(roomy) == roomy.budget_bytes
    assert overcommit(fit_of(roomy), follow_assignments(fit_of(roomy), {})) == ()


def test_cpu_compute_counts_in_ram():
    # computing on the CPU: weights 3 GiB + compute 1 GiB in a 3.5 GiB RAM budget
    gpu = GpuBudget("CUDA0", free_bytes=8 * GiB, budget_bytes=8 * GiB - 512 * MiB)
    fit = fit_of(gpu, compute_on_gpu=False, ram=3 * GiB + 512 * MiB)
    assert overcommit(fit, follow_assignments(fit, {})) == (
        "RAM holds 3072 MiB of weights + 1024 MiB of compute but its params budget is 3584 MiB",)
