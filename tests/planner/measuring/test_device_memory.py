"""serve's device measurement after load (planner/measuring/device_memory.py) on recorded tool outputs."""
from __future__ import annotations

import json

from planner.measuring.device_memory import (
    PlannedDevice,
    after_load_notes,
    parse_nvidia_smi_memory,
    parse_rocm_smi_memory,
    planned_devices,
)
from runtime.ggml.profiles import Backend

MIB = 2**20
# nvidia-smi --query-gpu=index,pci.bus_id,memory.total,memory.used,memory.free --format=csv,noheader,nounits on
# the H200 record's machine, before and while the `one-1g` plan served (tests/peer/data/cuda/nvidia-h200.json:
# used 1051 then 1930 MiB of 143771)
BEFORE = "0, 00000000:1B:00.0, 143771, 1051, 142720\n"
AFTER = "0, 00000000:1B:00.0, 143771, 1930, 141841\n"
ROCM = json.dumps({"card0": {"VRAM Total Memory (B)": "25753026560", "VRAM Total Used Memory (B)": "25300000000"},
                   "system": {"Driver version": "6.8.5"}})


def test_nvidia_smi_rows():
    [gpu] = parse_nvidia_smi_memory(AFTER + "garbage line\n")
    assert (gpu.backend, gpu.index, gpu.bus_id) == (Backend.CUDA, 0, "00000000:1b:00.0")
    assert (gpu.total_bytes, gpu.used_bytes, gpu.free_bytes) == (143771 * MIB, 1930 * MIB, 141841 * MIB)


def test_rocm_smi_cards():
    [gpu] = parse_rocm_smi_memory(ROCM)
    assert (gpu.backend, gpu.index, gpu.total_bytes, gpu.used_bytes) == (Backend.ROCM, 0, 25753026560, 25300000000)
    assert parse_rocm_smi_memory("not json") == []


def test_growth_as_planned_says_so_without_warning():
    # the record's breakdown: CUDA0 235 + 27 + 21 MiB, and the modelled 596 MiB overhead: 879 MiB, as it grew
    dev = PlannedDevice("CUDA0", Backend.CUDA, (235 + 27 + 21) * MIB, 596 * MIB)
    [line] = after_load_notes([dev], parse_nvidia_smi_memory(BEFORE), parse_nvidia_smi_memory(AFTER),
                              512 * MIB, 64 * MIB)
    assert line == ("CUDA0 after load: 1930 MiB used of 143771 MiB, 141841 MiB free; grew 879 MiB, the plan's rows "
                    "and overhead 879 MiB (283 + 596)")


def test_warnings_when_it_grew_more_or_little_is_left():
    dev = PlannedDevice("CUDA0", Backend.CUDA, 100 * MIB, 596 * MIB, bus_id="00000000:1B:00.0")
    full = parse_nvidia_smi_memory("0, 00000000:1B:00.0, 143771, 143500, 271\n")
    [line] = after_load_notes([dev], parse_nvidia_smi_memory(BEFORE), full, 512 * MIB, 64 * MIB)
    assert "more than planned" in line and "less than the 512 MiB margin is left free" in line
    assert "271 MiB free" in line


def test_rocm_device_matched_by_index_and_cpu_devices_left_out():
    rows = {"ROCm0": (20000 * MIB, 3000 * MIB, 500 * MIB), "RPC0": (1, 1, 1)}
    devices = planned_devices(("RPC0", "ROCm0"), {"RPC0": Backend.RPC, "ROCm0": Backend.ROCM}, rows,
                              {"ROCm0": 596 * MIB}, {})
    assert [d.name for d in devices] == ["ROCm0"]
    [line] = after_load_notes(devices, [], parse_rocm_smi_memory(ROCM), 512 * MIB, 64 * MIB)
    # by hand: 25300000000 B used is 24127.95 MiB, 453026560 B free is 432.03 MiB (fmt_mib rounds up)
    assert line.startswith("ROCm0 after load: 24128 MiB used of 24560 MiB, 433 MiB free")
    assert "margin" in line and "grew" not in line
