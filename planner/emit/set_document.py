"""A set plan as data and text (`fitplan plan-set --format json|yaml|table`, `-o`): every model's plan
as `fitplan plan` reports it, the on-demand units' load costs, and per set of models loaded at one time
each device row per model and summed against its budget. The exports (router preset, llama-swap) are
written from this document, never from the plan objects."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from planner.core.errors import BadInput
from planner.core.render import table
from planner.core.units import fmt_bytes, fmt_mib
from planner.hardware.inventory import inventory_to_dict
from planner.llama.commands import LLAMA_SERVER, command_line
from planner.llama.flags import FLAGS
from planner.llama.placement import HOST
from planner.search.result import llama_argv, plan_argv, plan_rows
from planner.search.set_input import Role
from planner.search.set_plan import ModelPlan, SetPlan, SetState, set_rows
from planner.system.files import read_bounded
from planner.system.llama_tools import LLAMA_CPP_PIN
from planner.system.schema import Where, load_yaml

SET_PLAN_VERSION = 1
EMBEDDINGS = FLAGS["embeddings"].names[0]   # llama-server serves /v1/embeddings only with it (common/arg.cpp)


def server_args(p: ModelPlan) -> list[str]:
    """llama-server's arguments for one model of the set: its plan's, and --embeddings for an embedder."""
    return plan_argv(p.result) + ([EMBEDDINGS] if p.entry.role is Role.EMBEDDING else [])


def _model_doc(p: ModelPlan) -> dict[str, Any]:
    r, e = p.result, p.entry
    return {"name": e.name, "model": r.model_path, "header_sha256": r.header_sha256, "role": e.role.value,
            "residency": e.resident.value, "resident": p.resident, "demoted": p.demoted, "group": e.group,
            "priority": e.priority, "ctx": r.n_ctx, "ctx_per_slot": r.n_ctx // r.flags.n_parallel,
            "n_parallel": r.flags.n_parallel, "cache_type": r.flags.cache_type_k,
            "flags": " ".join(llama_argv(r)), "argv": server_args(p),
            "devices": [{**row, "name": p.box_name(row["name"])} for row in plan_rows(r)],
            "compute_model": r.estimate.compute_model}


def _state_doc(plan: SetPlan, state: SetState) -> dict[str, Any]:
    rows = set_rows(state)
    for row in rows:
        row["budget_bytes"] = plan.budgets.host_bytes if row["name"] == HOST else plan.budgets.devices.get(row["name"])
    return {"name": state.name, "models": list(state.models), "devices": rows}


def set_document(plan: SetPlan) -> dict[str, Any]:
    budgets: dict[str, Any] = {"devices": dict(plan.budgets.devices), "host_bytes": plan.budgets.host_bytes}
    return {
        "fitplan_set_plan": SET_PLAN_VERSION,
        "llama_cpp": LLAMA_CPP_PIN,
        "source": plan.spec.source,
        "inventory": inventory_to_dict(plan.inventory),
        "budgets": budgets,
        "disk_read_bytes_s": plan.spec.disk_read_bytes_s,
        "models": [_model_doc(p) for p in plan.models],
        "on_demand": [{"unit": o.unit, "models": list(o.members), "load_bytes": o.load_bytes,
                       "load_seconds": o.load_seconds, "evicts": list(o.evicts)} for o in plan.on_demand],
        "sets": [_state_doc(plan, s) for s in plan.states],
    }


def _model_line(m: dict[str, Any]) -> str:
    where = "resident" if m["resident"] else "on demand" + (" (did not fit beside the resident set)"
                                                             if m["demoted"] else "")
    group = f", group {m['group']}" if m["group"] else ""
    return (f"{m['name']} ({m['role']}, {where}{group}, priority {m['priority']}): context {m['ctx']}, "
            f"{m['n_parallel']} slot(s) of {m['ctx_per_slot']}, KV {m['cache_type']}")


def _state_table(s: dict[str, Any]) -> list[str]:
    names = s["models"]
    rows = []
    for r in s["devices"]:
        budget = r["budget_bytes"]
        left = "-" if budget is None else fmt_mib(budget - r["total_bytes"])
        rows.append([r["name"], *(fmt_mib(r["models"].get(n, 0)) for n in names), fmt_mib(r["total_bytes"]),
                     "-" if budget is None else fmt_mib(budget), left])
    head = ["device", *(f"{n} MiB" for n in names), "total MiB", "budget MiB", "headroom MiB"]
    return [f"loaded together: {', '.join(names)}", table(head, rows)]


def set_table(doc: dict[str, Any]) -> str:
    lines = [f"{doc['source']}: {len(doc['models'])} models"]
    for m in doc["models"]:
        lines += ["", _model_line(m), "  " + command_line(LLAMA_SERVER, m["argv"])]
    for o in doc["on_demand"]:
        seconds = "" if o["load_seconds"] is None else f", {o['load_seconds']:.1f} s at the disk's read rate"
        lines += ["", f"on demand {o['unit']}: loads {fmt_bytes(o['load_bytes'])}{seconds}; "
                  f"evicts {', '.join(o['evicts']) or 'nothing'} (the resident set stays)"]
    for s in doc["sets"]:
        lines += ["", *_state_table(s)]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class SetReport:
    """A set plan with its document (`fitplan plan-set --format table|json|yaml`, `planner.plan_set`)."""

    plan: SetPlan

    def to_dict(self) -> dict[str, Any]:
        return set_document(self.plan)

    def to_table(self) -> str:
        return set_table(self.to_dict())


def is_set_plan(path: str) -> bool:
    """Whether the file is a set plan (`fitplan_set_plan` at its top) rather than one model's plan."""
    try:
        head = read_bounded(path, what="plan")[:4096].decode("utf-8", errors="replace")
    except BadInput:
        return False
    return re.search(r'^\{?\s*"?fitplan_set_plan"?\s*:', head, re.MULTILINE) is not None


def read_set_plan(path: str) -> dict[str, Any]:
    doc = load_yaml(read_bounded(path, what="set plan"), Where(path))
    if not isinstance(doc, dict) or doc.get("fitplan_set_plan") != SET_PLAN_VERSION or \
            not isinstance(doc.get("models"), list) or not isinstance(doc.get("on_demand"), list):
        raise BadInput(f"{path}: not a fitplan set plan (expected `fitplan plan-set -o` output, "
                       f"fitplan_set_plan: {SET_PLAN_VERSION})")
    return doc
