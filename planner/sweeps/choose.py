"""`fitplan choose`: which file to download — every candidate model planned for one inventory, side by side.

In: MODEL arguments (repositories, Ollama names, files: planner.registry.candidates expands them), an
inventory with its budgets, and one PlanRequest (the user's constraints). Each candidate's header is
read once (by HTTP Range through the header cache, for a remote file) and planned by the planner
itself (`planning.search.plan`, the plan `fitplan plan` makes of that file alone): once under the
request, and, unless the request already asks for `--ctx max`, once more for the largest context
that fits (with the first plan's -ub, op offload and cache type where there is one: one variant
searched, not all, which halves the command's time). Out: a `Choice` — one row per candidate (quant,
size, bits per weight, where it runs, contexts, predicted tokens/s) and the recommendation:

- highest precision: among the candidates that plan under the request, the most bits per weight
  (ties: the faster decode). Quality is stated as bits per weight and the quantization's name, no more;
- fastest: the highest predicted decode tokens/s (ties: more bits per weight).

The highest-precision candidate's plan is the plan printed after the table (commands, YAML).
Bits per weight = 8 x the tensor bytes / the parameters, both summed over the header's tensor index.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gguf import LlamaFileType

from planner.core.errors import BadInput, InfeasiblePlacement, RemoteError
from planner.core.render import table
from planner.core.units import fmt_bytes
from planner.hardware.budgets import Budgets
from planner.hardware.inventory import Inventory
from planner.llama.context import ModelContext, model_context
from planner.llama.placement import CPU
from planner.registry.candidates import MAX_CANDIDATES, Candidate, Expansion, Projector, expand
from planner.registry.ollama import loadability_warnings
from planner.search.contexts import max_context
from planner.search.result import PlanRequest, PlanResult, llama_argv, plan_dict, plan_table
from planner.search.search import plan

log = logging.getLogger(__name__)

# where a plan puts the model's layers
ON_DEVICES = "devices"
SPLIT = "devices + host"
ON_HOST = "host"

# why a row has no plan
DOES_NOT_FIT = "does not fit"
CANNOT_PLAN = "cannot plan"

# the request's companions.mmproj value that pairs each candidate with its repository's projector
MMPROJ_AUTO = "auto"


@dataclass(frozen=True)
class Row:
    """One candidate: its header's facts and its plans (None where nothing fits)."""

    candidate: Candidate
    file_type: str               # the header's general.file_type by llama.cpp's name ("Q4_K_M"), or ""
    size_bytes: int              # the first shard's header and every shard's tensor data, from the header
    header_bytes: int
    n_params: int
    plan: PlanResult | None      # under the request
    largest_ctx: int | None      # the largest context that plans (None: none does)
    problem: str = ""            # why it does not plan under the request

    @property
    def bits_per_weight(self) -> float:
        return 8 * (self.size_bytes - self.header_bytes) / self.n_params if self.n_params else 0.0

    @property
    def runs_on(self) -> str:
        return runs_on(self.plan) if self.plan is not None else ""

    @property
    def verdict(self) -> str:
        """Where it runs, or why it does not: "does not fit" or "cannot plan"."""
        if self.plan is not None:
            return self.runs_on
        return CANNOT_PLAN if self.problem.startswith(CANNOT_PLAN) else DOES_NOT_FIT

    def to_dict(self) -> dict[str, Any]:
        p = self.plan
        return {"model": self.candidate.model, "label": self.candidate.label, "location": self.candidate.location,
                "files": list(self.candidate.files), "mmproj": self.candidate.mmproj, "file_type": self.file_type,
                "size_bytes": self.size_bytes, "n_params": self.n_params,
                "bits_per_weight": round(self.bits_per_weight, 3), "fits": p is not None,
                "runs_on": self.runs_on or None, "ctx": p.n_ctx if p else None, "largest_ctx": self.largest_ctx,
                "decode_tokens_s": round(p.prediction.decode_tokens_s, 2) if p else None,
                "prefill_tokens_s": round(p.prediction.prefill_tokens_s, 2) if p else None,
                "flags": " ".join(llama_argv(p)) if p else None, "problem": self.problem or None}


