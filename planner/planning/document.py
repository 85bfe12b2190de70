"""The deployment document `fitplan plan -o` writes and `fitplan validate` reads back: one
module, one schema, so the writer and its reader cannot drift apart."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from planner.core.errors import BadInput
from planner.core.llama_tools import LLAMA_CPP_PIN
from planner.hardware.inventory import Inventory, inventory_from_dict, inventory_to_dict
from planner.llama.flags import LlamaFlags, parse_llama_flags
from planner.llama.placement import HOST
from planner.planning.result import PlanResult, llama_argv, llama_bench_argv, plan_predicted, plan_rows

DEPLOYMENT_VERSION = 1


def deployment(result: PlanResult) -> dict[str, Any]:
    """The YAML deployment document: everything needed to launch and to re-check the plan."""
    return {
        "fitplan_deployment": DEPLOYMENT_VERSION,
        "llama_cpp": LLAMA_CPP_PIN,
        "model": {"path": result.model_path, "header_sha256": result.header_sha256},
        "inventory": inventory_to_dict(result.inventory),
        "budgets": {"devices": dict(result.budgets.devices), "host_bytes": result.budgets.host_bytes},
        "flags": " ".join(llama_argv(result)),
        "llama_bench_flags": " ".join(llama_bench_argv(result)),
        "ctx": result.n_ctx,
        "devices": plan_rows(result),
        "predicted": plan_predicted(result),
        "compute_model": result.estimate.compute_model,
    }


def deployment_yaml(result: PlanResult, doc: dict[str, Any] | None = None) -> str:
    """The deployment document as YAML (`doc`: one deployment(result) already built)."""
    return yaml.safe_dump(doc if doc is not None else deployment(result), sort_keys=False)


@dataclass(frozen=True)
class Deployment:
    """What a deployment document says, read back."""

    model_path: str
    header_sha256: str | None
    flags: LlamaFlags
    inventory: Inventory | None
    budgets: dict[str, int]      # device name -> bytes; HOST for the host's


def read_deployment(path: str) -> Deployment:
    """A deployment document as `deployment()` wrote it; a file that is not one is bad input."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
        model = doc["model"]
        flags = parse_llama_flags(str(doc["flags"]).split())
        inventory = inventory_from_dict(doc["inventory"], "plan") if doc.get("inventory") else None
        budgets = {str(k): int(v) for k, v in (doc.get("budgets", {}).get("devices") or {}).items()}
        if doc.get("budgets", {}).get("host_bytes"):
            budgets[HOST] = int(doc["budgets"]["host_bytes"])
        return Deployment(str(model["path"]), model.get("header_sha256"), flags, inventory, budgets)
    except OSError as e:
        raise BadInput(f"{path}: cannot read the plan: {e.strerror}") from None
    except (yaml.YAMLError, KeyError, TypeError, ValueError, AttributeError) as e:
        raise BadInput(f"{path}: not a fitplan plan file ({type(e).__name__}: {e})") from None
