"""Budgets with stable-diffusion.cpp's --max-vram semantics (seed 002) and device-name resolution.

Every expected budget is worked out here from the rule it tests.
"""
from __future__ import annotations

import pytest

from planner.core.errors import InventoryError
from planner.hardware.budgets import fit_target_flag, fit_target_margins, resolve_budgets, resolve_device
from planner.hardware.inventory import Backend, DeviceKind, DeviceSpec, HostSpec, Inventory

GIB = 2**30
MIB = 2**20


def device(name: str, free_gib: float, kind=DeviceKind.GPU, backend=Backend.CUDA, uma=False,
           endpoint=None) -> DeviceSpec:
    free = int(free_gib * GIB)
    return DeviceSpec(name, kind, backend, free + GIB, free, 0, 0, 0, endpoint=endpoint, uma=uma)


RPC0 = device("RPC0", 6, DeviceKind.RPC, Backend.RPC, endpoint="10.0.0.2:50052")
CUDA0 = device("CUDA0", 20)
CUDA1 = device("CUDA1", 10)
VULKAN0 = device("Vulkan0", 4, DeviceKind.IGPU, Backend.VULKAN, uma=True)
HOST = HostSpec(64 * GIB, 32 * GIB, 0, "cpu")


@pytest.fixture
def inv() -> Inventory:
    return Inventory((RPC0, CUDA0, CUDA1, VULKAN0), HOST)


def test_unset_is_free_minus_512_mib(inv):
    b = resolve_budgets(inv)
    assert b.devices == {"RPC0": 6 * GIB - 512 * MIB, "CUDA0": 20 * GIB - 512 * MIB,
                         "CUDA1": 10 * GIB - 512 * MIB, "Vulkan0": 4 * GIB - 512 * MIB}


def test_positive_value_caps_at_min_of_value_and_free(inv):
    b = resolve_budgets(inv, "CUDA0=8,CUDA1=16")
    assert b.devices["CUDA0"] == 8 * GIB            # 8 < 20 free
    assert b.devices["CUDA1"] == 10 * GIB           # 16 > 10 free: free
    assert b.devices["RPC0"] == 6 * GIB - 512 * MIB  # untouched devices keep the default


def test_negative_value_is_free_minus_that_much(inv):
    b = resolve_budgets(inv, "CUDA0=-2,CUDA1=-12")
    assert b.devices["CUDA0"] == 18 * GIB
    assert b.devices["CUDA1"] == 0                  # 10 - 12 < 0: nothing


def test_bare_value_applies_to_every_device_and_named_items_win(inv):
    b = resolve_budgets(inv, "CUDA1=3,5")
    assert b.devices == {"RPC0": 5 * GIB, "CUDA0": 5 * GIB, "CUDA1": 3 * GIB, "Vulkan0": 4 * GIB}
    assert resolve_budgets(inv, "-1").devices == {"RPC0": 5 * GIB, "CUDA0": 19 * GIB, "CUDA1": 9 * GIB,
                                                  "Vulkan0": 3 * GIB}


def test_explicit_units(inv):
    b = resolve_budgets(inv, "CUDA0=512MiB,CUDA1=1.5GiB,RPC0=-256MiB")
    assert b.devices["CUDA0"] == 512 * MIB
    assert b.devices["CUDA1"] == 1536 * MIB
    assert b.devices["RPC0"] == 6 * GIB - 256 * MIB


def test_zero_leaves_a_device_unused(inv):
    assert resolve_budgets(inv, "CUDA0=0").devices["CUDA0"] == 0


def test_host_budget_reserves_max_of_2_gib_and_10_percent():
    assert resolve_budgets(Inventory((), HOST)).host_bytes == 32 * GIB - int(3.2 * GIB)     # 10% > 2 GiB
    small = HostSpec(16 * GIB, 16 * GIB, 0, "")
    assert resolve_budgets(Inventory((), small)).host_bytes == 14 * GIB                     # 2 GiB > 1.6 GiB


def test_given_host_budget_follows_the_same_rules():
    inv = Inventory((), HOST)
    assert resolve_budgets(inv, ram="8").host_bytes == 8 * GIB
    assert resolve_budgets(inv, ram="64GiB").host_bytes == 32 * GIB     # capped at available
    assert resolve_budgets(inv, ram="-4").host_bytes == 28 * GIB


def test_uma_devices_share_the_host_pool(inv):
    b = resolve_budgets(inv)
    assert b.uma_pool_bytes == b.host_bytes
    assert resolve_budgets(Inventory((CUDA0,), HOST)).uma_pool_bytes is None


