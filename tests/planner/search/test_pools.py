"""Memory pools as llama.cpp's machines have them: an APU's (UMA) device memory is the host's RAM, so
Host plus the UMA devices hold at most one pool (seed 003 §7); a card that two backends list (CUDA0 and
Vulkan0 with one PCI id) is one card, used by the name llama.cpp keeps (llama_prepare_model_devices)."""
from __future__ import annotations

import pytest

from planner.core.errors import InfeasiblePlacement
from planner.core.units import GiB, MiB
from planner.hardware.budgets import resolve_budgets
from planner.hardware.inventory import Backend, DeviceKind, DeviceSpec, HostSpec, Inventory
from planner.llama.context import model_context
from planner.llama.flags import parse_llama_flags
from planner.memory.estimate import estimate
from planner.search.result import PlanRequest, llama_argv
from planner.search.search import plan
from planner.search.solve import LayerDemand, Problem, Slot, solve_dp, solve_milp
from planner.synth.gguf_factory import llama_spec
from tests.support.overhead import CUDA_MIB, VULKAN_MIB, cuda

HOST = HostSpec(64 * GiB, 60 * GiB, int(80e9), "test host", int(1e12))
POOL = 100 * MiB   # a pool for the budget arithmetic


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    # 8 layers of 1024: about 62 MiB of weights, 32 MiB of f16 KV at 4096 and ~29 MiB of CPU compute
    [path] = llama_spec(n_layer=8, n_embd=1024, n_head=8, n_head_kv=2, n_ff=2816, n_vocab=4096).write(
        tmp_path_factory.mktemp("pools") / "llama.gguf")
    return model_context(str(path))


def apu(memory: int) -> DeviceSpec:
    return DeviceSpec("Vulkan0", DeviceKind.IGPU, Backend.VULKAN, memory, memory, int(256e9), int(30e12), 0,
                      uma=True, description="AMD Radeon 8060S Graphics")


def rpc(memory: int) -> DeviceSpec:
    return DeviceSpec("RPC0", DeviceKind.RPC, Backend.RPC, memory, memory, 0, 0, 0, endpoint="127.0.0.1:50052",
                      network_bytes_s=int(1.25e9))


def pooled_bytes(result, members=("Host", "CPU_REPACK", "Vulkan0")) -> int:
    """What Host and the APU hold together under the plan's own flags, by an independent estimate."""
    est = estimate(result.estimate.model_path, parse_llama_flags(llama_argv(result)), result.inventory)
    return sum(d.held_bytes for d in est.devices if d.name in members)   # the APU's overhead is pool RAM too


def test_host_and_apu_together_never_exceed_the_pool(llama):
    # At -ub 32 the whole model takes ~97 MiB on Host and Vulkan0 together. Without the joint cap each
    # may take 80 MiB (160 MiB in all), so it "fits" split between them, though the machine has one
    # 80 MiB pool.
    pool = (80 + VULKAN_MIB) * MiB   # 80 MiB beside the APU's Vulkan overhead
    inv = Inventory((apu(pool),), HOST)
    with pytest.raises(InfeasiblePlacement) as err:
        plan(llama, inv, PlanRequest(n_ctx=4096), max_vram=f"Vulkan0={pool}B", ram=f"{pool}B", what_would_fit=True)
    # what would fit is a bigger pool: the host's budget, which the pool is
    [short] = err.value.shortfalls
    assert short.device == "Host" and short.need_bytes > pool


def test_a_plan_beside_an_rpc_device_keeps_the_pool(llama):
    # RPC0 can take part of the model; what it leaves on Host and Vulkan0 must fit 60 MiB together
    # (each alone may hold 60 MiB).
    pool = (60 + VULKAN_MIB) * MiB   # 60 MiB beside the APU's Vulkan overhead
    inv = Inventory((rpc(64 * MiB), apu(pool)), HOST)
    result = plan(llama, inv, PlanRequest(n_ctx=4096), max_vram=f"Vulkan0={pool}B,RPC0=64MiB", ram=f"{pool}B")
    assert result.budgets.uma_pool_bytes == pool
    assert pooled_bytes(result) <= pool


