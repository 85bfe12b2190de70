"""The deployment document `fitplan plan -o` writes and `fitplan validate` reads back: one
module, one schema, so the writer and its reader cannot drift apart."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from planner.core.errors import BadInput
from planner.core.llama_tools import LLAMA_CPP_PIN
from planner.hardware.inventory import Inventory, inventory_from_dict, inventory_to_dict
from planner.llama.flags import LlamaFlags, flags_to_argv, parse_llama_flags
from planner.llama.placement import HOST
from planner.planning.commands import model_args
from planner.planning.result import PlanResult, plan_commands, plan_predicted, plan_rows

DEPLOYMENT_VERSION = 1


def deployment(result: PlanResult) -> dict[str, Any]:
    """The YAML deployment document: everything needed to launch and to re-check the plan."""
    return {
        "fitplan_deployment": DEPLOYMENT_VERSION,
        "llama_cpp": LLAMA_CPP_PIN,
        "model": {"path": result.model_path, "header_sha256": result.header_sha256},
        "inventory": inventory_to_dict(result.inventory),
        "budgets": {"devices": dict(result.budgets.devices), "host_bytes": result.budgets.host_bytes},
        **plan_commands(result),
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
    flags: LlamaFlags            # parsed from `argv`, so the two cannot disagree
    inventory: Inventory | None
    budgets: dict[str, int]      # device name -> bytes; HOST for the host's
    argv: tuple[str, ...] = ()   # llama-server's / llama-cli's arguments: `-m MODEL` (or `-mu URL`), the flags

    @property
    def flag_argv(self) -> tuple[str, ...]:
        """`argv` without its leading model pair (read_deployment checks that it has one); a
        Deployment made without `argv` gives its flags' shortest argv."""
        if not self.argv:
            return tuple(flags_to_argv(self.flags))
        return self.argv[len(model_args(self.model_path)):]


def _argv(doc: dict[str, Any], model_path: str) -> tuple[str, ...]:
    """The document's argument vector; one written before fitplan stored it is rebuilt from
    `flags` (then a space-joined string, which no flag value of those plans contained)."""
    if doc.get("argv") is not None:
        argv = doc["argv"]
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            raise TypeError("argv: expected a list of strings")
        return tuple(argv)
    return (*model_args(model_path), *str(doc["flags"]).split())


def read_deployment(path: str) -> Deployment:
    """A deployment document as `deployment()` wrote it; a file that is not one is bad input."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
        model = doc["model"]
        argv = _argv(doc, str(model["path"]))
        n = len(model_args(str(model["path"])))
        if list(argv[:n]) != model_args(str(model["path"])):
            raise ValueError(f"argv: expected it to start with {' '.join(model_args(str(model['path'])))}")
        flags = parse_llama_flags(list(argv[n:]))
        inventory = inventory_from_dict(doc["inventory"], "plan") if doc.get("inventory") else None
        budgets = {str(k): int(v) for k, v in (doc.get("budgets", {}).get("devices") or {}).items()}
        if doc.get("budgets", {}).get("host_bytes"):
            budgets[HOST] = int(doc["budgets"]["host_bytes"])
        return Deployment(str(model["path"]), model.get("header_sha256"), flags, inventory, budgets, argv)
    except OSError as e:
        raise BadInput(f"{path}: cannot read the plan: {e.strerror}") from None
    except (yaml.YAMLError, KeyError, TypeError, ValueError, AttributeError) as e:
        raise BadInput(f"{path}: not a fitplan plan file ({type(e).__name__}: {e})") from None
