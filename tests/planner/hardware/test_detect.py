"""Detection parsers on recorded text and fake sysfs trees (no GPU needed)."""
from __future__ import annotations

from pathlib import Path

import psutil

from planner.hardware.detect import (
    detect_amd,
    detect_host,
    parse_cpu_model,
    parse_list_devices,
    parse_nvidia_smi,
)
from planner.hardware.inventory import Backend, DeviceKind

GIB = 2**30
MIB = 2**20


def test_cpu_model_x86_and_arm():
    assert parse_cpu_model("processor\t: 0\nmodel name\t: AMD EPYC 7B13\n") == "AMD EPYC 7B13"
    assert parse_cpu_model("Hardware\t: BCM2835\nModel\t\t: Raspberry Pi 5 Model B Rev 1.0\n") == (
        "Raspberry Pi 5 Model B Rev 1.0")


def test_detect_host_ram_is_psutils_and_cpu_from_proc(tmp_path, monkeypatch):
    # One snapshot of psutil's figures, so that available RAM cannot move between the two reads.
    memory = psutil.virtual_memory()
    monkeypatch.setattr(psutil, "virtual_memory", lambda: memory)
    (tmp_path / "cpuinfo").write_text("model name\t: Test CPU\n")
    host = detect_host(tmp_path)
    assert (host.ram_total_bytes, host.ram_available_bytes) == (memory.total, memory.available)
    assert host.cpu_model == "Test CPU"


def test_detect_host_without_a_snapshot():
    host = detect_host()
    assert host.ram_total_bytes == psutil.virtual_memory().total
    assert 0 < host.ram_available_bytes <= host.ram_total_bytes


def test_nvidia_smi_rows():
    text = "NVIDIA GeForce RTX 3090, 24576, 24000, 4, 16\nNVIDIA GeForce RTX 3060, 12288, 11000, [N/A], [N/A]\n"
    a, b = parse_nvidia_smi(text)
    assert (a.name, a.total_bytes, a.free_bytes) == ("CUDA0", 24576 * MIB, 24000 * MIB)
    assert a.link_bytes_s == int(16e9 * 128 / 130 / 8 * 16)
    assert (b.name, b.link_bytes_s) == ("CUDA1", 0)


def test_list_devices_output_with_rpc():
    # The format of common_print_available_devices (common/arg.cpp).
    text = ("Available devices:\n"
            "  CUDA0: NVIDIA GeForce RTX 4090 (24080 MiB, 23500 MiB free)\n"
            "  RPC0: 127.0.0.1:50052 (24105 MiB, 24000 MiB free)\n")
    cuda, rpc = parse_list_devices(text)
    assert (cuda.name, cuda.backend, cuda.total_bytes, cuda.free_bytes) == (
        "CUDA0", Backend.CUDA, 24080 * MIB, 23500 * MIB)
    assert (rpc.name, rpc.kind, rpc.endpoint) == ("RPC0", DeviceKind.RPC, "127.0.0.1:50052")
    assert parse_list_devices("Available devices:\n  (none)\n") == []


def amd_card(drm: Path, n: int, vram: int, gtt: int, vram_used: int = 0, gtt_used: int = 0, name: str = "") -> None:
    dev = drm / f"card{n}" / "device"
    dev.mkdir(parents=True)
    for key, value in {"vendor": "0x1002", "mem_info_vram_total": vram, "mem_info_vram_used": vram_used,
                       "mem_info_gtt_total": gtt, "mem_info_gtt_used": gtt_used}.items():
        (dev / key).write_text(f"{value}\n")
    if name:
        (dev / "product_name").write_text(name + "\n")


def test_amd_sysfs_discrete_and_apu(tmp_path):
    amd_card(tmp_path, 0, vram=24 * GIB, gtt=32 * GIB, vram_used=GIB, name="Radeon RX 7900 XTX")
    amd_card(tmp_path, 1, vram=512 * MIB, gtt=64 * GIB, gtt_used=2 * GIB)
    (tmp_path / "card0-DP-1").mkdir()          # a connector, not a card
    dgpu, apu = detect_amd(tmp_path)
    assert (dgpu.kind, dgpu.uma, dgpu.total_bytes, dgpu.free_bytes) == (DeviceKind.GPU, False, 24 * GIB, 23 * GIB)
    # seed 003 §7: a small carve-out next to a big GTT window is system RAM, not extra capacity.
    assert (apu.kind, apu.uma, apu.total_bytes, apu.free_bytes) == (DeviceKind.IGPU, True, 64 * GIB, 62 * GIB)


def test_amd_sysfs_ignores_other_vendors(tmp_path):
    dev = tmp_path / "card0" / "device"
    dev.mkdir(parents=True)
    (dev / "vendor").write_text("0x10de\n")
    assert detect_amd(tmp_path) == []


def test_nvml_path_with_a_fake_module(monkeypatch):
    import sys
    import types

    from planner.hardware.detect import detect_nvidia_nvml

    calls = []
    fake = types.SimpleNamespace(
        nvmlInit=lambda: calls.append("init"),
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: b"NVIDIA GeForce RTX 4090",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=24 * GIB, free=23 * GIB),
        nvmlDeviceGetMaxPcieLinkGeneration=lambda h: 4,
        nvmlDeviceGetMaxPcieLinkWidth=lambda h: 16,
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    (d,) = detect_nvidia_nvml()
    assert (d.name, d.description, d.total_bytes, d.free_bytes) == (
        "CUDA0", "NVIDIA GeForce RTX 4090", 24 * GIB, 23 * GIB)
    assert d.link_bytes_s == int(16e9 * 128 / 130 / 8 * 16)
    assert calls == ["init", "shutdown"]


def test_without_nvml_the_probe_says_unavailable(monkeypatch):
    import sys

    from planner.hardware.detect import detect_nvidia_nvml

    monkeypatch.setitem(sys.modules, "pynvml", None)       # import fails
    assert detect_nvidia_nvml() is None


def test_detected_devices_get_catalog_figures_and_llama_order(monkeypatch, tmp_path):
    from planner.hardware import detect

    listed = ("  Vulkan0: AMD Radeon RX 7900 XTX (24560 MiB, 24000 MiB free)\n"
              "  RPC0: 127.0.0.1:50052 (8000 MiB, 8000 MiB free)\n")
    monkeypatch.setattr(detect, "list_llama_devices", lambda bin_dir, rpc: detect.parse_list_devices(listed))
    monkeypatch.setattr("planner.system.llama_tools.tools_dir", lambda: tmp_path)
    inv = detect.detect_inventory()
    assert inv.names == ["RPC0", "Vulkan0"]                 # RPC first, as llama.cpp orders them
    assert inv.devices[1].bandwidth_bytes_s == 960 * 10**9  # rx7900xtx in the catalog