def test_uma_device_budget_never_exceeds_the_host_pool():
    apu = device("Vulkan0", 60, DeviceKind.IGPU, Backend.VULKAN, uma=True)
    b = resolve_budgets(Inventory((apu,), HOST))
    pool = 32 * GIB - int(3.2 * GIB)                 # available 32 GiB minus 10 %
    assert b.devices["Vulkan0"] == pool              # not 60 GiB - 512 MiB
    assert b.uma_pool_bytes == b.host_bytes == pool


# ----------------------------------------------------------------------------- names

def test_names_are_case_insensitive_exact(inv):
    assert resolve_device(inv, "cuda1") is CUDA1
    assert resolve_device(inv, "VULKAN0") is VULKAN0


def test_exact_name_wins_over_prefix():
    cuda10 = device("CUDA10", 1)
    inv = Inventory((CUDA1, cuda10), HOST)
    assert resolve_device(inv, "cuda1") is CUDA1
    assert resolve_device(inv, "cuda10") is cuda10


def test_unique_prefix(inv):
    assert resolve_device(inv, "vulk") is VULKAN0
    assert resolve_device(inv, "rpc") is RPC0
    assert resolve_budgets(inv, "vulk=1").devices["Vulkan0"] == GIB


def test_ambiguous_prefix_names_the_candidates(inv):
    with pytest.raises(InventoryError, match="'cuda' is ambiguous: it could be CUDA0, CUDA1") as err:
        resolve_device(inv, "cuda")
    assert err.value.exit_code == 2


def test_gpu_is_the_first_local_gpu_not_an_rpc_device(inv):
    # llama.cpp's order puts RPC0 first; `gpu` means this machine's first GPU.
    assert resolve_device(inv, "gpu") is CUDA0
    assert resolve_device(Inventory((RPC0, VULKAN0), HOST), "GPU") is VULKAN0
    assert resolve_budgets(inv, "gpu=2").devices["CUDA0"] == 2 * GIB
    with pytest.raises(InventoryError, match="no GPU for 'gpu'"):
        resolve_device(Inventory((RPC0,), HOST), "gpu")


@pytest.mark.parametrize("value, expected", [
    ("abc", "--max-vram 'abc': expected a number of GiB (6, -2) or a size with a unit (512MiB, 1.5GiB)"),
    ("=3", "--max-vram '=3': missing device name before '='; expected NAME=SIZE"),
    ("CUDA9=4", "--max-vram 'CUDA9=4': no device 'CUDA9': expected one of RPC0, CUDA0, CUDA1, Vulkan0, gpu"),
    ("CUDA0=lots", "--max-vram 'CUDA0=lots': expected a number of GiB"),
    ("CUDA0=6GB", "unit 'GB' is not one of B, KiB, MiB, GiB, TiB"),
    ("CUDA0=6,cuda0=7", "CUDA0 is set twice; expected one item per device"),
    ("6,7", "a second bare value; expected at most one value"),
    ("6,,CUDA0=1", "empty item; expected NAME=SIZE or SIZE"),
])
def test_bad_max_vram_exits_2_saying_what_was_expected(inv, value, expected):
    with pytest.raises(InventoryError) as err:
        resolve_budgets(inv, value)
    assert err.value.exit_code == 2
    assert expected in str(err.value), str(err.value)


def test_bad_host_budget(inv):
    with pytest.raises(InventoryError, match="--max-ram 'plenty': expected a number of GiB"):
        resolve_budgets(inv, ram="plenty")


def test_no_devices_at_all_names_only_the_cpu():
    with pytest.raises(InventoryError, match="expected one of no devices \\(only the CPU\\)"):
        resolve_budgets(Inventory((), HOST), "CUDA0=4")


# ----------------------------------------------------------------------------- llama.cpp --fit-target

def test_fit_target_margins_are_free_minus_budget_in_device_order(inv):
    b = resolve_budgets(inv, "CUDA0=8,CUDA1=-3")
    assert fit_target_margins(inv, b) == [512 * MIB, 12 * GIB, 3 * GIB, 512 * MIB]


def test_fit_target_flag_is_whole_mib_rounded_up_comma_separated():
    # common/arg.cpp: --fit-target MiB0,MiB1,... parsed with stoull, times 1024*1024.
    assert fit_target_flag([512 * MIB, 12 * GIB, MIB + 1]) == ["--fit-target", "512,12288,2"]
    assert fit_target_flag([]) == []
