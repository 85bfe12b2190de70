"""Inventory model, YAML inventories, --device shorthands and the catalog.

Expected figures are worked out here from the definitions (GiB = 2**30, GB/s = 1e9 B/s,
PCIe per-lane rates from the PCI-SIG line codings), never read back from the code.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from planner.core.errors import InventoryError
from planner.hardware import catalog
from planner.hardware.inventory import (
    Backend,
    DeviceKind,
    DeviceSpec,
    HostSpec,
    Inventory,
    llama_order,
    pcie_link_bytes_s,
    rpc_flag,
)
from planner.hardware.inventory_yaml import inventory_from_cli, load_inventory

ROOT = Path(__file__).resolve().parents[3]
DEVICES = ROOT / "configs" / "devices"
GIB = 2**30
PCIE4_X16 = 16e9 * 128 / 130 / 8 * 16     # 16 GT/s, 128b/130b, 16 lanes: ~31.5 GB/s


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "inv.yaml"
    path.write_text(text)
    return path


def bad_yaml(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(InventoryError) as err:
        load_inventory(path)
    assert err.value.exit_code == 2
    message = str(err.value)
    assert message.startswith(f"{path}: "), message
    return message


# ----------------------------------------------------------------------------- model

def test_pcie_rates_follow_line_coding():
    assert pcie_link_bytes_s(3, 16) == int(8e9 * 128 / 130 / 8 * 16)     # ~15.75 GB/s
    assert pcie_link_bytes_s(4, 16) == int(PCIE4_X16)
    assert pcie_link_bytes_s(2, 8) == int(5e9 * 8 / 10 / 8 * 8)          # 8b/10b: 4 GB/s
    with pytest.raises(ValueError):
        pcie_link_bytes_s(4, 3)


def dev(name: str, kind: DeviceKind, backend: Backend, endpoint: str | None = None) -> DeviceSpec:
    return DeviceSpec(name, kind, backend, 8 * GIB, 8 * GIB, 0, 0, 0, endpoint=endpoint)


def test_llama_order_puts_rpc_first_then_gpus_then_igpus():
    # src/llama.cpp: RPC servers are inserted at the front, integrated GPUs after discrete ones.
    given = [dev("Vulkan1", DeviceKind.IGPU, Backend.VULKAN), dev("CUDA0", DeviceKind.GPU, Backend.CUDA),
             dev("RPC0", DeviceKind.RPC, Backend.RPC, "h:1"), dev("CUDA1", DeviceKind.GPU, Backend.CUDA)]
    assert [d.name for d in llama_order(given)] == ["RPC0", "CUDA0", "CUDA1", "Vulkan1"]


def test_inventory_refuses_duplicate_names():
    host = HostSpec(GIB, GIB, 0, "")
    with pytest.raises(InventoryError, match="CUDA0 appears twice"):
        Inventory((dev("CUDA0", DeviceKind.GPU, Backend.CUDA),) * 2, host)


# ----------------------------------------------------------------------------- YAML

def test_workstation_example_loads_with_catalog_figures():
    inv = load_inventory(DEVICES / "workstation-2x3090.yaml")
    assert inv.names == ["CUDA0", "CUDA1"]
    cuda0, cuda1 = inv.devices
    assert (cuda0.total_bytes, cuda0.free_bytes) == (24 * GIB, int(23.5 * GIB))
    assert cuda0.bandwidth_bytes_s == 936 * 10**9          # GA102 whitepaper: 936 GB/s
    assert cuda0.fp16_flops == 71 * 10**12
    assert cuda0.link_bytes_s == int(PCIE4_X16)
    assert cuda1.link_bytes_s == int(PCIE4_X16 / 4)        # pcie4x4 overrides the catalog's x16
    assert inv.host.ram_total_bytes == 64 * GIB and inv.host.ram_available_bytes == 60 * GIB
    assert inv.host.bandwidth_bytes_s == int(3200e6 * 8 * 2)   # DDR4-3200, two channels


def test_rpc_example_orders_and_numbers_remote_devices():
    inv = load_inventory(DEVICES / "rpc-two-hosts.yaml")
    assert inv.names == ["RPC0", "RPC1", "CUDA0"]
    assert [d.endpoint for d in inv.devices[:2]] == ["192.168.1.21:50052", "192.168.1.22:50052"]
    assert inv.devices[0].network_bytes_s == 1.25e9
    assert inv.devices[0].transfer_bytes_s == 1.25e9          # the network is the slow hop
    assert rpc_flag(inv) == ["--rpc", "192.168.1.21:50052,192.168.1.22:50052"]


def test_every_shipped_inventory_loads():
    paths = sorted(DEVICES.glob("*.yaml"))
    assert len(paths) >= 4
    for path in paths:
        assert load_inventory(path).host.ram_total_bytes > 0


def test_uma_apu_is_flagged():
    inv = load_inventory(DEVICES / "strix-halo.yaml")
    (apu,) = inv.devices
    assert apu.uma and apu.kind is DeviceKind.IGPU and apu.total_bytes == 120 * GIB


def test_count_numbers_devices_after_the_backend_prefix(tmp_path):
    inv = load_inventory(write(tmp_path, "host: {ram: 32GiB}\ndevices:\n  - {catalog: rx7900xtx, count: 2}\n"))
    assert inv.names == ["ROCm0", "ROCm1"]


def test_misspelled_key_names_file_path_and_expected_keys(tmp_path):
    msg = bad_yaml(tmp_path, "host: {ram: 32GiB}\ndevices:\n  - name: CUDA0\n    memory: 24GiB\n"
                             "    bandwdith_gbs: 936\n")
    assert "devices[0].bandwdith_gbs: unknown key (did you mean 'bandwidth_gbs'?)" in msg
    assert "expected one of: name, catalog" in msg


@pytest.mark.parametrize("text, where, expected", [
    ("devices: []\n", "host", "missing; expected the host mapping"),
    ("host: {ram: lots}\n", "host.ram", "expected a size such as 24GiB"),
    ("host: {ram: 8GiB, available: 9GiB}\n", "host.available", "expected at most ram"),
    ("host: {ram: 8GiB}\ndevices: {a: 1}\n", "devices", "expected a list of device mappings"),
    ("host: {ram: 8GiB}\ndevices:\n  - {name: CUDA0}\n", "devices[0].memory", "missing; expected a size"),
    ("host: {ram: 8GiB}\ndevices:\n  - {name: XPU0, memory: 8GiB}\n",
     "devices[0].name", "expected a llama.cpp device name"),
    ("host: {ram: 8GiB}\ndevices:\n  - {name: ROCm0, catalog: rtx3090}\n", "devices[0].name", "expected a CUDA name"),
    ("host: {ram: 8GiB}\ndevices:\n  - {name: CUDA0, memory: 8GiB, free: 9GiB}\n",
     "devices[0].free", "expected at most memory"),
    ("host: {ram: 8GiB}\ndevices:\n  - {name: CUDA0, memory: 8GiB, link: pcie9x99}\n",
     "devices[0].link", "expected a PCIe link"),
    ("host: {ram: 8GiB}\ndevices:\n  - {catalog: rtx3090, endpoint: nohost}\n",
     "devices[0].endpoint", "expected host:port"),
    ("host: {ram: 8GiB}\ndevices:\n  - {kind: rpc, memory: 8GiB}\n",
     "devices[0].endpoint", "expected host:port of the rpc-server"),
    ("host: {ram: 8GiB}\ndevices:\n  - {catalog: rtx9999}\n", "devices[0].catalog", "unknown catalog device 'rtx9999'"),
    ("host: {ram: 8GiB}\ndevices:\n  - {catalog: rtx3090, count: 0}\n",
     "devices[0].count", "expected a whole number from 1 to 16"),
    ("host: {ram: 8GiB}\ndevices:\n  - {name: CUDA0, catalog: rtx3090, count: 2}\n",
     "devices[0].count", "expected 1 when name is given"),
    ("host: {ram: 8GiB}\ndevices:\n  - {name: RPC1, catalog: rtx3090, endpoint: 'h:1'}\n",
     "devices[0].name", "expected RPC0"),
    ("host: {ram: 8GiB}\ndevices:\n  - {name: CUDA0, memory: 8GiB, uma: yes please}\n",
     "devices[0].uma", "expected true or false"),
])
def test_yaml_errors_say_where_and_what_was_expected(tmp_path, text, where, expected):
    msg = bad_yaml(tmp_path, text)
    assert f": {where}: " in msg and expected in msg, msg


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(InventoryError, match="cannot read the file"):
        load_inventory(tmp_path / "missing.yaml")
    assert re.search(r"not valid YAML at line \d+ \(.+\); expected a YAML mapping",
                     bad_yaml(tmp_path, "host:\n  ram: [8GiB\n"))


# ----------------------------------------------------------------------------- shorthands

def base(*devices: DeviceSpec) -> Inventory:
    return Inventory(tuple(devices), HostSpec(32 * GIB, 30 * GIB, 0, "cpu"))


def test_name_equals_size_adds_a_bare_device():
    inv = inventory_from_cli(["cuda0=24GiB"], "64GiB", None)
    (d,) = inv.devices
    assert (d.name, d.backend, d.kind) == ("CUDA0", Backend.CUDA, DeviceKind.GPU)
    assert d.total_bytes == d.free_bytes == 24 * GIB
    assert inv.host.ram_total_bytes == inv.host.ram_available_bytes == 64 * GIB


def test_bare_number_is_gib_and_units_are_binary():
    inv = inventory_from_cli(["Vulkan0=8", "MTL0=1.5GiB", "SYCL0=512MiB"], "16", None)
    assert [d.total_bytes for d in inv.devices] == [8 * GIB, int(1.5 * GIB), 512 * 2**20]
    assert inv.host.ram_total_bytes == 16 * GIB


def test_count_times_catalog_id_numbers_after_existing_devices():
    existing = dev("CUDA0", DeviceKind.GPU, Backend.CUDA)
    inv = inventory_from_cli(["2xrtx3090"], None, base(existing))
    assert inv.names == ["CUDA0", "CUDA1", "CUDA2"]
    assert inv.devices[2].total_bytes == 24 * GIB and inv.devices[2].bandwidth_bytes_s == 936 * 10**9
    assert inv.host == base().host            # no --ram: the base host stays


def test_resizing_an_existing_device_keeps_its_other_figures():
    fast = DeviceSpec("CUDA0", DeviceKind.GPU, Backend.CUDA, 24 * GIB, 20 * GIB, 10**12, 0, 0)
    (d,) = inventory_from_cli(["CUDA0=12GiB"], None, base(fast)).devices
    assert (d.total_bytes, d.free_bytes, d.bandwidth_bytes_s) == (12 * GIB, 12 * GIB, 10**12)


def test_endpoint_suffix_makes_rpc_devices_that_come_first():
    inv = inventory_from_cli(["CUDA0=24GiB", "rtx3090@10.0.0.2:50052", "RPC1=16GiB@10.0.0.3:50052"], "64GiB", None)
    assert inv.devices[1].total_bytes == 16 * GIB
    assert inv.names == ["RPC0", "RPC1", "CUDA0"]
    assert [d.endpoint for d in inv.devices[:2]] == ["10.0.0.2:50052", "10.0.0.3:50052"]
    assert rpc_flag(inv) == ["--rpc", "10.0.0.2:50052,10.0.0.3:50052"]


@pytest.mark.parametrize("spec, expected", [
    ("abc", "expected NAME=SIZE (CUDA0=24GiB), NAME=CATALOG_ID or [N x]CATALOG_ID"),
    ("=3", "missing device name before '='"),
    ("CUDA0=", "missing value after 'CUDA0='"),
    ("XPU0=4", "expected a llama.cpp device name"),
    ("CUDA0=0", "expected a size above 0"),
    ("CUDA0=4GB", "expected a size such as 24GiB"),
    ("ROCm0=rtx3090", "expected a CUDA name"),   # Vulkan0=rtx3090 is the same card under Vulkan (seed 003 §3)
    ("RPC0=8GiB", "expected host:port of the rpc-server"),
    ("rtx3090@nowhere", "expected host:port after '@'"),
    ("rtx309", "did you mean rtx3090"),
])
def test_bad_shorthands_exit_2_with_what_was_expected(spec, expected):
    with pytest.raises(InventoryError) as err:
        inventory_from_cli([spec], "8GiB", None)
    assert err.value.exit_code == 2
    assert str(err.value).startswith(f"--device {spec}") and expected in str(err.value), str(err.value)


def test_ram_is_required_without_a_base_and_must_be_positive():
    with pytest.raises(InventoryError, match="--ram: missing"):
        inventory_from_cli(["CUDA0=8"], None, None)
    with pytest.raises(InventoryError, match="expected a size above 0"):
        inventory_from_cli([], "0", base())
    with pytest.raises(InventoryError, match="--ram 'much'"):
        inventory_from_cli([], "much", base())


# ----------------------------------------------------------------------------- catalog

def test_catalog_covers_the_required_families():
    cat = catalog.load_catalog()
    assert len(cat.devices) >= 25
    backends = {d.backend for d in cat.devices.values()}
    assert {Backend.CUDA, Backend.ROCM, Backend.METAL, Backend.SYCL} <= backends
    assert any(d.uma and d.kind is DeviceKind.IGPU for d in cat.devices.values())     # AMD APUs
    assert {"ddr4-3200-2ch", "ddr5-5600-2ch"} <= set(cat.hosts)
    assert cat.hosts["ddr5-5600-2ch"].bandwidth_bytes_s == int(5600e6 * 8 * 2)


def test_every_catalog_entry_cites_a_source():
    # the source: field names the document (the first entries also cite it in a comment above them)
    cat = catalog.load_catalog()
    for entry in cat.devices.values():
        assert re.search(r"datasheet|whitepaper|newsroom|specifications|product page|tech specs", entry.source,
                         re.I), entry.id
    for host in cat.hosts.values():
        assert "JEDEC" in host.source, host.id


def test_detected_descriptions_match_the_longest_catalog_name():
    assert catalog.match_description("NVIDIA GeForce RTX 3090").id == "rtx3090"
    assert catalog.match_description("AMD Radeon RX 7900 XTX").id == "rx7900xtx"    # not "7900 XT"
    assert catalog.match_description("llvmpipe (LLVM 15.0.7, 256 bits)") is None