def runs_on(result: PlanResult) -> str:
    """All layers (output included) and experts on devices, all on the host, or some of each."""
    est = result.estimate
    on_host = dict(est.layers).get(CPU, ())    # layer n_layer_all is the output layer
    on_devices = [i for dev, ls in est.layers if dev != CPU for i in ls]
    if not on_devices:
        return ON_HOST
    return ON_DEVICES if not on_host and not result.experts_on_host else SPLIT


@dataclass(frozen=True)
class Choice:
    rows: tuple[Row, ...]
    projectors: tuple[Projector, ...]
    sources: tuple[str, ...]     # where each MODEL's candidates were listed
    request: PlanRequest
    best: int | None             # the highest-precision row that plans (index into rows)
    fastest: int | None

    @property
    def recommended(self) -> PlanResult | None:
        return self.rows[self.best].plan if self.best is not None else None

    def to_dict(self) -> dict[str, Any]:
        def pick(i: int | None) -> dict[str, Any] | None:
            return None if i is None else {"label": self.rows[i].candidate.label,
                                           "location": self.rows[i].candidate.location}

        rec = self.recommended
        return {"sources": list(self.sources), "candidates": [r.to_dict() for r in self.rows],
                "projectors": [{"model": p.model, "path": p.path, "location": p.location} for p in self.projectors],
                "recommended": {"highest_precision": pick(self.best), "fastest": pick(self.fastest)},
                "plan": plan_dict(rec) if rec is not None else None}

    def to_table(self) -> str:
        return choice_table(self)


def _file_type(ctx: ModelContext) -> str:
    ftype = ctx.model.file_type
    if ftype is None:
        return ""
    try:
        return LlamaFileType(ftype).name.removeprefix("MOSTLY_")
    except ValueError:
        return str(ftype)


def _plan_or_none(ctx: ModelContext, inventory: Inventory, budgets: Budgets,
                  request: PlanRequest) -> tuple[PlanResult | None, str]:
    """The plan, or None and why not: it does not fit, or this file cannot be planned (a network
    failure is not the file's: it stops the command)."""
    try:
        return plan(ctx, inventory, request, budgets=budgets, warn=False), ""
    except InfeasiblePlacement as e:
        return None, str(e)
    except RemoteError:
        raise
    except BadInput as e:
        return None, f"{CANNOT_PLAN}: {e}"


def _with_mmproj(request: PlanRequest, candidate: Candidate) -> PlanRequest:
    if request.companions.mmproj != MMPROJ_AUTO:
        return request
    return replace(request, companions=replace(request.companions, mmproj=candidate.mmproj))


def _widest_request(request: PlanRequest, planned: PlanResult | None) -> PlanRequest:
    """The request at `--ctx max`; where the request planned, with that plan's -ub, op offload and
    cache type (the largest context of the plan shown, and a search over one variant, not all)."""
    widest = replace(request, n_ctx=None, max_ctx=True)
    if planned is None:
        return widest
    f = planned.flags
    return replace(widest, n_ubatch=f.n_ubatch, op_offload=f.op_offload, cache_types=(f.cache_type_k,))


def plan_candidate(candidate: Candidate, inventory: Inventory, budgets: Budgets, request: PlanRequest) -> Row:
    """One candidate read and planned (module docstring); a file that is not a model llama.cpp
    loads (a refused header) is a row that says why, not the end of the comparison."""
    try:
        ctx = model_context(candidate.location)
    except RemoteError:
        raise
    except BadInput as e:
        return Row(candidate, "", 0, 0, 0, None, None, f"{CANNOT_PLAN}: {e}")
    for warning in loadability_warnings(ctx.model):   # an Ollama blob made for Ollama's own engine
        log.warning("%s: %s", candidate.location, warning)
    request = _with_mmproj(request, candidate)
    result, problem = _plan_or_none(ctx, inventory, budgets, request)
    widest_request = _widest_request(request, result)
    if request.max_ctx or (result is not None and result.n_ctx >= max_context(ctx, widest_request)):
        largest = result.n_ctx if result is not None else None     # already as wide as a plan may be
    else:
        widest, _ = _plan_or_none(ctx, inventory, budgets, widest_request)
        largest = widest.n_ctx if widest is not None else None
    m = ctx.model
    return Row(candidate, _file_type(ctx), m.header_bytes + m.total_tensor_bytes, m.header_bytes, m.n_params,
               result, largest, problem)


