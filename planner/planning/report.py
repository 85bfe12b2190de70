"""How a plan is shown: llama.cpp and llama-bench flags, a per-device table, JSON, and the
YAML deployment file that `fitplan validate` and a server launcher consume."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import yaml

from planner.hardware.inventory import inventory_to_dict
from planner.llama.flags import flags_to_argv
from planner.llama.placement import CPU_REPACK, HOST
from planner.core.render import layer_ranges, table
from planner.core.units import fmt_mib

if TYPE_CHECKING:
    from planner.planning.search import PlanResult

LLAMA_CPP_PIN = "llama-cpp-python==0.3.36 (llama.cpp 0c1e570)"
DEPLOYMENT_VERSION = 1


def llama_argv(result: PlanResult) -> list[str]:
    """The llama.cpp flags of a plan, with the split mode and `-fit off` spelled out."""
    argv = flags_to_argv(result.flags)
    if "-c" not in argv:
        argv[:0] = ["-c", str(result.flags.n_ctx)]
    if "-sm" not in argv and result.estimate.n_layer_all and len(result.inventory.devices) > 1:
        argv += ["-sm", "layer"]
    return argv


def llama_bench_argv(result: PlanResult) -> list[str]:
    """The same placement in llama-bench's syntax: `/` separates a list, `,` would sweep (seed 003 §8)."""
    f = result.flags
    out = ["-m", result.model_path, "-ngl", str(f.n_gpu_layers if f.n_gpu_layers >= 0 else 999), "-sm", f.split_mode]
    if f.rpc:
        out += ["--rpc", ",".join(f.rpc)]
    if f.devices:
        out += ["-dev", "/".join(f.devices)]
    if f.tensor_split:
        out += ["-ts", "/".join(str(int(x)) if float(x).is_integer() else str(x) for x in f.tensor_split)]
    for arg in f.override_args:
        if arg.kind == "ot":
            out += ["-ot", arg.value]
        elif arg.kind == "ncmoe":
            out += ["-ncmoe", arg.value]
    if f.cache_type_k != "f16" or f.cache_type_v != "f16":
        out += ["-ctk", f.cache_type_k, "-ctv", f.cache_type_v]
    if f.n_ubatch != 512:
        out += ["-ub", str(f.n_ubatch)]
    if f.flash_attn != "auto":
        out += ["-fa", "1" if f.flash_attn == "on" else "0"]
    return out + ["-d", str(result.n_ctx)]


def _rows(result: PlanResult) -> list[dict[str, Any]]:
    est = result.estimate
    layers = dict(est.layers)
    rows = []
    for d in est.devices:
        budget = result.budget_of(d.name)
        on = layers.get("CPU" if d.name == HOST else d.name, ())
        rows.append({"name": d.name, "model_bytes": d.model_bytes, "context_bytes": d.context_bytes,
                     "compute_bytes": d.compute_bytes, "total_bytes": d.total_bytes,
                     "budget_bytes": budget if d.name != CPU_REPACK else None,
                     "layers": [i for i in on if i < est.n_layer_all],
                     "output_layer": est.n_layer_all in on})
    return rows


def _predicted(result: PlanResult) -> dict[str, Any]:
    p = result.prediction
    return {"decode_tokens_s": round(p.decode_tokens_s, 2), "prefill_tokens_s": round(p.prefill_tokens_s, 2),
            "assumed_rates": p.assumed_rates, "boundaries_per_token": p.n_boundaries}


def plan_dict(result: PlanResult) -> dict[str, Any]:
    return {
        "model": result.model_path,
        "header_sha256": result.header_sha256,
        "flags": " ".join(llama_argv(result)),
        "llama_bench_flags": " ".join(llama_bench_argv(result)),
        "ctx": result.n_ctx,
        "n_parallel": result.flags.n_parallel,
        "cache_type": result.flags.cache_type_k,
        "objective": result.request.objective.value,
        "devices": _rows(result),
        "experts_on_host": sorted(result.experts_on_host),
        "predicted": _predicted(result),
        "explain": list(result.explain),
    }


def plan_table(result: PlanResult) -> str:
    rows = []
    for r in _rows(result):
        budget = r["budget_bytes"]
        rows.append([r["name"], fmt_mib(r["model_bytes"]), fmt_mib(r["context_bytes"]), fmt_mib(r["compute_bytes"]),
                     fmt_mib(r["total_bytes"]), "-" if budget is None else fmt_mib(budget),
                     "-" if budget is None else fmt_mib(budget - r["total_bytes"]) if budget >= r["total_bytes"]
                     else "-" + fmt_mib(r["total_bytes"] - budget), layer_ranges(r["layers"], output=r["output_layer"]) or "-"])
    p = result.prediction
    lines = [
        f"{result.model_path}: context {result.n_ctx}, {result.flags.n_parallel} slot(s), "
        f"KV {result.flags.cache_type_k}, objective {result.request.objective.value}",
        "",
        table(["device", "model MiB", "context MiB", "compute MiB", "total MiB", "budget MiB", "headroom MiB",
               "layers"], rows, align="lrrrrrrl"),
        "",
        f"predicted: decode {p.decode_tokens_s:.1f} tokens/s, prefill {p.prefill_tokens_s:.0f} tokens/s"
        + (" (some device rates unknown: assumed figures used)" if p.assumed_rates else ""),
        "",
        "llama.cpp:   " + " ".join(llama_argv(result)),
        "llama-bench: " + " ".join(llama_bench_argv(result)),
    ]
    if result.explain:
        lines += ["", "why:"] + [f"  {line}" for line in result.explain]
    return "\n".join(lines) + "\n"


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
        "devices": _rows(result),
        "predicted": _predicted(result),
    }


def deployment_yaml(result: PlanResult, doc: dict[str, Any] | None = None) -> str:
    """The deployment document as YAML (`doc`: one deployment(result) already built)."""
    return yaml.safe_dump(doc if doc is not None else deployment(result), sort_keys=False)
