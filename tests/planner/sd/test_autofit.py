"""Auto-fit's greedy order (seed 002, "Automatic placement"); every figure derived in the test."""
from __future__ import annotations

from helpers_sd import comp, gib, gpu, problem

from planner.core.units import GiB
from planner.sd.autofit import follow_assignments, greedy_fit, main_gpu
from planner.sd.roles import Kind
from planner.sd.sd_placement import Where, ram_budget

D, T, V = Kind.DIFFUSION, Kind.TE, Kind.VAE


def where(placements):
    return {p.kind: (p.compute, p.params, p.params_device) for p in placements}


def test_everything_resident_on_the_gpu_with_the_largest_budget():
    fit = problem([comp(D, 10), comp(T, 5, 0.5), comp(V, 0.2)], [gpu("CUDA0", 12), gpu("CUDA1", 20)])
    # diffusion: headroom max(2, 2+0.5, 1+0.01) = 2.5; 10 <= 20-2.5. te: 5 <= 10-2. vae: 0.2 <= 5-2.
    assert where(greedy_fit(fit)) == {k: (("CUDA1",), Where.RESIDENT, None) for k in (D, T, V)}


def test_main_gpu_first_on_a_tie_and_ignores_integrated_and_empty():
    assert main_gpu(problem([comp(D, 1)], [gpu("CUDA0", 12), gpu("CUDA1", 12)])) == "CUDA0"
    assert main_gpu(problem([comp(D, 1)], [gpu("Vulkan0", 30, discrete=False), gpu("CUDA0", 4)])) == "CUDA0"
    assert main_gpu(problem([comp(D, 1)], [gpu("CUDA0", 0)])) is None


def test_order_is_diffusion_then_te_then_vae():
    # The component listed last in the input still gets the GPU first if it is the diffusion model.
    fit = problem([comp(V, 0.5), comp(T, 4), comp(D, 9)], [gpu("CUDA0", 12)], ram_budget_gib=100)
    got = greedy_fit(fit)
    assert [p.kind for p in got] == [D, T, V]
    # diffusion 9 <= 12-2; then te needs 4 <= 3-2: no -> RAM; vae: headroom max(2, 2+4, 1) = 6 > 3 -> RAM
    assert [p.params for p in got] == [Where.RESIDENT, Where.CPU, Where.CPU]


def test_ram_budget_keeps_the_larger_of_2gib_or_10_percent():
    assert ram_budget(16 * GiB) == 14 * GiB            # 10% = 1.6 GiB < 2 GiB
    assert ram_budget(40 * GiB) == 36 * GiB            # 10% = 4 GiB
    assert ram_budget(1 * GiB) == 0
    assert ram_budget(None) is None


def test_staging_room_for_lower_priority_offloaded_components():
    # budget 10; te's largest tensor 0.6 -> diffusion headroom = 2 + 0.6 = 2.6 > 10 - 7.5: diffusion
    # goes to RAM although 7.5 + 2 would fit alone.
    fit = problem([comp(D, 7.5), comp(T, 0.7, 0.6), comp(V, 0.1, 0.05)], [gpu("CUDA0", 10)], ram_budget_gib=64)
    got = where(greedy_fit(fit))
    assert got[D][1] is Where.CPU
    # te: higher-priority offloaded diffusion keeps its full weights + reserve: 2 + 7.5 = 9.5 -> 0.7 > 0.5 -> RAM
    assert got[T][1] is Where.CPU
    # vae: headroom max(9.5, 2 + 0.7 (te offloaded, higher priority), 1) = 9.5; 0.1 <= 0.5 -> resident
    assert got[V][1] is Where.RESIDENT


def test_offloaded_diffusion_filling_the_gpu_pushes_te_and_vae_off_too():
    fit = problem([comp(D, 12), comp(T, 1), comp(V, 0.1)], [gpu("CUDA0", 10)], ram_budget_gib=64)
    assert [p.params for p in greedy_fit(fit)] == [Where.CPU] * 3


