"""The overhead term (planner/llama/overhead.py) against the GPU records' real loads: no GPU needed.

Each real load in a CUDA record carries nvidia-smi's used memory before llama-server started and while it
served (after one completion). The rpc-servers of the `three` topology run throughout, so their own
overhead is in `before`; what the load adds is the buffers llama.cpp's breakdown lists on the GPU (every
device row of the load is the one GPU: CUDA0 and the rpc-servers behind RPC0/RPC1) plus the overhead the
llama.cpp process holds (the rows fitplan's estimate gives a llama.cpp-process overhead). The breakdown's
`self` column is the sum of its MiB figures, so the two sides are compared within 32 MiB.
"""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from planner.hardware.inventory_yaml import load_inventory
from planner.llama.overhead import ProcessKind
from planner.llama.placement import HOST_ROWS
from planner.memory.estimate import estimate
from planner.synth.shapes_common import gemma3_270m_layout

MIB = 2**20
TOLERANCE_MIB = 32
DATA = Path(__file__).resolve().parent / "data" / "cuda"
RECORDS = {p.stem: json.loads(p.read_text()) for p in sorted(DATA.glob("*.json"))}
LOADS = [(rec, i) for rec, doc in RECORDS.items() for i, load in enumerate(doc["loads"])
         if (load.get("nvidia_smi_used_mib") or {}).get("loaded") is not None]


@pytest.fixture(scope="module")
def gemma(tmp_path_factory) -> Path:
    """The loads' model (the record's gemma3-270m header), written sparse: the estimate reads no weight."""
    [path] = gemma3_270m_layout().write(tmp_path_factory.mktemp("overhead") / "gemma3-270m.gguf")
    return path


def _inventory(tmp: Path, rec: str, topology: str):
    path = tmp / f"{rec}-{topology}.yaml"
    path.write_text(yaml.safe_dump(RECORDS[rec]["inventory"][topology]))
    return load_inventory(path)


def test_the_record_has_real_loads_with_nvidia_smi():
    assert len(LOADS) >= 5, LOADS


@pytest.mark.parametrize("rec, i", LOADS, ids=[f"{r}: {RECORDS[r]['loads'][i]['plan']}" for r, i in LOADS])
def test_growth_is_breakdown_plus_modelled_overhead(gemma, tmp_path, rec, i):
    load = RECORDS[rec]["loads"][i]
    assert load["model"] == "gemma3-270m", load["model"]
    est = estimate(str(gemma), shlex.split(load["argv"]), _inventory(tmp_path, rec, load["topology"]))
    process = sum(o.bytes for _, o in est.overheads if o.process is ProcessKind.LLAMA)
    gpu_buffers = sum(row.get("self", 0) for name, row in load["breakdown"].items() if name not in HOST_ROWS)
    smi = load["nvidia_smi_used_mib"]
    growth = smi["loaded"] - smi["before"]
    assert abs(growth - (gpu_buffers + process // MIB)) <= TOLERANCE_MIB, (growth, gpu_buffers, process // MIB)


@pytest.mark.parametrize("rec", sorted(RECORDS))
def test_idle_rpc_servers_hold_the_modelled_overhead(tmp_path, gemma, rec):
    """Before the first load only the record's two CUDA rpc-servers ran on the GPU: the used memory then is
    their modelled overhead, twice."""
    doc = RECORDS[rec]
    first = doc["loads"][0]["nvidia_smi_used_mib"]["before"]
    argv = ["-dev", ",".join(d["name"] for d in doc["inventory"]["three"]["devices"]),
            "--rpc", ",".join(doc["rpc_endpoints"]), "-c", "4096"]
    est = estimate(str(gemma), argv, _inventory(tmp_path, rec, "three"))
    servers = [o for _, o in est.overheads if o.process is ProcessKind.RPC_SERVER]
    assert len(servers) == len(doc["rpc_endpoints"]) == 2
    assert all(o.measured for _, o in est.overheads), est.overheads
    assert abs(first - sum(o.bytes for o in servers) // MIB) <= TOLERANCE_MIB, (first, servers)
