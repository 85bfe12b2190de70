"""`fitplan estimate` against llama.cpp's figures recorded on a real device (scripts/gpu_peer.sh).

Every file under tests/peer/data/<backend>/ is one measured record: `cuda/` from the pinned
llama.cpp built with CUDA for compute capability 9.0 and run on an NVIDIA GPU, `cpu/` the same
matrix rehearsed on the CPU backend. No GPU is needed here: the record carries llama.cpp's figures,
the inventory that describes the measured devices, and the argv of each row.

- Each `llama-fit-params --fit-print on` row: model and context equal to the MiB, compute within
  3 % or 4 MiB and never more than 1 MiB below (tests/support/estimate_matrix.py compute_ok).
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
from planner.measuring.llama_bench import effective_ubatch, timing_of_rows
from planner.memory.estimate import estimate
from scripts.gpu_peer import SPEED, expand, write_models
from tests.support.estimate_matrix import assert_rows_match

MIB = 2**20
DATA = Path(__file__).resolve().parent / "data"
RECORDS = {f"{p.parent.name}/{p.stem}": json.loads(p.read_text()) for p in sorted(DATA.glob("*/*.json"))}
ROWS = [(rec, i) for rec, doc in RECORDS.items() for i in range(len(doc["rows"]))]
LOADS = [(rec, i) for rec, doc in RECORDS.items() for i in range(len(doc["loads"]))]
SPEED_ROWS = [(rec, i) for rec, doc in RECORDS.items() for i in range(len(doc.get("speed", [])))]


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


def _row_param(rec: str, i: int):
    return pytest.param(rec, i, id=_row_id(rec, i))


@pytest.mark.parametrize("rec, i", [_row_param(r, i) for r, i in ROWS])
def test_estimate_matches_recorded_fit_print(contexts, inventories, rec, i):
    row = RECORDS[rec]["rows"][i]
    est = estimate(contexts[row["model"]], shlex.split(row["argv"]), inventories[rec, row["topology"]])
    assert_rows_match(est, row["devices"])


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


def test_every_listed_speed_placement_was_measured():
    """The llama-bench placements listed before the GPU ran (scripts/gpu_peer.py SPEED) are all in the record:
    none was dropped after the fact. The CPU rehearsal runs the small model's rows only."""
    for rec, doc in RECORDS.items():
        if "speed" not in doc:
            continue
        n_gpu_like = 3 if doc["backend"] == "cuda" else 2
        listed = [(m, t, shlex.join(expand(f, [], n_gpu_like)), d) for m, t, f, d in SPEED
                  if doc["backend"] == "cuda" or m == "gemma3-270m"]
        ran = [(r["model"], r["topology"], r["flags"], r["workload"]["n_depth"]) for r in doc["speed"]]
        assert not doc["speed_failures"], (rec, doc["speed_failures"][:3])
        assert ran == listed, rec

@pytest.mark.parametrize("rec, i", SPEED_ROWS,
                         ids=[f"{r}: {RECORDS[r]['speed'][i]['model']} {RECORDS[r]['speed'][i]['flags']}"
                              f" -d {RECORDS[r]['speed'][i]['workload']['n_depth']}" for r, i in SPEED_ROWS])
def test_speed_row_is_the_placement_it_names(rec, i):
    """Each llama-bench row ran the placement and workload it is filed under, on the record's backend: its
    own columns (n_gpu_layers, n_ubatch, n_depth, the backends it reports) say so, and it replays into the
    figures the throughput bench reads (bench/bench_gpu_throughput.py)."""
    row = RECORDS[rec]["speed"][i]
    flags, work = shlex.split(row["flags"]), row["workload"]
    bench = row["bench"]
    assert {(b["n_prompt"], b["n_gen"]) for b in bench} == {(work["n_prompt"], 0), (0, work["n_gen"])}
    for b in bench:
        assert b["n_depth"] == work["n_depth"] and len(b["samples_ts"]) == work["repeats"], b
        assert b["n_gpu_layers"] == int(flags[flags.index("-ngl") + 1]), b
        assert b["n_ubatch"] == (int(flags[flags.index("-ub") + 1]) if "-ub" in flags else 512), b
        if RECORDS[rec]["backend"] == "cuda":
            assert "CUDA" in b["backends"], b["backends"]
    timing = timing_of_rows(bench, flags, work["n_prompt"])
    assert timing.tg_tokens_s > 0 and timing.pp_tokens_s > 0
    assert timing.n_ubatch == effective_ubatch(flags, work["n_prompt"])