def test_the_pool_verdict_names_its_members():
    budgets = resolve_budgets(Inventory((apu(POOL),), HOST), f"Vulkan0={POOL}B", f"{POOL}B")
    assert budgets.pool_devices == ("Vulkan0",)
    assert budgets.over({"Host": 60 * MiB, "Vulkan0": 50 * MiB}) == {"Host": 10 * MiB}
    assert budgets.over({"Host": 40 * MiB, "Vulkan0": 60 * MiB}) == {}


def card(name: str, backend: Backend, pci: str | None, memory: int = (400 + CUDA_MIB) * MiB) -> DeviceSpec:
    return DeviceSpec(name, DeviceKind.GPU, backend, memory, memory, int(360e9), int(25e12), int(25e9),
                      description="NVIDIA GeForce RTX 3060", id=pci)


def test_one_card_under_two_backends_is_planned_once_under_the_name_llama_cpp_keeps(llama):
    # `llama-cli --list-devices` on a CUDA+Vulkan build lists the card as CUDA0 and Vulkan0 (seed
    # 003 §3); llama.cpp skips Vulkan0, whose device_id CUDA0 already has, and CUDA registers first.
    inv = Inventory((card("Vulkan0", Backend.VULKAN, "0000:01:00.0"), card("CUDA0", Backend.CUDA, "0000:01:00.0")),
                    HOST)
    result = plan(llama, inv, PlanRequest(n_ctx=4096), max_vram=f"CUDA0={cuda(100)},Vulkan0={100 + VULKAN_MIB}MiB",
                  with_explain=True)
    assert result.flags.devices == ("CUDA0",)
    assert "Vulkan0" not in {d.name for d in result.estimate.devices}
    assert any("CUDA0 and Vulkan0 are one card" in line for line in result.explain)


def test_two_cards_with_different_ids_are_both_used(llama):
    inv = Inventory((card("CUDA0", Backend.CUDA, "0000:01:00.0"), card("Vulkan0", Backend.VULKAN, "0000:02:00.0")),
                    HOST)
    result = plan(llama, inv, PlanRequest(n_ctx=4096), max_vram=f"CUDA0={cuda(60)},Vulkan0={60 + VULKAN_MIB}MiB")
    assert set(result.flags.devices or ()) == {"CUDA0", "Vulkan0"}


# --------------------------------------------------------------------------- the solver's side

def _pool_problem(host_budget: int):
    """Four 10-byte layers and a 0-byte output on the host, an RPC-like slot (R, 20 bytes, slow) and a
    UMA slot (U, 40 bytes, fast, its bytes the host's too), in llama.cpp's order: host, R, U."""
    layers = tuple([LayerDemand(10, 0, 10.0, 0.0)] * 4 + [LayerDemand(0, 0, 0.0, 0.0)])
    slots = (Slot("CPU", host_budget, 1.0, 0, 0.0), Slot("R", 20, 2.0, 0, 0.0),
             Slot("U", 40, 10.0, 0, 0.0, pooled=True))
    return Problem(layers, slots)


def _pool_bytes(a) -> int:
    # the host's layers plus the UMA slot's (10 bytes each)
    return 10 * sum(1 for s in a.slot_of_layer[:-1] if s in (0, 2))


@pytest.mark.parametrize("solver", [solve_dp, solve_milp])
def test_the_solver_keeps_host_and_uma_slots_within_one_budget(solver):
    # Unpooled, U (fastest) would take all four layers (40 bytes) with the host's 30 unused. Pooled,
    # the host's 30 bytes cap host + U together: R must take two layers (20), U at most the other 2.
    a = solver(_pool_problem(30))
    assert a is not None and _pool_bytes(a) <= 30
    assert a.slot_of_layer[:-1].count(1) >= 1
    # 10 bytes of pool: R's 20 cannot take the other 20 bytes, nothing fits
    assert solver(_pool_problem(10)) is None
