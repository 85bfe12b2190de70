"""Where a CPU rpc-server computes (planner/hardware/local_servers.py) and how an inventory states it
(`cpus:`, `threads:`). The detection of real rpc-servers is in tests/peer/test_devices_peer.py."""
from __future__ import annotations

import pytest
import yaml

from planner.core.errors import InventoryError
from planner.core.units import GiB
from planner.hardware.inventory import Backend, DeviceKind, DeviceSpec, HostSpec, Inventory
from planner.hardware.inventory_yaml import cpu_list_text, inventory_yaml_dict, load_inventory
from planner.hardware.local_servers import default_threads, rpc_server_cpus, threads_of


def test_threads_are_the_last_t_flag_else_half_the_cpus():
    assert threads_of(["rpc-server", "-H", "127.0.0.1", "-p", "50052"], 16) == 8
    assert threads_of(["rpc-server", "-t", "3"], 16) == 3
    assert threads_of(["rpc-server", "--threads", "2", "-t", "5"], 16) == 5
    assert threads_of(["rpc-server", "-t", "zero"], 16) == 8     # rpc-server would refuse it; not ours to read
    assert default_threads(1) == 1 and default_threads(2) == 1 and default_threads(7) == 3


def test_a_server_elsewhere_or_not_listening_is_unknown():
    assert rpc_server_cpus("192.0.2.1:50052") is None     # not this machine: never looked at
    assert rpc_server_cpus("127.0.0.1:notaport") is None
    assert rpc_server_cpus("127.0.0.1:1") is None          # nothing listens on port 1 here


def _rpc(**extra) -> dict:
    return {"host": {"ram": "16GiB"}, "devices": [{"name": "RPC0", "endpoint": "127.0.0.1:50052",
                                                    "memory": "4GiB", **extra}]}


def _load(tmp_path, doc):
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_inventory(path)


@pytest.mark.parametrize("given, cpus", [("0-3,8", (0, 1, 2, 3, 8)), (5, (5,)), ([2, 0], (0, 2)), ("1", (1,))])
def test_cpus_and_threads_are_read_and_written_back(tmp_path, given, cpus):
    inv = _load(tmp_path, _rpc(cpus=given, threads=2))
    dev = inv.devices[0]
    assert dev.cpus == cpus and dev.threads == 2
    again = _load(tmp_path, inventory_yaml_dict(inv))
    assert again.devices[0].cpus == cpus and again.devices[0].threads == 2


@pytest.mark.parametrize("key, value", [("cpus", "3-1"), ("cpus", "a"), ("cpus", "0-100000000"), ("cpus", "-1"),
                                        ("cpus", "１"), ("threads", 0), ("threads", 1.5), ("threads", 10**9)])
def test_bad_cpus_and_threads_are_one_line_naming_the_key(tmp_path, key, value):
    with pytest.raises(InventoryError) as err:
        _load(tmp_path, _rpc(**{key: value}))
    assert key in str(err.value) and "\n" not in str(err.value)


def test_cpu_lists_print_as_ranges():
    assert cpu_list_text((0, 1, 2, 3, 8, 10, 11)) == "0-3,8,10-11"
    assert cpu_list_text(()) == ""


def test_a_device_without_cpus_writes_none():
    inv = Inventory((DeviceSpec("RPC0", DeviceKind.RPC, Backend.RPC, 4 * GiB, 4 * GiB, 0, 0, 0,
                                endpoint="127.0.0.1:50052"),), HostSpec(16 * GiB, 16 * GiB, 0, ""))
    row = inventory_yaml_dict(inv)["devices"][0]
    assert "cpus" not in row and "threads" not in row
