"""The inventory YAML's `calibrated:` block: read back what calibrate writes; wrong keys are one error."""
from __future__ import annotations

import pytest
import yaml

from planner.core.errors import InventoryError
from planner.core.units import GiB
from planner.hardware.inventory import (
    Backend,
    CalibratedFigure,
    Calibration,
    DeviceKind,
    DeviceSpec,
    HostSpec,
    Inventory,
    Quantity,
)
from planner.hardware.inventory_yaml import inventory_yaml_dict, load_inventory

CAL = Calibration("2026-12-01T15:00:00+00:00", "llama-bench by hand", "llama-bench test", (
    CalibratedFigure("CPU", Quantity.BANDWIDTH, 9.5e9, "tg: bytes per token ÷ seconds per token"),
    CalibratedFigure("CPU", Quantity.FLOPS, 0.25e12, "pp: FLOPs ÷ seconds"),
    CalibratedFigure("RPC0", Quantity.SPLIT_LATENCY, 250e-6, "the slope against boundaries"),
    CalibratedFigure("RPC0", Quantity.LINK, 1.5e9, "boundary copy"),
    CalibratedFigure("RPC0", Quantity.ATTENTION_BANDWIDTH, 2.2e9, "tg at two depths"),
    CalibratedFigure("CPU", Quantity.ATTENTION_FLOPS, 0.04e12, "pp at two depths"),
    CalibratedFigure("CPU", Quantity.ATTENTION_CELLS, 24e6, "tg at two depths of one placement"),
    CalibratedFigure("CPU", Quantity.ATTENTION_VALUES, 9e9, "tg at two depths of two head widths"),
    CalibratedFigure("RPC0", Quantity.ATTENTION_SWEEP, 12.5e9, "tg at two depths, bytes the query heads sweep"),
))
INV = Inventory((DeviceSpec("RPC0", DeviceKind.RPC, Backend.RPC, 4 * GiB, 3 * GiB, 0, 0, 0,
                            endpoint="127.0.0.1:50052", description="CPU"),),
                HostSpec(16 * GiB, 12 * GiB, 0, "test cpu"), calibration=CAL)


def _write(tmp_path, doc) -> str:
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=True))
    return str(path)


def test_what_calibrate_writes_loads_back(tmp_path):
    back = load_inventory(_write(tmp_path, inventory_yaml_dict(INV, "example:gemma3-270m")))
    assert back.names == ["RPC0"] and back.devices[0].endpoint == "127.0.0.1:50052"
    assert back.host.ram_total_bytes == 16 * GiB and back.host.ram_available_bytes == 12 * GiB
    assert back.calibration is not None
    assert back.calibration.figure("CPU", Quantity.BANDWIDTH) == pytest.approx(9.5e9)
    assert back.calibration.figure("RPC0", Quantity.SPLIT_LATENCY) == pytest.approx(250e-6)
    assert back.calibration.figure("RPC0", Quantity.LINK) == pytest.approx(1.5e9)
    assert back.calibration.figure("RPC0", Quantity.ATTENTION_BANDWIDTH) == pytest.approx(2.2e9)
    assert back.calibration.figure("CPU", Quantity.ATTENTION_FLOPS) == pytest.approx(0.04e12)
    assert back.calibration.figure("CPU", Quantity.ATTENTION_CELLS) == pytest.approx(24e6)
    assert back.calibration.figure("CPU", Quantity.ATTENTION_VALUES) == pytest.approx(9e9)
    assert back.calibration.figure("RPC0", Quantity.ATTENTION_SWEEP) == pytest.approx(12.5e9)
    assert {f.how for f in back.calibration.figures} == {f.how for f in CAL.figures}


def test_the_block_says_how_next_to_each_figure(tmp_path):
    doc = inventory_yaml_dict(INV)
    assert doc["calibrated"]["host"]["bandwidth_gbs"] == {"value": 9.5, "how": CAL.figures[0].how}
    assert doc["calibrated"]["devices"]["RPC0"]["split_latency_us"]["value"] == 250
    assert doc["calibrated"]["host"]["attention_gvalues"]["value"] == 9
    assert doc["calibrated"]["devices"]["RPC0"]["attention_sweep_gbs"]["value"] == 12.5


@pytest.mark.parametrize(("change", "message"), [
    (lambda c: c["host"].update(bandwidth_gb=c["host"].pop("bandwidth_gbs")),
     r"calibrated\.host\.bandwidth_gb: unknown key \(did you mean 'bandwidth_gbs'\?\)"),
    (lambda c: c.update(when=c.pop("date")), r"calibrated\.when: unknown key"),
    (lambda c: c["devices"].update(RPC7=c["devices"].pop("RPC0")), r"calibrated\.devices\.RPC7: not a device"),
    (lambda c: c["host"]["fp16_tflops"].pop("how"), r"calibrated\.host\.fp16_tflops\.how: missing"),
    (lambda c: c["host"]["fp16_tflops"].update(value="fast"), r"calibrated\.host\.fp16_tflops\.value: expected"),
])
def test_a_wrong_key_is_one_error_naming_its_place(tmp_path, change, message):
    doc = inventory_yaml_dict(INV)
    change(doc["calibrated"])
    with pytest.raises(InventoryError, match=message):
        load_inventory(_write(tmp_path, doc))
