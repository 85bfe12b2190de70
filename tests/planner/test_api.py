"""The public API: `planner.model.inspect/estimate/sweep/plan(...)`, cheap `import planner`, the input forms.

Model and figures as in tests/planner/sweeps/test_sweep.py: llama_spec(n_layer=2, n_embd=256, n_head=8,
n_head_kv=2, ...); KV per layer and cell 256 bytes in f16, so -c 1024 on one GPU is
2 x 1024 x 256 = 524288 bytes.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import planner
from planner.api import as_flags, as_inventory
from planner.core.errors import BadInput, FlagError
from planner.core.units import GiB
from planner.memory.estimate import Estimate
from planner.model.inspect import InspectResult
from planner.sweeps.sweep import SweepResult
from planner.synth.gguf_factory import llama_spec
from tests.support.overhead import CUDA_MIB, cuda

ROOT = Path(__file__).resolve().parents[2]
KV_1024 = 2 * 1024 * 256


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("api") / "m.gguf"
    [written] = llama_spec(n_layer=2).write(path)
    return str(written)


def _python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_import_planner_loads_nothing_heavy():
    out = _python("import sys, planner; print(sorted(m for m in ('numpy', 'gguf', 'planner.memory.estimate', "
                  "'planner.api', 'matplotlib') if m in sys.modules))")
    assert out == "[]"


def test_calls_work_whichever_import_came_first(model):
    # a submodule imported first (as the CLI does) must not replace the callable
    out = _python("import planner.memory.estimate as m, planner; "
                  f"e = planner.estimate({model!r}, '-c 1024', ['CUDA0=1GiB']); "
                  "print(type(e).__name__, callable(m.model_context), e.device('CUDA0').context_bytes)")
    assert out == f"Estimate True {KV_1024}"


def test_inspect(model):
    r = planner.inspect(model)
    assert isinstance(r, InspectResult) and r.to_dict()["n_layer"] == 2


def test_estimate_takes_a_string_a_list_or_flags(model):
    by_string = planner.estimate(model, "-c 1024", ["CUDA0=1GiB"])
    by_list = planner.estimate(model, ["-c", "1024"], ["CUDA0=1GiB"])
    by_flags = planner.estimate(model, as_flags("-c 1024"), as_inventory(["CUDA0=1GiB"]))
    assert isinstance(by_string, Estimate)
    assert by_string.to_dict() == by_list.to_dict() == by_flags.to_dict()
    assert by_string.to_dict()["devices"][0] == {"name": "CUDA0", "model_bytes": by_string.devices[0].model_bytes,
                                                 "context_bytes": KV_1024,
                                                 "compute_bytes": by_string.devices[0].compute_bytes,
                                                 "overhead_bytes": CUDA_MIB * 2**20}


def test_estimate_for_llama_server(model):
    # llama-server without -np runs 4 slots sharing one cache (tools/server/server.cpp)
    served = planner.estimate(model, "-c 1024", ["CUDA0=1GiB"], program="server")
    assert served.to_dict()["program"] == "server" and served.cparams.n_seq == 4
    assert planner.estimate(model, "-c 1024", ["CUDA0=1GiB"]).cparams.n_seq == 1
    with pytest.raises(BadInput, match="--program 'bench'"):
        planner.estimate(model, "-c 1024", program="bench")


def test_estimate_refuses_bad_flags(model):
    with pytest.raises(FlagError):
        planner.estimate(model, "-c lots")


def test_sweep(model):
    r = planner.sweep(model, {"ctx": "1024,2048"}, ["CUDA0=1GiB"])
    assert isinstance(r, SweepResult)
    assert [p.device("CUDA0").context_bytes for p in r.points] == [KV_1024, 2 * KV_1024]


def test_inventory_forms():
    assert as_inventory(None) is None
    yaml_inv = as_inventory(ROOT / "configs" / "devices" / "workstation-2x3090.yaml")
    assert yaml_inv.names == ["CUDA0", "CUDA1"]
    assert as_inventory(str(ROOT / "configs" / "devices" / "workstation-2x3090.yaml")).names == ["CUDA0", "CUDA1"]
    cli = as_inventory(["CUDA0=8GiB", "CUDA1=4GiB"], ram="32GiB")
    assert [(d.name, d.total_bytes) for d in cli.devices] == [("CUDA0", 8 * GiB), ("CUDA1", 4 * GiB)]
    assert cli.host.ram_total_bytes == 32 * GiB
    assert as_inventory(yaml_inv, ram="8GiB").host.ram_available_bytes == 8 * GiB


def test_plan_needs_the_hosts_ram(model):
    with pytest.raises(BadInput, match="RAM"):
        planner.plan(model, ["CUDA0=1GiB"])


def test_plan_takes_request_fields(model):
    r = planner.plan(model, [f"CUDA0={cuda(1024)}"], ram="16GiB", n_ctx=1024)
    assert r.n_ctx == 1024 and "-c 1024" in r.to_dict()["flags"]


def test_validate_runs_the_embedded_engine(tmp_path):
    from planner.synth.tiny_models import write_tiny

    path = write_tiny(tmp_path / "t.gguf", "llama")
    r = planner.validate(str(path), "-c 256", ["CUDA0=1GiB"], ram="8GiB", n_prompt=4, n_gen=2)
    d = r.to_dict()
    assert [x["name"] for x in d["devices"]] == ["CUDA0", "Host"]
    # CUDA0 has 1 GiB free: the default budget keeps 512 MiB back (planner/hardware/budgets.py)
    assert d["devices"][0]["budget_bytes"] == GiB // 2
    assert d["fits"] is True
    # without devices every layer runs on the CPU (the host's buffers only)
    cpu_only = planner.validate(str(path), "-c 256", n_prompt=4, n_gen=2)
    assert [x.name for x in cpu_only.devices] == ["Host"]