def test_other_gpu_with_the_largest_remaining_budget():
    # No RAM figure: RAM residency skipped (seed 002). Compute on CUDA2 (budget 16).
    fit = problem([comp(D, 15), comp(T, 4), comp(V, 0.1)], [gpu("CUDA0", 6), gpu("CUDA1", 8), gpu("CUDA2", 16)])
    got = where(greedy_fit(fit))
    # diffusion 15 > 16 - 2.01 -> not resident; RAM unknown; other GPUs: neither 6 nor 8 holds 15 -> disk
    assert got[D] == (("CUDA2",), Where.DISK, None)
    # te: headroom on CUDA2 = 2 + 15 (offloaded diffusion) > 16 -> other GPU: CUDA1 (8 left) over CUDA0 (6)
    assert got[T] == (("CUDA2",), Where.OTHER_GPU, "CUDA1")
    # vae: CUDA2 headroom 17 -> other GPU: CUDA0 has 6 left, CUDA1 8 - 4 = 4 -> CUDA0
    assert got[V] == (("CUDA2",), Where.OTHER_GPU, "CUDA0")


def test_disk_when_nothing_has_room():
    fit = problem([comp(D, 20)], [gpu("CUDA0", 8)], ram_budget_gib=4)
    assert where(greedy_fit(fit))[D] == (("CUDA0",), Where.DISK, None)


def test_cpu_module_reserves_no_gpu_space():
    comps = [comp(D, 7.9), comp(T, 3, 0.6), comp(V, 0.1, 0.05)]
    on_gpu = where(greedy_fit(problem(comps, [gpu("CUDA0", 10)], ram_budget_gib=64)))
    te_cpu = where(greedy_fit(problem(comps, [gpu("CUDA0", 10)], ram_budget_gib=64, compute={T: ()})))
    # te on the GPU: diffusion headroom 2 + 0.6 > 10 - 7.9 -> RAM. te on the CPU: headroom 2 -> resident.
    assert on_gpu[D][1] is Where.CPU
    assert te_cpu[D] == (("CUDA0",), Where.RESIDENT, None)
    assert te_cpu[T] == ((), Where.CPU, None)


def test_cpu_module_uses_ram_or_disk_never_a_gpu():
    fit = problem([comp(D, 1), comp(T, 9)], [gpu("CUDA0", 4), gpu("CUDA1", 30)], ram_budget_gib=8, compute={T: ()})
    assert where(greedy_fit(fit))[T] == ((), Where.DISK, None)


def test_explicit_backend_assignments_are_kept():
    # seed 002: --backend diffusion=cuda0,te=cpu,vae=cuda1 (with auto-fit on)
    fit = problem([comp(D, 4), comp(T, 2), comp(V, 0.2)], [gpu("CUDA0", 10), gpu("CUDA1", 20)], ram_budget_gib=64,
                  compute={D: ("CUDA0",), T: (), V: ("CUDA1",)})
    got = where(greedy_fit(fit))
    assert got == {D: (("CUDA0",), Where.RESIDENT, None), T: ((), Where.CPU, None),
                   V: (("CUDA1",), Where.RESIDENT, None)}


def test_backend_cuda0_for_every_module_overrides_the_larger_gpu():
    # seed 002: --backend cuda0 (auto-fit on): compute stays on CUDA0 though CUDA1 is larger
    fit = problem([comp(D, 4), comp(T, 2), comp(V, 0.2)], [gpu("CUDA0", 10), gpu("CUDA1", 20)], ram_budget_gib=64,
                  compute={D: ("CUDA0",), T: ("CUDA0",), V: ("CUDA0",)})
    assert {p.compute for p in greedy_fit(fit)} == {("CUDA0",)}


def test_device_list_counts_full_size_on_each_gpu():
    # diffusion=CUDA0&CUDA1, 9 GiB: resident needs 9 + 2.01 on each listed GPU (seed 002: conservative).
    fits = problem([comp(D, 9)], [gpu("CUDA0", 11.5), gpu("CUDA1", 11.5)], ram_budget_gib=64,
                   compute={D: ("CUDA0", "CUDA1")})
    short = problem([comp(D, 9)], [gpu("CUDA0", 11.5), gpu("CUDA1", 10.5)], ram_budget_gib=64,
                    compute={D: ("CUDA0", "CUDA1")})
    assert greedy_fit(fits)[0].params is Where.RESIDENT
    assert greedy_fit(short)[0].params is Where.CPU  # 9 > 10.5 - 2 on CUDA1, though 18 fit in sum


