"""The set planner's pieces: the budgets another process leaves (the shared UMA pool included), the
inventory one more process sees (the rpc-servers others hold left out, its RPC devices numbered as
llama.cpp numbers them), the units' order, and the Python front door."""
from __future__ import annotations

import planner
from planner.hardware.budgets import Budgets
from planner.hardware.inventory import Backend, DeviceKind, DeviceSpec, HostSpec, Inventory
from planner.llama.placement import HOST
from planner.search.set_input import ModelSet, Residency, SetEntry
from planner.search.set_plan import Room, left_over, process_view, units_of
from tests.support.overhead import CUDA_MIB

GIB, MIB = 2**30, 2**20


def _rpc(name: str, port: int) -> DeviceSpec:
    return DeviceSpec(name, DeviceKind.RPC, Backend.RPC, GIB, GIB, 0, 0, 0, endpoint=f"127.0.0.1:{port}")


def test_left_over_takes_each_row_and_the_pool():
    budgets = Budgets({"CUDA0": 8 * GIB, "Vulkan0": 4 * GIB}, 16 * GIB, uma_pool_bytes=18 * GIB,
                      pool_devices=("Vulkan0",))
    left = left_over(budgets, {"CUDA0": 3 * GIB, "Vulkan0": GIB, HOST: 2 * GIB})
    assert left.devices == {"CUDA0": 5 * GIB, "Vulkan0": 3 * GIB} and left.host_bytes == 14 * GIB
    assert left.uma_pool_bytes == 18 * GIB - (GIB + 2 * GIB) and left.pool_devices == ("Vulkan0",)
    assert left_over(budgets, {"CUDA0": 9 * GIB}).devices["CUDA0"] == 0   # never below nothing


def test_process_view_leaves_out_held_rpc_servers_and_renumbers():
    inventory = Inventory((_rpc("RPC0", 50001), _rpc("RPC1", 50002), _rpc("RPC2", 50003)),
                          HostSpec(8 * GIB, 8 * GIB, 0, ""))
    budgets = Budgets({"RPC0": GIB, "RPC1": 2 * GIB, "RPC2": 3 * GIB}, 4 * GIB)
    room = Room((("RPC2", 100 * MIB), (HOST, GIB)), frozenset({"127.0.0.1:50002"}))
    view, left, names = process_view(inventory, budgets, room)
    # ggml-rpc numbers a process's RPC devices in its --rpc order: the box's RPC2 is this one's RPC1
    assert [(d.name, d.endpoint) for d in view.devices] == [("RPC0", "127.0.0.1:50001"), ("RPC1", "127.0.0.1:50003")]
    assert names == {"RPC0": "RPC0", "RPC1": "RPC2"}
    assert left.devices == {"RPC0": GIB, "RPC1": 3 * GIB - 100 * MIB} and left.host_bytes == 3 * GIB


def test_units_group_members_and_go_by_priority():
    spec = ModelSet("set.yaml", (
        SetEntry("a", "a.gguf", priority=1), SetEntry("b", "b.gguf", group="g", priority=0),
        SetEntry("c", "c.gguf", group="g", priority=5), SetEntry("d", "d.gguf", resident=Residency.ON_DEMAND)))
    units = units_of(spec)
    assert [(u.name, [e.name for e in u.members]) for u in units] == [("g", ["c", "b"]), ("a", ["a"]), ("d", ["d"])]
    assert units[0].priority == 5 and units[2].resident is Residency.ON_DEMAND


def test_the_python_front_door():
    # each of the set's four processes holds its own CUDA overhead beside its rows
    report = planner.plan_set("configs/sets/home-box.yaml", [f"CUDA0={1024 + 4 * CUDA_MIB}MiB"], ram="8GiB",
                              max_ram="1GiB")
    doc = report.to_dict()
    assert [m.entry.name for m in report.plan.models] == ["chat", "embed", "summarize", "code"]
    assert [o["unit"] for o in doc["on_demand"]] == ["code", "summarize"]
    assert report.to_table().startswith("configs/sets/home-box.yaml: 4 models")