def _pick(rows: Sequence[Row], key: Callable[[Row], tuple[float, float]]) -> int | None:
    fitting = [i for i, r in enumerate(rows) if r.plan is not None]
    return max(fitting, key=lambda i: key(rows[i]), default=None)


def _decode(r: Row) -> float:
    return r.plan.prediction.decode_tokens_s if r.plan is not None else 0.0


def recommend(rows: Sequence[Row]) -> tuple[int | None, int | None]:
    """(highest precision, fastest): indices of rows that plan, None when none does."""
    return (_pick(rows, lambda r: (round(r.bits_per_weight, 3), _decode(r))),
            _pick(rows, lambda r: (_decode(r), round(r.bits_per_weight, 3))))


def choose(models: Sequence[str], inventory: Inventory, budgets: Budgets, request: PlanRequest,
           include: Sequence[str] = (), cap: int = MAX_CANDIDATES) -> Choice:
    """Every candidate of `models` planned under `request` (module docstring). Every listing is made
    before any header is read, so a refused listing (no GGUF, over the cap) costs no header."""
    expansions: list[Expansion] = [expand(m, include, cap) for m in models]
    total = sum(len(e.candidates) for e in expansions)
    if total > cap:
        each = ", ".join(f"{e.source}: {len(e.candidates)}" for e in expansions)
        raise BadInput(f"{total} models to compare ({each}), more than the {cap} `choose` reads at once; "
                       f"narrow with --include, or raise --max-files")
    rows = tuple(plan_candidate(c, inventory, budgets, request) for e in expansions for c in e.candidates)
    best, fastest = recommend(rows)
    return Choice(rows, tuple(p for e in expansions for p in e.projectors), tuple(e.source for e in expansions),
                  request, best, fastest)


def _speed(x: float | None, digits: int) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _row_cells(choice: Choice, i: int, several: bool) -> list[str]:
    r = choice.rows[i]
    p = r.plan
    mark = "highest precision" if i == choice.best else ""
    if i == choice.fastest:
        mark = f"{mark}, fastest" if mark else "fastest"
    cells = [r.candidate.label, r.file_type or "-", fmt_bytes(r.size_bytes) if r.n_params else "-",
             f"{r.bits_per_weight:.2f}" if r.n_params else "-",
             r.verdict, str(p.n_ctx) if p else "-",
             str(r.largest_ctx) if r.largest_ctx else "-",
             _speed(p.prediction.decode_tokens_s if p else None, 1),
             _speed(p.prediction.prefill_tokens_s if p else None, 0), mark]
    return ([r.candidate.model] if several else []) + cells


def choice_table_rows(choice: Choice) -> tuple[list[str], list[list[str]]]:
    """The table's headers and cells (a model column when several MODEL arguments were given)."""
    several = len(choice.sources) > 1
    head = (["model"] if several else []) + ["file", "type", "size", "bits/weight", "runs on", "ctx", "largest ctx",
                                            "decode t/s", "prefill t/s", ""]
    return head, [_row_cells(choice, i, several) for i in range(len(choice.rows))]


def choice_table(choice: Choice) -> str:
    head, rows = choice_table_rows(choice)
    align = ("l" if len(choice.sources) > 1 else "") + "llrrlrrrrl"
    lines = [f"candidates from {', '.join(choice.sources)}: quality is stated as the quantization and its bits "
             "per weight", "", table(head, rows, align=align)]
    if choice.projectors:
        lines += ["", "projectors (--mmproj auto plans each model with the one llama.cpp pairs):"]
        lines += [f"  {p.path}" for p in choice.projectors]
    lines.append("")
    if choice.best is None:
        lines.append("no candidate plans under these budgets and constraints")
        return "\n".join(lines) + "\n"
    best, fastest = choice.rows[choice.best], choice.rows[choice.fastest if choice.fastest is not None else 0]
    lines.append(f"highest precision that fits: {best.candidate.label} ({best.bits_per_weight:.2f} bits/weight, "
                 f"{best.runs_on}, decode {_decode(best):.1f} t/s)")
    lines.append(f"fastest: {fastest.candidate.label} ({fastest.bits_per_weight:.2f} bits/weight, "
                 f"decode {_decode(fastest):.1f} t/s)")
    lines += ["", f"the plan for {best.candidate.label}:", ""]
    assert best.plan is not None
    return "\n".join(lines) + "\n" + plan_table(best.plan)
