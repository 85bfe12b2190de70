"""Backend names against an inventory (seed 002, "Backend names")."""
from __future__ import annotations

import pytest

from planner.core.errors import FlagError
from planner.core.units import GiB
from planner.hardware.inventory import Backend, DeviceKind, DeviceSpec, HostSpec, Inventory
from planner.sd.assign import MaxVram, Module, Role, parse_assignment
from planner.sd.resolve import canonical_max_vram, default_device, resolve_compute, resolve_name, resolve_params
from planner.sd.sd_placement import Where


def dev(name, backend, kind=DeviceKind.GPU):
    return DeviceSpec(name, kind, backend, 8 * GiB, 8 * GiB, 0, 0, 0)


INV = Inventory((dev("CUDA0", Backend.CUDA), dev("CUDA1", Backend.CUDA), dev("Vulkan0", Backend.VULKAN),
                 dev("MTL0", Backend.METAL)), HostSpec(32 * GiB, 32 * GiB, 0, ""))


@pytest.mark.parametrize("token,name", [
    ("cpu", "CPU"), ("CPU", "CPU"),
    ("cuda1", "CUDA1"), ("CUDA0", "CUDA0"),          # exact, case-insensitive
    ("vulk", "Vulkan0"), ("mt", "MTL0"),            # unique prefixes
    ("cuda", "CUDA0"), ("VULKAN", "Vulkan0"),       # registry name: its first device
    ("metal", "MTL0"),                               # sd.cpp maps metal to the MTL registry
    ("gpu", "CUDA0"),                                # the first GPU
])
def test_resolve_name(token, name):
    assert resolve_name(INV, token, "--backend") == name


@pytest.mark.parametrize("token", ["cu", "rocm0", "cuda5", "xyz"])
def test_unresolvable_names_are_refused_naming_the_token(token):
    with pytest.raises(FlagError, match=repr(token)):
        resolve_name(INV, token, "--backend")


def test_default_backend_prefers_gpu_then_igpu_then_cpu():
    host = HostSpec(GiB, GiB, 0, "")
    igpu = dev("Vulkan0", Backend.VULKAN, DeviceKind.IGPU)
    assert default_device(Inventory((igpu, dev("CUDA0", Backend.CUDA)), host)) == "CUDA0"
    assert default_device(Inventory((igpu,), host)) == "Vulkan0"
    assert default_device(Inventory((), host)) == "CPU"


def test_resolve_compute():
    a = parse_assignment("diffusion=cuda0&cuda1,te=cpu,vae=auto", Role.BACKEND)
    assert resolve_compute(INV, a, Module.DIFFUSION) == ("CUDA0", "CUDA1")
    assert resolve_compute(INV, a, Module.TE) == ()
    assert resolve_compute(INV, a, Module.VAE) is None        # auto: left to auto-fit
    assert resolve_compute(INV, a, Module.CONTROLNET) is None  # unassigned


@pytest.mark.parametrize("text,problem", [("diffusion=cuda0&cuda0", "twice"), ("diffusion=cuda0&cpu", "CPU")])
def test_bad_device_lists(text, problem):
    with pytest.raises(FlagError, match=problem):
        resolve_compute(INV, parse_assignment(text, Role.BACKEND), Module.DIFFUSION)


def test_resolve_params():
    a = parse_assignment("te=cpu,vae=disk,diffusion=cuda1,controlnet=auto", Role.PARAMS)
    assert resolve_params(INV, a, Module.TE) == (Where.CPU, None)
    assert resolve_params(INV, a, Module.VAE) == (Where.DISK, None)
    assert resolve_params(INV, a, Module.DIFFUSION) == (Where.OTHER_GPU, "CUDA1")
    assert resolve_params(INV, a, Module.CLIP_VISION) is None  # unset: follows the runtime backend
    # a non-empty default token is the default backend, not "follow the runtime"
    assert resolve_params(INV, a, Module.CONTROLNET) == (Where.OTHER_GPU, "CUDA0")


def test_canonical_max_vram():
    mv = MaxVram(default_gib=4.0, devices=(("cuda1", 6.0), ("vulk", 0.0), ("cpu", 3.0)))
    # keys resolved; 0 = unset (free - 512 MiB) written as -0.5; a CPU key budgets nothing
    assert canonical_max_vram(INV, mv) == "4.0,CUDA1=6.0,Vulkan0=-0.5"
    assert canonical_max_vram(INV, MaxVram()) is None
    with pytest.raises(FlagError, match="unknown backend 'rocm0'"):
        canonical_max_vram(INV, MaxVram(devices=(("rocm0", 2.0),)))