def test_storage_on_another_modules_gpu_leaves_room_for_its_work():
    # vae computes on CUDA1 (budget 5); te (4 GiB, compute CUDA0 full) may be stored on CUDA1 only
    # if 4 <= 5 - (1 GiB vae reserve + vae staging 0.2) = 3.8: no -> disk.
    fit = problem([comp(D, 7.5), comp(T, 4), comp(V, 0.5, 0.2)], [gpu("CUDA0", 10), gpu("CUDA1", 5)],
                  compute={V: ("CUDA1",)})
    got = where(greedy_fit(fit))
    assert got[D][1] is Where.RESIDENT
    assert got[T] == (("CUDA0",), Where.DISK, None)
    # without the vae there, te would go to CUDA1
    fit2 = problem([comp(D, 7.5), comp(T, 4)], [gpu("CUDA0", 10), gpu("CUDA1", 5)])
    assert where(greedy_fit(fit2))[T] == (("CUDA0",), Where.OTHER_GPU, "CUDA1")


def test_no_gpu_budget_means_cpu_compute():
    fit = problem([comp(D, 2), comp(V, 0.1)], [gpu("CUDA0", 0)], ram_budget_gib=1)
    got = where(greedy_fit(fit))
    assert got[D] == ((), Where.DISK, None)       # 2 GiB > 1 GiB RAM budget
    assert got[V] == ((), Where.CPU, None)


def test_auto_fit_off_follows_assignments_and_never_picks_disk():
    # seed 002: --auto-fit off: parameters on the runtime backend, even if they do not fit
    fit = problem([comp(D, 30), comp(T, 5)], [gpu("CUDA0", 8), gpu("CUDA1", 24)], ram_budget_gib=1)
    got = where(follow_assignments(fit, {}))
    assert got == {D: (("CUDA0",), Where.RESIDENT, None), T: (("CUDA0",), Where.RESIDENT, None)}


def test_params_backend_cpu_and_disk_when_auto_fit_is_disabled():
    # seed 002: --backend cuda0 --params-backend cpu / disk; te=cpu,vae=cpu
    fit = problem([comp(D, 3), comp(T, 1), comp(V, 0.1)], [gpu("CUDA0", 8)],
                  compute={D: ("CUDA0",), T: ("CUDA0",), V: ("CUDA0",)})
    cpu = follow_assignments(fit, {k: (Where.CPU, None) for k in (D, T, V)})
    assert [p.params for p in cpu] == [Where.CPU] * 3
    disk = follow_assignments(fit, {k: (Where.DISK, None) for k in (D, T, V)})
    assert [p.params_name for p in disk] == ["disk"] * 3
    mixed = follow_assignments(fit, {T: (Where.CPU, None), V: (Where.CPU, None)})
    assert [p.params for p in mixed] == [Where.RESIDENT, Where.CPU, Where.CPU]


def test_params_on_the_compute_gpu_is_resident():
    # seed 002: --backend diffusion=cuda0,te=cpu,vae=cpu --params-backend diffusion=cuda0,te=cpu,vae=cpu
    fit = problem([comp(D, 3), comp(T, 1), comp(V, 0.1)], [gpu("CUDA0", 8)], compute={D: ("CUDA0",), T: (), V: ()})
    got = follow_assignments(fit, {D: (Where.OTHER_GPU, "CUDA0"), T: (Where.CPU, None), V: (Where.CPU, None)})
    assert [(p.compute_name, p.params_name) for p in got] == [("CUDA0", "CUDA0"), ("cpu", "cpu"), ("cpu", "cpu")]
    assert got[0].params is Where.RESIDENT
    assert gib(3) == got[0].params_bytes


def test_only_an_integrated_gpu_means_the_default_backend():
    # backend_fit.cpp: no discrete GPU -> the default backend, which prefers an integrated GPU
    fit = problem([comp(D, 4), comp(V, 0.1)], [gpu("Vulkan0", 60, discrete=False)], ram_budget_gib=64)
    assert {p.compute for p in greedy_fit(fit)} == {("Vulkan0",)}
    assert {p.params for p in greedy_fit(fit)} == {Where.RESIDENT}


def test_no_gpus_at_all_means_cpu():
    fit = problem([comp(D, 4)], [], ram_budget_gib=64)
    assert where(greedy_fit(fit)) == {D: ((), Where.CPU, None)}
