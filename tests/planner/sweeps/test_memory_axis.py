"""What-if sweeps are honest: `memory=` varies the devices' memory (hardware the user does not have),
`budget=` only what a plan may use of the memory there is; a budget above it is said, never silent."""
from __future__ import annotations

import csv
import io
import logging
import subprocess
import sys

import pytest

from planner.api import as_flags, as_inventory
from planner.core.errors import FlagError
from planner.core.units import GiB, MiB
from planner.sweeps.sweep import CSV_COLUMNS, parse_axis, sweep
from planner.synth.gguf_factory import llama_spec
from tests.support.overhead import CUDA_MIB, cuda


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("memory_axis") / "m.gguf"
    [written] = llama_spec(n_layer=2, n_embd=256, n_head=8, n_head_kv=2, n_ff=512, n_vocab=1000).write(path)
    return str(written)


def test_a_budget_above_the_devices_memory_is_a_warning_and_a_column(model, caplog):
    # a 12 GiB card asked for 16 and 24 GiB budgets: both are capped at its 12 GiB, and say so
    with caplog.at_level(logging.WARNING):
        r = sweep(model, [parse_axis("budget", "8,16,24GiB")], as_inventory(["CUDA0=12GiB"]), as_flags("-c 1024"))
    rows = [row for row in csv.DictReader(io.StringIO(r.to_csv())) if row["device"] == "CUDA0"]
    assert [row["budget_capped"] for row in rows] == ["0", "1", "1"]
    assert [int(row["budget_bytes"]) for row in rows] == [8 * GiB, 12 * GiB, 12 * GiB]
    warnings = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.WARNING]
    assert any("budget=16GiB is above CUDA0's 12GiB" in w for w in warnings)
    assert any("budget=24GiB is above CUDA0's 12GiB" in w for w in warnings)
    assert "*" in r.to_table() and "capped at its free memory" in r.to_table()
    assert "budget_capped" in CSV_COLUMNS


def test_memory_varies_the_device_itself(model):
    # memory=16,24GiB: a 16 and a 24 GiB card in place of the 12 GiB one; budgets follow (free - 512 MiB)
    r = sweep(model, [parse_axis("memory", "16,24GiB")], as_inventory(["CUDA0=12GiB"]), as_flags("-c 1024"))
    budgets = [p.device("CUDA0").budget_bytes for p in r.points]
    assert budgets == [16 * GiB - 512 * MiB, 24 * GiB - 512 * MiB]
    assert not any(d.budget_capped for p in r.points for d in p.devices)


def test_memory_and_budget_together(model):
    # a 24 GiB budget on hypothetical 16 and 32 GiB cards: capped on the first only
    r = sweep(model, [parse_axis("memory", "16,32GiB"), parse_axis("budget", "24GiB")], as_inventory(["CUDA0=12GiB"]),
              as_flags("-c 1024"))
    assert [p.device("CUDA0").budget_bytes for p in r.points] == [16 * GiB, 24 * GiB]
    assert [p.device("CUDA0").budget_capped for p in r.points] == [True, False]


def test_memory_needs_devices_and_sizes_above_zero(model):
    with pytest.raises(FlagError, match="expected --device or --devices"):
        sweep(model, [parse_axis("memory", "16GiB")])
    with pytest.raises(FlagError, match="above 0"):
        parse_axis("memory", "0")


def test_a_sweep_point_fits_only_when_host_and_apu_fit_their_one_pool(model):
    # Vulkan0 is an APU: Host and Vulkan0 share the host's RAM. With 1 GiB each would "fit" alone;
    # their sum is what the machine has to hold.
    inv = as_inventory(["Vulkan0=ryzen-8700g"], ram="4GiB")
    flags = as_flags("-c 1024 -ngl 1")
    [roomy] = sweep(model, [parse_axis("budget", "1GiB")], inv, flags, max_ram="1GiB").points
    assert roomy.pool_fits is True and roomy.fits
    vulkan = roomy.device("Vulkan0")
    host, apu = roomy.device("Host").total_bytes, vulkan.total_bytes + vulkan.overhead_bytes   # the APU's overhead too
    tight_ram = f"{max(host, apu) + min(host, apu) // 2}B"   # either alone fits, not both together
    [tight] = sweep(model, [parse_axis("budget", "1GiB")], inv, flags, max_ram=tight_ram).points
    assert all(d.fits for d in tight.devices) and tight.pool_fits is False and not tight.fits
    rows = list(csv.DictReader(io.StringIO(sweep(model, [parse_axis("budget", "1GiB")], inv, flags,
                                                 max_ram=tight_ram).to_csv())))
    assert {row["pool_fits"] for row in rows} == {"0"} and {row["fits"] for row in rows} == {"0"}


def test_the_cli_warns_on_stderr_and_writes_the_column(model):
    # as a user runs it: a separate process, so the warning goes through fitplan's own logging
    done = subprocess.run([sys.executable, "-m", "planner.cli", "sweep", model, "--device", "CUDA0=12GiB",
                           "--vary", "budget=8,16GiB", "--", "-c", "1024"], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "fitplan: --vary budget=16GiB is above CUDA0's 12GiB of free memory" in done.stderr
    rows = [r for r in csv.DictReader(io.StringIO(done.stdout)) if r["device"] == "CUDA0"]
    assert [(r["budget"], r["budget_capped"], r["budget_bytes"]) for r in rows] == [
        ("8GiB", "0", str(8 * GiB)), ("16GiB", "1", str(12 * GiB))]


def test_plan_mode_plans_on_the_hypothetical_device(model):
    # a plan per memory value, on a card of that size: its budget follows (free - 512 MiB)
    # (cards of 1 and 2 GiB beside the CUDA overhead the plan counts within the budget)
    r = sweep(model, [parse_axis("memory", f"{cuda(1024)},{cuda(2048)}"), parse_axis("ctx", "1024")],
              as_inventory(["CUDA0=rtx3060"], ram="16GiB"), mode="plan")
    assert all(p.feasible for p in r.points)
    assert [p.device("CUDA0").budget_bytes for p in r.points] == [(1024 + CUDA_MIB - 512) * MiB,
                                                                 (2048 + CUDA_MIB - 512) * MiB]
