"""The deployment document `fitplan plan -o` writes and `fitplan validate` reads back: one
module, one schema, so the writer and its reader cannot drift apart."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from planner.core.errors import BadInput
from planner.core.units import quote
from planner.hardware.budgets import Budgets
from planner.hardware.inventory import Inventory, inventory_from_dict, inventory_to_dict
from planner.llama.commands import model_args
from planner.llama.flags import LlamaFlags, flags_to_argv, parse_llama_flags
from planner.llama.placement import HOST
from planner.search.result import PlanResult, plan_commands, plan_predicted, plan_rows
from planner.system.files import read_bounded
from planner.system.llama_tools import LLAMA_CPP_PIN
from planner.system.schema import Where, load_yaml

DEPLOYMENT_VERSION = 1


def deployment(result: PlanResult) -> dict[str, Any]:
    """The YAML deployment document: everything needed to launch and to re-check the plan."""
    return {
        "fitplan_deployment": DEPLOYMENT_VERSION,
        "llama_cpp": LLAMA_CPP_PIN,
        "model": {"path": result.model_path, "header_sha256": result.header_sha256},
        "inventory": inventory_to_dict(result.inventory),
        "budgets": _budgets_doc(result.budgets),
        **plan_commands(result),
        "ctx": result.n_ctx,
        "devices": plan_rows(result),
        "predicted": plan_predicted(result),
        "compute_model": result.estimate.compute_model,
    }


def _budgets_doc(budgets: Budgets) -> dict[str, Any]:
    """The budgets as the document stores them; the pool Host and the UMA devices share only when
    there is one (documents written before it have none, and read back without one)."""
    doc: dict[str, Any] = {"devices": dict(budgets.devices), "host_bytes": budgets.host_bytes}
    if budgets.uma_pool_bytes is not None:
        doc["uma_pool_bytes"] = budgets.uma_pool_bytes
        doc["pool_devices"] = list(budgets.pool_devices)
    return doc


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
    uma_pool_bytes: int | None = None   # what Host and `pool_devices` hold together (Budgets.uma_pool_bytes)
    pool_devices: tuple[str, ...] = ()

    @property
    def limits(self) -> Budgets:
        """The budgets as planning had them, the shared pool included: judge a reading with
        `Budgets.over` / `over_verdict`, never row by row. A document without a host budget has
        a host budget of 0 here (drop the Host row from what is judged)."""
        return Budgets.from_rows(self.budgets, self.uma_pool_bytes, self.pool_devices)

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
    doc = load_yaml(read_bounded(path, what="plan"), Where(path))
    try:
        model = doc["model"]
        argv = _argv(doc, str(model["path"]))
        n = len(model_args(str(model["path"])))
        if list(argv[:n]) != model_args(str(model["path"])):
            raise ValueError(f"argv: expected it to start with {' '.join(model_args(str(model['path'])))}")
        flags = parse_llama_flags(list(argv[n:]))
        inventory = inventory_from_dict(doc["inventory"], "plan") if doc.get("inventory") else None
        written = doc.get("budgets") or {}
        budgets = {str(k): int(v) for k, v in (written.get("devices") or {}).items()}
        if written.get("host_bytes"):
            budgets[HOST] = int(written["host_bytes"])
        pool = None if written.get("uma_pool_bytes") is None else int(written["uma_pool_bytes"])
        members = tuple(str(name) for name in written.get("pool_devices") or ())
        return Deployment(str(model["path"]), model.get("header_sha256"), flags, inventory, budgets, argv,
                          pool, members)
    except (yaml.YAMLError, KeyError, TypeError, ValueError, AttributeError) as e:
        raise BadInput(f"{path}: not a fitplan plan file ({type(e).__name__}: {quote(str(e))})") from None
