"""`fitplan estimate` against llama.cpp's figures recorded on a real device (scripts/gpu_peer.sh).

Every file under tests/peer/data/<backend>/ is one measured record: `cuda/` from the pinned
llama.cpp built with CUDA for compute capability 9.0 and run on an NVIDIA GPU, `cpu/` the same
matrix rehearsed on the CPU backend. No GPU is needed here: the record carries llama.cpp's figures,
the inventory that describes the measured devices, and the argv of each row.

- Each `llama-fit-params --fit-print on` row: model and context equal to the MiB, compute within
  3 % or 4 MiB and never more than 1 MiB below (tests/support/shapes.py compute_ok).
- Each real load (llama-server with the flags of a plan fitplan made beforehand for stated budgets,
  scripts/gpu_peer_plans.json): it served a request, and the memory breakdown it printed at
  shutdown is within the plan's budget on every device.

A CUDA record covers the one compute capability it was built for and measured on (the lent GPU:
9.0, an H200); another GPU is another file (README: "The CUDA record").
"""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from planner.hardware.inventory import Inventory
from planner.hardware.inventory_yaml import load_inventory
from planner.llama.context import ModelContext, model_context
from planner.llama.placement import CPU_REPACK, HOST
from planner.memory.estimate import estimate
from scripts.gpu_peer import write_models
from tests.support.shapes import compute_ok

MIB = 2**20
DATA = Path(__file__).resolve().parent / "data"
RECORDS = {f"{p.parent.name}/{p.stem}": json.loads(p.read_text()) for p in sorted(DATA.glob("*/*.json"))}
ROWS = [(rec, i) for rec, doc in RECORDS.items() for i in range(len(doc["rows"]))]
LOADS = [(rec, i) for rec, doc in RECORDS.items() for i in range(len(doc["loads"]))]


def _row_id(rec: str, i: int) -> str:
    row = RECORDS[rec]["rows"][i]
    return f"{rec}: {row['model']} [{row['topology']}] {row['flags']}"


@pytest.fixture(scope="module")
def contexts(tmp_path_factory) -> dict[str, ModelContext]:
    """The record's models, written here sparse: the same headers the GPU machine wrote."""
    return {name: model_context(str(path))
            for name, path in write_models(tmp_path_factory.mktemp("gpu-models"), random_gemma=False).items()}


@pytest.fixture(scope="module")
def inventories(tmp_path_factory) -> dict[tuple[str, str], Inventory]:
    out = {}
    directory = tmp_path_factory.mktemp("gpu-inventories")
    for rec, doc in RECORDS.items():
        for topology, inv in doc["inventory"].items():
            path = directory / f"{rec.replace('/', '-')}-{topology}.yaml"
            path.write_text(yaml.safe_dump(inv))
            out[rec, topology] = load_inventory(path)
    return out


def test_records_are_complete():
    """The issue's minimum for a real GPU: 40 dry-run rows and 5 real loads, and the GPU named."""
    assert RECORDS, "no record under tests/peer/data"
    for rec, doc in RECORDS.items():
        assert len(doc["rows"]) >= 40 and len(doc["loads"]) >= 5, rec
        assert not doc["failures"], (rec, doc["failures"][:3])
        if doc["backend"] == "cuda":
            gpu = doc["gpu"]
            # the build's one architecture is the GPU's: its figures hold for that compute capability
            arch = "".join(line.split("sm_")[-1] for line in doc["llama_cpp"]["build"] if line.startswith("arch:"))
            assert gpu["compute_capability"].replace(".", "") == arch, (gpu, doc["llama_cpp"]["build"])
            assert gpu["name"] and gpu["driver"] and gpu["cuda"], gpu
        assert "0c1e570" in doc["llama_cpp"]["version"], doc["llama_cpp"]


def test_record_models_are_the_headers_written_here(contexts):
    """A record's figures belong to its models: the headers written here are byte-identical."""
    for rec, doc in RECORDS.items():
        for name, model in doc["models"].items():
            assert contexts[name].model.header_sha256 == model["header_sha256"], (rec, name)


@pytest.mark.parametrize("rec, i", ROWS, ids=[_row_id(r, i) for r, i in ROWS])
def test_estimate_matches_recorded_fit_print(contexts, inventories, rec, i):
    row = RECORDS[rec]["rows"][i]
    est = estimate(contexts[row["model"]], shlex.split(row["argv"]), inventories[rec, row["topology"]])
    ours = {d.name: d for d in est.devices if d.name != CPU_REPACK}
    theirs = row["devices"]
    assert list(ours) == list(theirs)
    for device, (model_mib, context_mib, compute_mib) in theirs.items():
        mine = ours[device]
        assert (mine.model_bytes // MIB, mine.context_bytes // MIB) == (model_mib, context_mib), device
        assert compute_ok(mine.compute_bytes / MIB, compute_mib, est.compute_model), \
            (device, est.compute_model, round(mine.compute_bytes / MIB, 2), compute_mib)


@pytest.mark.parametrize("rec, i", LOADS, ids=[f"{r}: {RECORDS[r]['loads'][i]['plan']}" for r, i in LOADS])
def test_real_load_within_plan_budgets(rec, i):
    load = RECORDS[rec]["loads"][i]
    assert load["ok"], load.get("error") or load.get("exit_code")
    breakdown = load["breakdown"]
    for device, budget_mib in load["budgets_mib"].items():
        used = breakdown.get(device, {}).get("self", 0)
        if device == HOST:   # the host budget holds every host buffer type llama.cpp lists on its own
            used += breakdown.get(CPU_REPACK, {}).get("self", 0)
        assert used <= budget_mib, (device, used, budget_mib)
