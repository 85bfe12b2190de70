"""`plan` for the command line: the request from the options as the command line spells them (each
normalised here, once; `choose` takes the same), one call on the devices a command resolved, and the
documents and pages made of the result. `plan --verdict` and `choose` are planner.api.advice's,
`plan-set` planner.api.sets': a plan loads neither.
"""
from __future__ import annotations

from dataclasses import replace

from planner.api.machine import DevicesReport
from planner.core.choices import Objective, OpOffload, Solver, SplitMode
from planner.core.errors import BadInput, InfeasiblePlacement
from planner.core.units import quote
from planner.emit.document import deployment, deployment_yaml, read_deployment
from planner.llama.commands import LLAMA_SERVER
from planner.model.costs import CACHE_TYPES
from planner.search.result import Companions, PlanRequest, PlanResult, llama_argv, plan_argv, server_command
from planner.search.search import plan as run_plan

__all__ = [
    "LLAMA_SERVER", "OP_OFFLOAD", "Companions", "PlanRequest", "PlanResult", "choose_request", "deployment",
    "deployment_yaml", "infeasible_page", "llama_argv", "parse_cache_type", "parse_cache_types", "parse_ctx",
    "plan_argv", "plan_on", "plan_page", "plan_request", "read_deployment", "report_page", "server_command",
]


# --op-offload: the planner chooses, or llama.cpp's --op-offload / --no-op-offload
OP_OFFLOAD: dict[OpOffload, bool | None] = {OpOffload.AUTO: None, OpOffload.ON: True, OpOffload.OFF: False}


def parse_ctx(text: str | None) -> tuple[int | None, bool]:
    """--ctx: a positive number of tokens, or 'max' (the largest that fits); None: the training context."""
    if text is None:
        return None, False
    if text.lower() == "max":
        return None, True
    try:
        value = int(text)
    except ValueError:
        raise BadInput(f"--ctx {text!r}: expected a number of tokens or 'max'") from None
    if value <= 0:
        raise BadInput(f"--ctx {text!r}: expected a positive number of tokens or 'max'")
    return value, False


def parse_cache_type(text: str, flag: str = "--draft-cache-type") -> str:
    """One KV cache type as llama.cpp's -ctk takes it."""
    if text.strip().lower() not in CACHE_TYPES:
        raise BadInput(f"{flag} {quote(text)}: expected one of {', '.join(CACHE_TYPES)}")
    return text.strip().lower()


def parse_cache_types(text: str) -> tuple[str, ...]:
    """--cache-type f16,q8_0: each one a type llama.cpp's -ctk takes, at least one, none empty."""
    items = text.split(",")
    if not text.strip() or any(not item.strip() for item in items):
        raise BadInput(f"--cache-type {quote(text)}: expected KV cache types separated by commas, e.g. f16,q8_0")
    return tuple(parse_cache_type(item, "--cache-type") for item in items)


def plan_request(ctx: str | None = None, *, n_parallel: int = 1, objective: Objective | str = Objective.THROUGHPUT,
                 cache_type: str = "f16", n_ubatch: int | None = None, flash_attn: str = "auto",
                 allow_expert_offload: bool = True, solver: Solver | str = Solver.DP,
                 op_offload: OpOffload | str = OpOffload.AUTO, allow_ctx_above_train: bool = False,
                 split_mode: SplitMode | str = SplitMode.AUTO,
                 companions: Companions | None = None) -> PlanRequest:
    """The constraints of `plan` and `choose` from their options: --ctx as text ('max' or tokens),
    --cache-type as a comma list; the choices as members or their values (planner.core.choices)."""
    offload, split = OpOffload(op_offload), SplitMode(split_mode)
    if n_parallel < 1 or (n_ubatch is not None and n_ubatch < 1):
        raise BadInput("--parallel and --ubatch-size take positive numbers")
    n_ctx, max_ctx = parse_ctx(ctx)
    return PlanRequest(n_ctx=n_ctx, max_ctx=max_ctx, n_parallel=n_parallel, objective=Objective(objective),
                       cache_types=parse_cache_types(cache_type), n_ubatch=n_ubatch, flash_attn=flash_attn,
                       allow_expert_offload=allow_expert_offload, solver=Solver(solver),
                       op_offload=OP_OFFLOAD[offload],
                       allow_ctx_above_train=allow_ctx_above_train, split_mode=split.value,
                       companions=companions or Companions())


def choose_request(ctx: str | None, clients: int, objective: Objective | str, cache_type: str,
                   op_offload: OpOffload | str, split_mode: SplitMode | str, mmproj: str | None,
                   allow_ctx_above_train: bool) -> PlanRequest:
    """`choose`'s constraints as `plan` takes them; `clients` streams give as many slots of --ctx tokens each."""
    if clients < 1:
        raise BadInput("--clients takes a positive number")
    request = plan_request(ctx, n_parallel=clients, objective=objective, cache_type=cache_type, op_offload=op_offload,
                           split_mode=split_mode, allow_ctx_above_train=allow_ctx_above_train,
                           companions=Companions(mmproj=mmproj))
    return replace(request, n_ctx=request.n_ctx * clients if request.n_ctx else None)


def plan_on(model: str, found: DevicesReport, request: PlanRequest, with_explain: bool = False) -> PlanResult:
    """The best placement on the devices and budgets a command resolved, with what would fit when nothing does."""
    return run_plan(model, found.inventory, request, budgets=found.budgets, with_explain=with_explain,
                    what_would_fit=True)





def plan_page(result: PlanResult) -> str:
    """A plan as one self-contained HTML page."""
    from planner.emit.plan_report import plan_report
    from planner.emit.plan_report_html import render_html

    return render_html(plan_report(result))


def infeasible_page(model: str, found: DevicesReport, e: InfeasiblePlacement) -> str:
    """The page for a model that fits nowhere: each device's shortfall and what would fit."""
    from planner.emit.plan_report import infeasible_report
    from planner.emit.plan_report_html import render_html

    return render_html(infeasible_report(model, found.budgets, e))


def report_page(plan_file: str) -> str:
    """`fitplan report`: a plan file as one self-contained HTML page."""
    from planner.emit.plan_report import plan_report, result_from_deployment
    from planner.emit.plan_report_html import render_html

    return render_html(plan_report(result_from_deployment(read_deployment(plan_file))))
