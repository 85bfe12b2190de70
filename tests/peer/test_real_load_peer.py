"""Plans as llama-server really loads them: for eight plans over five architectures (the Gemma 3 270M
example, and the Llama-8B, Qwen2-7B, LFM2-1.2B and Granite-4.0-H shapes of planner/synth/shapes_common.py) on
two loopback rpc-servers under --max-vram budgets (and one on the host alone), the plan's own printed
llama-server line runs once with -v; the buffers it logs while loading (model, KV and compute per device,
host buffers folded into Host as the plan's rows are) equal the plan's rows — model and context to 1 MiB,
compute within 3 % or 4 MiB — and no device holds more than its budget. The host's weights are the one
accounting llama.cpp does differently at load: its CPU_Mapped buffer is the span of the memory-mapped
file from the first host tensor to the last (file pages, which the kernel may drop, and which cover the
repacked tensors' original bytes and the offloaded layers' lying between), where the plan, as
llama-fit-params, counts the host tensors. So the host's repacked weights (CPU_REPACK, allocated) must
equal the plan's CPU_REPACK row, and the mapped span must hold at least the plan's Host weights.

The plans are sized as llama-server loads them (planner/llama/programs.py): one output row per slot on
the device that holds the output layer, a real reserve. Gemma 3 at -ub 256 on 105/125 MiB is the
issue's case whose host compute was planned at 257 MiB (a whole ubatch of its 262144-token vocabulary's
logits) where llama-server allocates 18."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cli import main
from planner.core.units import MiB
from planner.llama.placement import CPU_REPACK, HOST, HOST_ROWS
from planner.running.tool_runs import parse_model_loads, rows_by_device, start_server, wait_ready
from planner.system.llama_tools import LOOPBACK, free_port, stop_process
from tests.support.command_matrix import CPU_ONLY, PlanCase, _rpc

pytestmark = pytest.mark.peer

SLACK = MiB                     # model and context: llama.cpp logs MiB to two decimals
COMPUTE_REL, COMPUTE_ABS = 0.03, 4 * MiB

PLANS = (
    PlanCase("gemma3-270m", _rpc(100, 100), ("--ram", "4GiB", "--ctx", "4096")),
    PlanCase("gemma3-270m", _rpc(105, 125), ("--ram", "4GiB", "--ubatch-size", "256")),
    PlanCase("gemma3-270m", (), ("--devices", CPU_ONLY, "--ram", "4GiB", "--ctx", "4096", "--parallel", "2")),
    PlanCase("llama-8b", _rpc(1300, 1700), ("--ram", "16GiB", "--ctx", "4096", "--ubatch-size", "128")),
    PlanCase("llama-8b", _rpc(2048, 1024), ("--ram", "16GiB", "--ctx", "4096", "--cache-type", "q8_0")),
    PlanCase("qwen2-7b", _rpc(1536, 1536), ("--ram", "16GiB", "--ctx", "8192", "--parallel", "2")),
    PlanCase("lfm2-1.2b", _rpc(256, 256), ("--ram", "4GiB", "--ctx", "8192")),
    PlanCase("granite-hybrid", _rpc(512, 512), ("--ram", "8GiB", "--ctx", "4096")),
)
# files small enough for a shared CI box: a MoE shape's host part (Qwen3-30B-A3B: 9.5 GiB of experts) is
# repacked at load for minutes on two cores; its compute is covered against llama-fit-params elsewhere
LOAD_TIMEOUT_S = 300


def _loaded(llama_tools: Path, argv: list[str], endpoints: list[str], log_path: Path) -> dict[str, dict[str, int]]:
    """The buffers of the target's load, per plan row (RPC0, RPC1, Host) and kind."""
    port = free_port()
    proc = start_server([str(llama_tools / "llama-server"), *argv, "--host", LOOPBACK, "--port", str(port), "-v"],
                        log_path)
    try:
        wait_ready(proc, port, log_path, timeout_s=LOAD_TIMEOUT_S)
    finally:
        stop_process(proc)
    [target] = parse_model_loads(log_path.read_text(errors="replace"))
    rows = rows_by_device(target, {f"RPC{i}": ep for i, ep in enumerate(endpoints)})
    if HOST in rows:   # the mapped span and the repacked weights apart
        repacked = target.get((CPU_REPACK, "model"), 0)
        rows[HOST]["model"] -= repacked
        if repacked:
            rows[CPU_REPACK] = {"model": repacked}
    return rows


def _planned(doc: dict) -> dict[str, dict[str, int]]:
    """The plan's rows by name, with their budget (0 for the host's: see the module's docstring)."""
    return {row["name"]: {"model": row["model_bytes"], "context": row["context_bytes"],
                          "compute": row["compute_bytes"], "budget": 0 if row["name"] in HOST_ROWS else
                          row["budget_bytes"]} for row in doc["devices"]}


@pytest.mark.parametrize("case", PLANS, ids=[c.label for c in PLANS])
def test_the_plans_llama_server_line_allocates_the_plans_rows(capsys, tmp_path, llama_tools, rpc_endpoints,
                                                               shapes_dir, case: PlanCase):
    doc_path = tmp_path / "plan.json"
    code = main([*case.argv(shapes_dir, rpc_endpoints), "-o", str(doc_path)])
    _, err = capsys.readouterr()
    assert code == 0, err
    doc = json.loads(doc_path.read_text())
    assert doc["argv"][:2] == ["-m", doc["model"]["path"]]
    loaded = _loaded(llama_tools, doc["argv"], rpc_endpoints, tmp_path / "server.log")
    planned = _planned(doc)
    figures = []
    for name, plan in planned.items():
        got = loaded.get(name, {})
        model, context, compute = (got.get(k, 0) for k in ("model", "context", "compute"))
        if name == HOST:   # the mapped span holds the plan's host weights
            assert model >= plan["model"] - SLACK, (name, "model", model / MiB, plan["model"] / MiB)
        else:
            assert abs(model - plan["model"]) <= SLACK, (name, "model", model / MiB, plan["model"] / MiB)
        assert abs(context - plan["context"]) <= SLACK, (name, "context", context / MiB, plan["context"] / MiB)
        assert abs(compute - plan["compute"]) <= max(COMPUTE_REL * compute, COMPUTE_ABS), \
            (name, "compute", compute / MiB, plan["compute"] / MiB)
        if plan["budget"]:
            assert model + context + compute <= plan["budget"], (name, (model + context + compute) / MiB,
                                                                 plan["budget"] / MiB)
        figures.append(f"{name} model {model / MiB:.2f} / {plan['model'] / MiB:.2f}, "
                       f"compute {compute / MiB:.2f} / {plan['compute'] / MiB:.2f}"
                       + (f", total {(model + context + compute) / MiB:.0f} of {plan['budget'] / MiB:.0f}"
                          if plan["budget"] else ""))
    assert set(loaded) <= set(planned), (loaded, planned)
    print(f"\n[{case.label}] llama-server / plan MiB: " + "; ".join(figures))
