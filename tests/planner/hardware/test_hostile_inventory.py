"""Issue #22: inventory numbers, counts and names that would overflow, exhaust memory, hang, or be
read as digits llama.cpp does not read, refused in one line naming the place."""
from __future__ import annotations

import time

import pytest
import yaml

from planner.core.errors import InventoryError
from planner.hardware.budgets import parse_max_vram
from planner.hardware.inventory_yaml import inventory_from_cli, load_inventory
from planner.hardware.limits import LLAMA_MAX_DEVICES

BASE = {"host": {"ram": "64GiB"}, "devices": [{"name": "CUDA0", "catalog": "rtx3090"}]}


def _load(tmp_path, doc):
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(doc).replace("&id", "&x").replace("*id", "*x"))
    return load_inventory(path)


@pytest.mark.parametrize("where, key, value", [
    ("device", "bandwidth_gbs", float("inf")), ("device", "bandwidth_gbs", float("nan")),
    ("device", "fp16_tflops", 1e308), ("device", "link_gbs", float("inf")),
    ("host", "bandwidth_gbs", float("inf")), ("host", "fp16_tflops", float("nan")),
])
def test_non_finite_and_huge_rates_are_refused(tmp_path, where, key, value):
    doc = yaml.safe_load(yaml.safe_dump(BASE))
    (doc["devices"][0] if where == "device" else doc["host"])[key] = value
    with pytest.raises(InventoryError, match=f"{key}: expected .*a number from 0 to 1e\\+09"):
        _load(tmp_path, doc)


@pytest.mark.parametrize("count", [17, 1_000_000, 1_000_000_000])
def test_counts_are_bounded_by_llama_max_devices_before_anything_is_built(tmp_path, count):
    doc = {"host": {"ram": "64GiB"}, "devices": [{"catalog": "rtx3090", "count": count}]}
    started = time.monotonic()
    with pytest.raises(InventoryError, match=f"count: expected a whole number from 1 to {LLAMA_MAX_DEVICES}"):
        _load(tmp_path, doc)
    with pytest.raises(InventoryError, match=f"expected a count from 1 to {LLAMA_MAX_DEVICES}"):
        inventory_from_cli([f"{count}xrtx3090"], "64GiB", None)
    assert time.monotonic() - started < 2


def test_more_devices_than_llama_cpp_holds_are_refused(tmp_path):
    doc = {"host": {"ram": "64GiB"}, "devices": [{"catalog": "rtx3090"}] * (LLAMA_MAX_DEVICES + 1)}
    with pytest.raises(InventoryError, match="at most 16 devices"):
        _load(tmp_path, doc)
    with pytest.raises(InventoryError, match="at most 16 devices"):
        inventory_from_cli(["9xrtx3090", "8xrtx3090"], "64GiB", None)
    assert len(inventory_from_cli(["8xrtx3090", "8xrtx3090"], "64GiB", None).devices) == LLAMA_MAX_DEVICES


@pytest.mark.parametrize("spec", ["CUDA0=٨GiB", "CUDA٠=8GiB", "٢xrtx3090", "CUDA0=8GiB,bw=٣٦٠"])
def test_non_ascii_digits_on_the_command_line_are_refused(spec):
    with pytest.raises(InventoryError):
        inventory_from_cli([spec], "64GiB", None)


def test_non_ascii_digits_in_ram_and_names_are_refused(tmp_path):
    with pytest.raises(InventoryError, match="--ram"):
        inventory_from_cli(["CUDA0=8GiB"], "٣٢GiB", None)
    doc = yaml.safe_load(yaml.safe_dump(BASE))
    doc["devices"][0]["name"] = "CUDA٠"
    with pytest.raises(InventoryError, match="expected a llama.cpp device name"):
        _load(tmp_path, doc)
    doc["devices"][0] = {"name": "CUDA0", "memory": "٨GiB"}
    with pytest.raises(InventoryError, match="memory: expected a size"):
        _load(tmp_path, doc)


def test_a_huge_size_is_refused_in_one_bounded_line():
    with pytest.raises(InventoryError) as info:
        inventory_from_cli(["CUDA0=" + "9" * 400 + "GiB"], "64GiB", None)
    assert len(str(info.value)) < 400


def test_an_empty_max_vram_is_refused():
    inventory = inventory_from_cli(["CUDA0=8GiB"], "64GiB", None)
    for text in ("", "  "):
        with pytest.raises(InventoryError, match="--max-vram '.*': empty"):
            parse_max_vram(inventory, text)
    assert parse_max_vram(inventory, None) == {}

